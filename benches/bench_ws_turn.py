"""Server time per turn, from a `response.create` frame to the engine call, against
history length, in one run:

    .venv/bin/python benches/bench_ws_turn.py [--max-tokens 1000000] [--samples 9]

The protocol state machine is driven in process (no socket, so only the server's own
work is timed: parse, cache lookup, fork, validate, render and tokenize, prompt):

- WebSocket continuation: a 2 KB user message with `previous_response_id`, served from
  the connection cache;
- full history: the same turn as a stateless client sends it (every earlier item
  again, no `previous_response_id`), on a fresh connection, as HTTP without state must.

The history grows by large user messages and short model answers to each length.
Reported: the median milliseconds per turn of each, and their ratio; then the same as
one JSON line (`make figures` keeps it in benches/results/ws_turn.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import orjson
from hotloop._core import ChatFormat
from hotloop.protocol import CacheBudget, Connection, ConnectionCache, Finished, Generate, Render

FORMAT = ChatFormat.harmony()
ANSWER_TEXT = "Noted; continuing with the task."
ANSWER = FORMAT.completion_tokens(text=ANSWER_TEXT)
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi".split()


def text(size: int, seed: int) -> str:
    """About `size` bytes of varied words (numbers keep BPE from collapsing them)."""
    parts: list[str] = []
    total, k = 0, seed
    while total < size:
        word = f"{WORDS[k % len(WORDS)]}{k % 1013}"
        parts.append(word)
        total += len(word) + 1
        k += 7
    return " ".join(parts)


class Responses:
    """Observer: keeps the last finished response."""

    def __init__(self) -> None:
        self.last: Finished | None = None

    def finished(self, response: Finished) -> None:
        self.last = response


def connection(observer: Responses) -> Connection:
    return Connection(
        chat_format=FORMAT,
        context_window=1 << 23,
        model="sim",
        cache=ConnectionCache(1 << 36, CacheBudget(1 << 36)),
        observer=observer,
    )


def turn(conn: Connection, event: dict[str, Any]) -> tuple[float, Generate]:
    """Send one frame; returns the milliseconds until the engine call, and the call."""
    frame = orjson.dumps(event).decode()
    start = time.perf_counter()
    conn.receive_text(frame)
    actions = conn.actions()
    for work in [a for a in actions if isinstance(a, Render)]:
        # A large frame's render, which the server runs in a worker thread: run here,
        # inline, it is still the server's work before the engine call.
        request, rendered = work.run()
        conn.render_done(work.key, rendered, request)
        actions = conn.actions()
    elapsed = (time.perf_counter() - start) * 1e3
    (work,) = [a for a in actions if isinstance(a, Generate)]
    conn.engine_output(work.key, ANSWER)
    conn.engine_done(work.key)
    conn.actions()
    return elapsed, work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=9)
    args = parser.parse_args()
    observer = Responses()
    conn = connection(observer)
    history: list[dict[str, Any]] = []
    previous: str | None = None
    tokens = 0
    print(f"{'history':>10} {'ws p50 ms':>10} {'full p50 ms':>12} {'full/ws':>8}")
    rows: list[dict[str, float]] = []
    target = 1000
    seed = 0
    while target <= args.max_tokens:
        while tokens < target:
            chunk = text(min(400_000, max(2_000, (target - tokens) * 4)), seed)
            seed += 1
            message = {"type": "message", "role": "user", "content": chunk}
            event: dict[str, Any] = {
                "type": "response.create",
                "model": "sim",
                "input": [message],
                "store": False,
            }
            if previous is not None:
                event["previous_response_id"] = previous
            _, work = turn(conn, event)
            assert observer.last is not None
            previous = observer.last.response_id
            history += [message, {"type": "message", "role": "assistant", "content": ANSWER_TEXT}]
            tokens = len(work.prompt)
        ws: list[float] = []
        full: list[float] = []
        for i in range(args.samples):
            message = {"type": "message", "role": "user", "content": text(2048, 10_000 + i)}
            base = {"type": "response.create", "model": "sim", "store": False}
            ms, _ = turn(conn, {**base, "input": [message], "previous_response_id": previous})
            ws.append(ms)
            assert observer.last is not None
            previous = observer.last.response_id
            history += [message, {"type": "message", "role": "assistant", "content": ANSWER_TEXT}]
            if i < max(1, args.samples // 3) or target <= 100_000:
                # The stateless peer: the whole history on a fresh connection.
                ms, _ = turn(connection(Responses()), {**base, "input": history})
                full.append(ms)
        ws_p50, full_p50 = statistics.median(ws), statistics.median(full)
        print(f"{tokens:>10} {ws_p50:>10.3f} {full_p50:>12.3f} {full_p50 / ws_p50:>8.0f}x")
        rows.append({"history_tokens": tokens, "ws_p50_ms": ws_p50, "full_p50_ms": full_p50})
        target *= 10
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
