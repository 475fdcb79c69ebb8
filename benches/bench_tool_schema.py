"""Cost per property of a wide tool schema: one function tool whose `parameters` has N
string properties, all required (an MCP server's tool list in one schema), parsed and
checked (`parse_event`) and rendered and tokenized into a harmony prompt
(`Conversation.extend`), from 1k to 60k properties.

The cost must be linear in the schema: the figure is the CPU time per property at each
size, and the ratio of the largest to the smallest, measured in one run (1.0 is flat).
The quick check of the same ratio runs in CI (`benches/test_ratios.py`).

    .venv/bin/python benches/bench_tool_schema.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import orjson
from hotloop._core import ChatFormat, Conversation, CreateRequest, Limits, parse_event

SIZES = (1_000, 5_000, 20_000, 60_000)
# Wide enough for the largest schema (the server's default refuses tools above 2 MiB).
LIMITS = Limits(max_tools_bytes=64 * 1024 * 1024)


def wide_tool_frame(properties: int, variant: int = 0) -> bytes:
    """A `response.create` frame with one tool of `properties` required properties;
    frames of another `variant` differ in one byte, so the core's cache of recently
    parsed tool lists cannot answer for them."""
    props = {
        f"property_{i}": {"type": "string", "description": f"the value number {i}"}
        for i in range(properties)
    }
    tool: dict[str, Any] = {
        "type": "function",
        "name": "wide",
        "description": f"A tool with many parameters ({variant}).",
        "parameters": {"type": "object", "properties": props, "required": list(props)},
    }
    return orjson.dumps({"type": "response.create", "model": "sim", "input": "hi", "tools": [tool]})


def accept(frame: bytes, harmony: ChatFormat) -> None:
    """What the server does with the frame before the engine: parse, check, render."""
    request = parse_event(frame, LIMITS)
    assert isinstance(request, CreateRequest) and request.error is None
    Conversation(harmony, context_window=1 << 24).extend(request)


def cost_per_property(properties: int, harmony: ChatFormat, repeat: int) -> float:
    """The least CPU time of `repeat` accepts, in seconds per property. The work runs
    on this thread, so its CPU clock measures it without the time other processes of a
    shared machine take from it."""
    frames = [wide_tool_frame(properties, variant) for variant in range(repeat)]
    best = float("inf")
    for frame in frames:
        start = time.thread_time()
        accept(frame, harmony)
        best = min(best, time.thread_time() - start)
    return best / properties


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    harmony = ChatFormat.harmony()
    accept(wide_tool_frame(100), harmony)  # loads the tokenizer's tables
    costs = {}
    for n in SIZES:
        costs[n] = cost_per_property(n, harmony, args.repeat)
        size = len(wide_tool_frame(n))
        print(f"{n:>6} properties ({size / 1e6:.2f} MB): {costs[n] * 1e6:.2f} us per property")
    largest, smallest = SIZES[-1], SIZES[0]
    ratio = costs[largest] / costs[smallest]
    print(f"per-property cost at {largest} / at {smallest}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
