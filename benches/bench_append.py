"""The rendered-token cache: appending one 2 KB item against history length, and the
full re-render + re-encode a stateless server does instead.

For histories of 1k, 10k, 100k and 1M tokens (harmony, agent turns of user text, a call,
a ~1.5 KB tool output and an answer), one run measures:

- append: fork the history's checkpoint and `extend` it with one parsed request holding a
  2 KB `function_call_output` (open-call check, context budget, render, tokenize,
  append, open the turn). Parsing the frame is `bench_validate`'s figure, not this one.
- full: a fresh `Conversation` rendering and tokenizing the whole history plus the delta.

Targets (design.md): append < 0.3 ms and flat in history length; full/append >= 100x at
100k tokens. Also reported: the cache's memory against 4 bytes per token + item bytes
(target <= 1.5x). Run with `pytest benches/bench_append.py --benchmark-only -s`; figures
land in each test's `extra_info` and are printed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hotloop._core import ChatFormat, Checkpoint, Conversation, CreateRequest, parse_request

HARMONY = ChatFormat.harmony()
WINDOW = 1 << 30
INSTRUCTIONS = "You are a coding agent. Run tools to inspect and fix the repository."
TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Runs a shell command and returns its output.",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
        },
    }
]
LINE = "src/hotloop/conversation.py:42:    return self.chain.tokens  # cached ids\n"
LENGTHS = [1_000, 10_000, 100_000, 1_000_000]


def text_of(size: int) -> str:
    return (LINE * (size // len(LINE) + 1))[:size]


def turn_items(turn: int) -> list[dict[str, Any]]:
    call_id = f"call_{turn}"
    return [
        {"type": "message", "role": "user", "content": f"step {turn}: make the test pass"},
        {
            "type": "function_call",
            "call_id": call_id,
            "name": "exec_command",
            "arguments": orjson.dumps({"cmd": f"pytest -k case_{turn}"}).decode(),
        },
        {"type": "function_call_output", "call_id": call_id, "output": text_of(1500)},
        {"type": "message", "role": "assistant", "content": text_of(300)},
    ]


def history(tokens: int) -> list[dict[str, Any]]:
    """Agent turns until the rendered history reaches `tokens`, ending with an open call."""
    items: list[dict[str, Any]] = []
    probe = Conversation(HARMONY, context_window=WINDOW)
    probe.append_items("[]", instructions=INSTRUCTIONS, tools_json=orjson.dumps(TOOLS).decode())
    turn = 0
    while probe.token_count < tokens:
        batch = turn_items(turn)
        probe.append_items(orjson.dumps(batch).decode())
        items += batch
        turn += 1
    items.append(
        {
            "type": "function_call",
            "call_id": "call_last",
            "name": "exec_command",
            "arguments": '{"cmd": "git diff"}',
        }
    )
    return items


def delta_request() -> CreateRequest:
    body = {
        "model": "gpt-oss",
        "previous_response_id": "resp_0",
        "instructions": INSTRUCTIONS,
        "tools": TOOLS,
        "input": [
            {"type": "function_call_output", "call_id": "call_last", "output": text_of(2048)}
        ],
        "max_output_tokens": 1024,
    }
    request = parse_request(orjson.dumps(body))
    assert request.error is None
    return request


def item_bytes(items: list[dict[str, Any]]) -> int:
    fields = ("content", "call_id", "name", "arguments", "output")
    return sum(len(str(item[f]).encode()) for item in items for f in fields if f in item)


def median_us(fn: Callable[[], object], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1000


def cached_history(items: list[dict[str, Any]]) -> Conversation:
    conversation = Conversation(HARMONY, context_window=WINDOW)
    conversation.append_items(
        orjson.dumps(items).decode(),
        instructions=INSTRUCTIONS,
        tools_json=orjson.dumps(TOOLS).decode(),
    )
    return conversation


@pytest.mark.parametrize("tokens", LENGTHS, ids=[f"{n // 1000}k" for n in LENGTHS])
def test_append_vs_full_render(benchmark: Any, tokens: int) -> None:
    items = history(tokens)
    items_json = orjson.dumps(items).decode()
    tools_json = orjson.dumps(TOOLS).decode()
    request = delta_request()

    def from_scratch() -> Conversation:
        conversation = Conversation(HARMONY, context_window=WINDOW)
        conversation.append_items(items_json, instructions=INSTRUCTIONS, tools_json=tools_json)
        conversation.extend(request)
        return conversation

    cached = cached_history(items)
    checkpoint: Checkpoint = cached.checkpoint()
    # The same append on the shortest history, in the same run: flatness as a ratio.
    short: Checkpoint = cached_history(history(LENGTHS[0])).checkpoint()

    def append(checkpoint: Checkpoint = checkpoint) -> Conversation:
        conversation = checkpoint.fork()
        conversation.extend(request)
        return conversation

    # The cache's prompt is the from-scratch prompt, token for token.
    full = from_scratch()
    appended = append()
    assert appended.prompt().tokens() == full.prompt().tokens()

    benchmark.pedantic(append, rounds=200, iterations=1, warmup_rounds=5)
    append_us = median_us(append, 500)
    short_us = median_us(lambda: append(short), 500)
    full_us = median_us(from_scratch, 3 if tokens >= 1_000_000 else 10)
    memory_ratio = cached.memory_bytes / (4 * cached.token_count + item_bytes(items))
    figures = {
        "history_tokens": cached.token_count,
        "append_us": round(append_us, 1),
        "full_us": round(full_us, 1),
        "full_over_append": round(full_us / append_us, 1),
        "append_over_1k_append": round(append_us / short_us, 2),
        "memory_over_ideal": round(memory_ratio, 3),
    }
    benchmark.extra_info.update(figures)
    print(f"\n{figures}")
