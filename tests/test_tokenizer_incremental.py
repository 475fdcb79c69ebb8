"""Incremental encoding through the Python API: for random texts split at random
points, appending chunk by chunk gives exactly the ids of a full encode, on every
vocabulary, and `push` reports where the ids changed."""

from __future__ import annotations

import functools

from hotloop import IncrementalText, Tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import corpus, references
from tests.references import OPENAI


@functools.cache
def _tokenizers() -> tuple[Tokenizer, ...]:
    return (*(Tokenizer.openai(n) for n in OPENAI), Tokenizer.from_gguf(references.smollm2_gguf()))


# Texts rich in the characters pre-tokenizers split on: spaces, newlines, digits,
# apostrophes, punctuation, non-Latin letters, emoji.
_alphabet = st.sampled_from(
    list(" \t\n\r'.,:;!?-_/(){}<>\"0123456789aAbBsStTlLdDmMxyzéßДж東京한🙂👍🏽\u0301")
)
_texts = st.lists(st.one_of(_alphabet, st.text(max_size=6)), max_size=60).map("".join)


def _check(tok: Tokenizer, text: str, cuts: list[int]) -> IncrementalText:
    points = sorted({c % (len(text) + 1) for c in cuts} | {len(text)})
    run = IncrementalText(tok)
    at = 0
    for point in points:
        if point <= at:
            continue
        before = run.ids()
        start = run.push(text[at:point])
        at = point
        assert run.ids() == tok.encode(text[:at]), (tok.name, text[:at])
        assert run.ids()[:start] == before[:start]
        assert run.ids_from(start) == run.ids()[start:]
    assert run.text == text
    assert len(run) == len(tok.encode(text))
    return run


@settings(max_examples=300, deadline=None)
@given(text=_texts, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_incremental_equals_full(text: str, cuts: list[int]) -> None:
    for tok in _tokenizers():
        _check(tok, text, cuts)


def test_streaming_corpus_documents_never_falls_back_on_prose() -> None:
    """Real documents appended in 97-byte chunks: exact, and locally checked."""
    for label, text in corpus.documents()[:40:4]:
        for tok in _tokenizers():
            run = _check(tok, text[:20_000], list(range(0, 20_000, 97)))
            assert run.fallbacks <= len(text) // 970, label


def test_initial_text_and_empty_chunks() -> None:
    tok = Tokenizer.openai("o200k_base")
    run = IncrementalText(tok, "hello")
    assert run.ids() == tok.encode("hello")
    assert run.push("") == len(run)
    assert run.push(" world") <= 1
    assert run.ids() == tok.encode("hello world")
