"""Exactness of hotloop's tokenizers against the reference implementations
(tests/references.py): the OpenAI encodings against tiktoken, SmolLM2's byte-level BPE
against llama.cpp's tokenizer for the same GGUF, on the corpus of tests/corpus.py.
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import pytest
import tiktoken
import tokenizers
from hotloop import StreamDecoder, Tokenizer
from hotloop._core import CoreError
from hotloop.lab.open_model import gguf_metadata, tokenizer_json
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import corpus, references
from tests.references import OPENAI


@pytest.fixture(scope="module")
def reference() -> dict[str, tiktoken.Encoding]:
    return {name: references.tiktoken_encoding(name) for name in OPENAI}


@pytest.fixture(scope="module")
def smollm2_path() -> str:
    return references.smollm2_gguf()


@pytest.fixture(scope="module")
def smollm2(smollm2_path: str) -> Tokenizer:
    return Tokenizer.from_gguf(smollm2_path)


@pytest.fixture(scope="module")
def llama(smollm2_path: str) -> llama_cpp.Llama:
    return llama_cpp.Llama(smollm2_path, vocab_only=True, verbose=False)


def _first_difference(ours: list[int], theirs: list[int]) -> int:
    return next(
        (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
        min(len(ours), len(theirs)),
    )


def _assert_same(label: str, text: str, ours: list[int], theirs: list[int], tok: Tokenizer) -> None:
    if ours == theirs:
        return
    i = _first_difference(ours, theirs)
    context = tok.decode_bytes(ours[max(0, i - 3) : i + 3])
    raise AssertionError(
        f"{tok.name} differs on {label} at token {i}: ours {ours[i : i + 5]}, "
        f"reference {theirs[i : i + 5]}, near {context!r}"
    )


def test_corpus_is_large_and_varied() -> None:
    docs = corpus.documents()
    assert corpus.total_bytes(docs) > 3_000_000
    text = "".join(t for _, t in docs)
    for sample in ("def ", "{", "東", "한", "Д", "🙂", "\r\n"):
        assert sample in text


@pytest.mark.parametrize("name", OPENAI)
def test_openai_matches_tiktoken_on_corpus(
    name: str, reference: dict[str, tiktoken.Encoding]
) -> None:
    ours, theirs = Tokenizer.openai(name), reference[name]
    for label, text in corpus.documents():
        _assert_same(label, text, ours.encode(text), theirs.encode_ordinary(text), ours)


@pytest.mark.parametrize("name", OPENAI)
def test_openai_special_tokens_match_tiktoken(
    name: str, reference: dict[str, tiktoken.Encoding]
) -> None:
    ours, theirs = Tokenizer.openai(name), reference[name]
    assert theirs._special_tokens, name
    for literal, id_ in theirs._special_tokens.items():
        assert ours.special(literal) == id_, literal
    assert ours.vocab_size == theirs.n_vocab


def test_harmony_names() -> None:
    tok = Tokenizer.openai("o200k_harmony")
    ids = {
        name: tok.special(name) for name in ("<|start|>", "<|channel|>", "<|message|>", "<|end|>")
    }
    assert ids == {
        "<|start|>": 200006,
        "<|channel|>": 200005,
        "<|message|>": 200008,
        "<|end|>": 200007,
    }
    assert tok.special("<|return|>") == 200002
    assert tok.special("<|call|>") == 200012
    assert tok.special("<|constrain|>") == 200003
    assert tok.decode([200006, 200007]) == "<|start|><|end|>"


@pytest.mark.parametrize("name", OPENAI)
def test_special_text_is_plain(name: str) -> None:
    tok = Tokenizer.openai(name)
    for literal in ("<|endoftext|>", "<|start|>", "<|im_start|>", "<|end|>"):
        ids = tok.encode(literal)
        assert len(ids) > 1
        assert tok.decode(ids) == literal


def test_smollm2_matches_llama_cpp_on_corpus(smollm2_path: str, llama: llama_cpp.Llama) -> None:
    ours = Tokenizer.from_gguf(smollm2_path)
    for label, text in corpus.documents():
        theirs = llama.tokenize(text.encode(), add_bos=False, special=False)
        _assert_same(label, text, ours.encode(text), theirs, ours)


@settings(max_examples=500, deadline=None)
@given(text=st.text(alphabet=st.characters(codec="utf-8"), max_size=40))
def test_random_unicode_matches_references(
    text: str, smollm2: Tokenizer, llama: llama_cpp.Llama, reference: dict[str, tiktoken.Encoding]
) -> None:
    """Any code point, any category: the character tables agree with the references."""
    assert smollm2.encode(text) == llama.tokenize(text.encode(), add_bos=False, special=False)
    for name in ("o200k_base", "cl100k_base"):
        assert Tokenizer.openai(name).encode(text) == reference[name].encode_ordinary(text)


def test_smollm2_vocabulary(smollm2_path: str, llama: llama_cpp.Llama) -> None:
    tok = Tokenizer.from_gguf(smollm2_path)
    assert tok.vocab_size == llama.n_vocab() == 49152
    assert tok.special("<|im_start|>") == 1
    assert tok.special("<|im_end|>") == 2
    assert tok.special("<|endoftext|>") == 0
    for literal in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert tok.encode(literal) == llama.tokenize(literal.encode(), add_bos=False, special=False)
        assert len(tok.encode(literal)) > 1
    # Control tokens decode to their literal text here; llama.cpp renders them empty.
    assert tok.decode_bytes([1, 2]) == b"<|im_start|><|im_end|>"
    # llama-cpp-python detokenizes into a 32-byte buffer: longer pieces come back empty.
    for id_ in range(17, tok.vocab_size, 97):
        ours = tok.decode_bytes([id_])
        assert ours == llama.detokenize([id_]) or len(ours) > 32, id_


def test_tokenizer_json_equals_gguf(smollm2_path: str) -> None:
    """A tokenizer.json written from the GGUF vocabulary (the open-model peer's) tokenizes
    identically, here and in Hugging Face `tokenizers`."""
    gguf = Tokenizer.from_gguf(smollm2_path)
    doc = tokenizer_json(gguf_metadata(smollm2_path))
    from_json = Tokenizer.from_tokenizer_json(doc)
    assert Tokenizer.from_tokenizer_json(doc.encode()).vocab_size == gguf.vocab_size
    hf = tokenizers.Tokenizer.from_str(doc)
    assert hf.get_vocab_size() == gguf.vocab_size
    # `encode` reads special-token literals as plain text; `tokenizers` does when told to.
    hf.encode_special_tokens = True
    for label, text in corpus.documents()[::7]:
        assert from_json.encode(text) == gguf.encode(text), label
        assert hf.encode(text, add_special_tokens=False).ids == gguf.encode(text), label


@pytest.mark.parametrize("name", OPENAI)
def test_stream_decoder_is_exact(name: str) -> None:
    tok = Tokenizer.openai(name)
    for label, text in corpus.documents()[::11]:
        ids = tok.encode(text)
        for step in (1, 3):
            decoder = StreamDecoder(tok)
            deltas = [decoder.feed(ids[i : i + step]) for i in range(0, len(ids), step)]
            deltas.append(decoder.finish())
            assert "".join(deltas) == text, label


def test_stream_decoder_holds_back_split_characters(smollm2_path: str) -> None:
    tok = Tokenizer.from_gguf(smollm2_path)
    ids = tok.encode("🙂")
    assert len(ids) > 1, "a byte-level vocabulary splits this emoji"
    decoder = tok.stream_decoder()
    assert [decoder.feed([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert decoder.feed(ids[-1:]) == "🙂"
    decoder.feed(ids[:1])
    assert decoder.finish() == "\ufffd"


def test_decode_replaces_invalid_utf8() -> None:
    tok = Tokenizer.openai("cl100k_base")
    ids = tok.encode("🙂")
    assert tok.decode(ids[:1]) == "\ufffd"
    assert tok.decode_bytes(ids[:1]) == "🙂".encode()[: len(tok.decode_bytes(ids[:1]))]


def test_errors_have_codes(tmp_path: Path) -> None:
    with pytest.raises(CoreError) as unknown:
        Tokenizer.openai("p50k_base")
    assert unknown.value.code == "unknown_tokenizer"
    with pytest.raises(CoreError) as bad_id:
        Tokenizer.openai("cl100k_base").decode([1, 10**9])
    assert bad_id.value.code == "invalid_value"
    assert bad_id.value.param == "ids[1]"
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"GGML" + bytes(64))
    with pytest.raises(CoreError) as bad_file:
        Tokenizer.from_gguf(not_gguf)
    assert bad_file.value.code == "invalid_vocabulary"
    with pytest.raises(CoreError) as bad_json:
        Tokenizer.from_tokenizer_json("{}")
    assert bad_json.value.code == "invalid_vocabulary"
