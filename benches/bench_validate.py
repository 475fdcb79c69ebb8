"""Parse + validate cost of client frames: a 2 KB delta (one tool result chained with
previous_response_id) and a 200 KB full history, per frame and per byte.

A third frame is the delta with a coding agent's tool list (about 46 KB), which agents
resend every turn; after the first parse the list comes from the core's tool cache.

Ratios are measured in one run: the per-byte cost of the full history against the delta
(parsing is linear, so about 1), and parse+validate against `orjson.loads` of the same
frame (a pure JSON parse into Python objects, which validation alone would already need).
Run with `make bench` or `pytest benches/bench_validate.py --benchmark-only -s`.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hotloop._core import CreateRequest, Policy, parse_event

# A line of tool output with the escapes real outputs have (quotes, backslashes, tabs).
TOOL_OUTPUT_LINE = 'src/app.py:42:    return {"status": "ok", "path": "/tmp/x\\y"}  # \tnote\n'

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": f"tool_{i}",
        "description": "Runs a command in the workspace and returns its output.",
        "parameters": {
            "type": "object",
            "properties": {
                "cmd": {"type": "string", "description": "the command"},
                "timeout_ms": {"type": ["integer", "null"], "minimum": 0},
                "env": {"type": "object", "additionalProperties": {"type": "string"}},
            },
            "required": ["cmd"],
            "additionalProperties": False,
        },
        "strict": False,
    }
    for i in range(8)
] + [{"type": "custom", "name": "apply_patch"}, {"type": "web_search"}]


def text_of(size: int) -> str:
    return (TOOL_OUTPUT_LINE * (size // len(TOOL_OUTPUT_LINE) + 1))[:size]


# A tool list the size of a coding agent's (about 46 KB), resent with every turn.
AGENT_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": f"agent_tool_{i}",
        "description": "Does one thing in the workspace. " * 12,
        "parameters": {
            "type": "object",
            "properties": {
                f"arg_{j}": {"type": "string", "description": "What this argument means. " * 4}
                for j in range(12)
            },
            "required": ["arg_0"],
            "additionalProperties": False,
        },
        "strict": False,
    }
    for i in range(20)
]


def delta_frame(tools: list[dict[str, Any]] | None = None) -> bytes:
    """One tool result of about 2 KB, as Codex chains it (with its tools, if given)."""
    return orjson.dumps(
        {
            "type": "response.create",
            "model": "gpt-oss",
            "previous_response_id": "resp_0123456789abcdef",
            "store": False,
            "stream": True,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "session-1",
            "tools": tools or [],
            "input": [
                {"type": "function_call_output", "call_id": "call_42", "output": text_of(1900)}
            ],
        }
    )


def history_frame(target_bytes: int = 200_000) -> bytes:
    """A full history of about `target_bytes`: turns of user text, reasoning, calls, results."""
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "x"}]}
    ]
    turn = 0
    while len(orjson.dumps(items)) < target_bytes:
        call_id = f"call_{turn}"
        items += [
            {"type": "message", "role": "user", "content": f"step {turn}: fix the failing test"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": text_of(200)}]},
            {
                "type": "function_call",
                "call_id": call_id,
                "name": "tool_0",
                "arguments": json.dumps({"cmd": f"pytest -k case_{turn}"}),
            },
            {"type": "function_call_output", "call_id": call_id, "output": text_of(1500)},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text_of(300), "annotations": []}],
            },
        ]
        turn += 1
    return orjson.dumps(
        {"type": "response.create", "model": "gpt-oss", "tools": TOOLS, "input": items}
    )


FRAMES = {
    "delta_2kb": delta_frame(),
    # The second parse of the same tool list onwards takes the parsed tools from a cache.
    "delta_2kb_with_agent_tools": delta_frame(AGENT_TOOLS),
    "history_200kb": history_frame(),
}


def median_ns(fn: Callable[[bytes], object], frame: bytes, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        fn(frame)
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples)


@pytest.mark.parametrize("name", list(FRAMES))
def test_parse_and_validate(benchmark: Any, name: str) -> None:
    frame = FRAMES[name]
    request = benchmark(parse_event, frame)
    assert isinstance(request, CreateRequest) and request.error is None
    benchmark.extra_info["frame_bytes"] = len(frame)


def test_policy_scan(benchmark: Any) -> None:
    """The content policy over a full history: 1,000 operator patterns, one pass."""
    request = parse_event(FRAMES["history_200kb"])
    assert isinstance(request, CreateRequest)
    policy = Policy([f"blocked phrase number {i}" for i in range(1000)])
    benchmark(policy.check, request)
    benchmark.extra_info["input_bytes"] = request.input_bytes


def test_per_byte_cost_ratios(benchmark: Any) -> None:
    delta, history = FRAMES["delta_2kb"], FRAMES["history_200kb"]
    benchmark.pedantic(parse_event, args=(history,), rounds=20, iterations=1)
    figures: dict[str, float] = {}
    for name, frame, rounds in (("delta", delta, 2000), ("history", history, 60)):
        ours = median_ns(parse_event, frame, rounds)
        reference = median_ns(orjson.loads, frame, rounds)
        figures[f"{name}_us"] = ours / 1000
        figures[f"{name}_ns_per_byte"] = ours / len(frame)
        figures[f"{name}_vs_orjson_loads"] = ours / reference
    figures["history_vs_delta_per_byte"] = (
        figures["history_ns_per_byte"] / figures["delta_ns_per_byte"]
    )
    benchmark.extra_info.update(figures)
    print()
    for key, value in figures.items():
        print(f"  {key:28} {value:10.3f}")
