"""Exactness counts for docs/tokenizers-and-formats.md: every open-model family against its own
reference on the whole corpus (the tests take a stride of it, to keep CI short).

`.venv/bin/python -m tests.tokenizer_exactness` prints, per family and reference, how
many corpus documents give identical ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import llama_cpp
from hotloop import Tokenizer
from mistral_common.tokens.tokenizers.sentencepiece import SentencePieceTokenizer
from mistral_common.tokens.tokenizers.tekken import Tekkenizer

from tests import corpus, references


def _count(
    name: str,
    ours: Callable[[str], list[int]],
    theirs: Callable[[str], list[int]],
    docs: Sequence[tuple[str, str]],
) -> None:
    same = sum(ours(text) == theirs(text) for _, text in docs)
    size = corpus.total_bytes(docs) / 1e6
    print(f"{name}: {same}/{len(docs)} documents identical ({size:.1f} MB)", flush=True)


def main() -> None:
    docs = corpus.documents()
    ordinary = [(label, t) for label, t in docs if not label.startswith("pathological:")]
    for name in references.HF_FAMILIES:
        hf = references.hf_family(name)
        _count(
            f"{name} tokenizer.json vs Hugging Face tokenizers",
            references.family(name).encode,
            lambda t, hf=hf: hf.encode(t, add_special_tokens=False).ids,
            docs,
        )
    for path in references.tekken_files():
        ref = Tekkenizer.from_file(str(path))
        _count(
            f"{path.name} vs mistral-common",
            Tokenizer.from_tekken(path.read_text()).encode,
            lambda t, ref=ref: ref.encode(t, False, False),
            docs,
        )
    for path in references.sentencepiece_models():
        spm = SentencePieceTokenizer(str(path))
        _count(
            f"{path.name} vs mistral-common",
            Tokenizer.from_sentencepiece_model(path.read_bytes()).encode,
            lambda t, spm=spm: spm.encode(t, False, False),
            docs,
        )
    names = ("llama-bpe", "qwen2", "qwen35", "phi-3", "llama-spm")
    ggufs = {name: str(references.llama_cpp_vocab(name)) for name in names}
    ggufs["gemma3 270m"] = references.gemma3_gguf()
    # llama.cpp's SentencePiece merge is quadratic on one long word: no pathological inputs.
    for name, path in ggufs.items():
        llama = llama_cpp.Llama(path, vocab_only=True, verbose=False)
        _count(
            f"{name} GGUF vs llama.cpp",
            Tokenizer.from_gguf(path).encode,
            lambda t, llama=llama: llama.tokenize(t.encode(), add_bos=False, special=False),
            ordinary,
        )


if __name__ == "__main__":
    main()
