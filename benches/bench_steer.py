"""What a `response.steer` costs the server, beside a 2 KB append and a full re-render.

One run, one `Connection` (sans-I/O, harmony, the sim model's ids), a history of about
100k tokens, then ROUNDS rounds of steer and append alternating, then ROUNDS re-renders,
all timed on this thread:

- steer: `response.steer` with a 2 KB user message into the running response, the
  engine reporting it done, up to the successor's `Generate` (validate the steer, commit
  the target, parse the successor, fork, render and append the 2 KB).
- append: the rest of the same answer sampled, the engine reporting it done, then a
  `response.create` continuing it with the same 2 KB user message, up to its `Generate`.
- re-render: a new connection given the whole history plus the 2 KB as input (what a
  server without the cache does for every turn), up to its `Generate`.
- inject: the long-running response (`inject=True`): the model called a tool and the
  response waits; `response.inject` with a 2 KB tool output, up to the resumed
  `Generate` of the same response.
- inject stored: the same into a `store: true` response on a durable connection, which
  keeps each finished model turn's ids for the store's record of the interleaving.
- tool continuation: the same call ending its response, then a `response.create`
  continuing it with the same 2 KB tool output, up to its `Generate` (the chain).

Prints medians and the ratios steer/append (target about 1), re-render/steer,
inject/tool continuation (target at most 1) and inject stored/inject.
Run: `.venv/bin/python benches/bench_steer.py` (figures: docs/steering.md).
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import orjson
from bench_append import INSTRUCTIONS, TOOLS, text_of, turn_items
from hotloop._core import ChatFormat, Conversation
from hotloop.protocol import CacheBudget, Connection, ConnectionCache, Generate, Render

FORMAT = ChatFormat.harmony()
ANSWER = FORMAT.completion_tokens(text="Done.")
CALL = FORMAT.completion_tokens(calls=[("exec_command", '{"cmd": "git diff"}')])
HISTORY_TOKENS = 100_000
ROUNDS = 30
STEER_TEXT = text_of(2048)


def connection(inject: bool = False, durable: bool = False) -> Connection:
    cache = ConnectionCache(1 << 32, CacheBudget(1 << 32))
    return Connection(
        chat_format=FORMAT,
        context_window=1 << 22,
        model="sim",
        cache=cache,
        inject=inject,
        durable=durable,
    )


def run(conn: Connection) -> tuple[int, str | None]:
    """Play the transport until the turn's `Generate`: its key and the response id (of
    a new response; None when the same response resumed)."""
    response_id = None
    while True:
        actions = conn.actions()
        for action in actions:
            if isinstance(action, Render):
                request, turn = action.run()
                conn.render_done(action.key, turn, request)
            elif isinstance(action, Generate):
                return action.key, response_id
            elif isinstance(action, bytes) and b'"response.created"' in action:
                response_id = orjson.loads(action)["response"]["id"]
        assert actions, "the turn never reached the engine"


def call(conn: Connection, key: int) -> str:
    """The model samples a tool call and the engine reports it done: the call id."""
    conn.engine_output(key, CALL)
    conn.engine_done(key)
    done = [a for a in conn.actions() if isinstance(a, bytes) and b"output_item.done" in a]
    return str(orjson.loads(done[-1])["item"]["call_id"])


def history() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    probe = Conversation(FORMAT, context_window=1 << 22)
    while probe.token_count < HISTORY_TOKENS:
        batch = turn_items(len(items))
        probe.append_items(orjson.dumps(batch).decode())
        items += batch
    return items


def create(input: Any, **fields: Any) -> str:
    body = {"type": "response.create", "model": "sim", "input": input, "store": False}
    return orjson.dumps({**body, **fields, "instructions": INSTRUCTIONS, "tools": TOOLS}).decode()


def main() -> None:
    items = history()
    conn = connection()
    conn.receive_text(create(items))
    key, response_id = run(conn)
    steer = {"type": "message", "role": "user", "content": STEER_TEXT}
    timings: dict[str, list[float]] = {"steer": [], "append": [], "re-render": []}
    for _ in range(ROUNDS):
        conn.engine_output(key, ANSWER[:2])  # the target is sampling its answer
        start = time.perf_counter()
        frame = {"type": "response.steer", "previous_response_id": response_id, "input": [steer]}
        conn.receive_text(orjson.dumps(frame))
        conn.engine_output(key, ANSWER[2:])
        conn.engine_done(key)
        key, response_id = run(conn)
        timings["steer"].append(time.perf_counter() - start)

        conn.engine_output(key, ANSWER[:2])
        start = time.perf_counter()
        conn.engine_output(key, ANSWER[2:])
        conn.engine_done(key)
        conn.receive_text(create([steer], previous_response_id=response_id))
        key, response_id = run(conn)
        timings["append"].append(time.perf_counter() - start)
    # Apart: a 100 ms re-render just before a round would leave the steer to run on
    # cold caches.
    for _ in range(ROUNDS):
        fresh = connection()
        start = time.perf_counter()
        fresh.receive_text(create([*items, steer]))
        run(fresh)
        timings["re-render"].append(time.perf_counter() - start)
    timings |= tool_outputs(items)
    medians = {name: statistics.median(values) * 1e3 for name, values in timings.items()}
    print(f"history {HISTORY_TOKENS} tokens, 2 KB steering input, {ROUNDS} rounds (median ms):")
    for name, value in medians.items():
        print(f"  {name:17} {value:8.3f} ms")
    print(f"  steer/append     {medians['steer'] / medians['append']:.2f}")
    print(f"  re-render/steer  {medians['re-render'] / medians['steer']:.1f}")
    ratio = medians["inject"] / medians["tool continuation"]
    print(f"  inject/tool continuation  {ratio:.2f}")
    print(f"  inject stored/inject      {medians['inject stored'] / medians['inject']:.2f}")
    # for benches/figures.py, which writes docs/steering.md's table from it
    print(json.dumps({"history_tokens": HISTORY_TOKENS, "rounds": ROUNDS, "median_ms": medians}))


def tool_output(call_id: str) -> dict[str, str]:
    return {"type": "function_call_output", "call_id": call_id, "output": STEER_TEXT}


def tool_outputs(items: list[dict[str, Any]]) -> dict[str, list[float]]:
    """A 2 KB tool output into the waiting long-running response (not stored, and
    stored: each model turn's ids kept for the store's record), and into a chain."""
    timings: dict[str, list[float]] = {"inject": [], "inject stored": [], "tool continuation": []}
    long, stored, chain = connection(inject=True), connection(True, durable=True), connection()
    long.receive_text(create(items))
    stored.receive_text(create(items, store=True))
    chain.receive_text(create(items))
    waiting = {"inject": (long, *run(long)), "inject stored": (stored, *run(stored))}
    chain_key, chain_id = run(chain)
    for _ in range(ROUNDS):
        for name, (conn, key, response_id) in waiting.items():
            output = tool_output(call(conn, key))
            frame = {"type": "response.inject", "response_id": response_id, "input": [output]}
            start = time.perf_counter()
            conn.receive_text(orjson.dumps(frame))
            key, resumed = run(conn)
            timings[name].append(time.perf_counter() - start)
            assert resumed is None, "the same response resumes"
            waiting[name] = (conn, key, response_id)

        continuation = create([tool_output(call(chain, chain_key))], previous_response_id=chain_id)
        start = time.perf_counter()
        chain.receive_text(continuation)
        chain_key, chain_id = run(chain)
        timings["tool continuation"].append(time.perf_counter() - start)
    return timings


if __name__ == "__main__":
    main()
