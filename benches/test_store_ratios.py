"""Persistence stays off the critical path: what a turn pays to store its response
(`Store.put`, a queue append) vs committing it to SQLite inline, measured in one run
and checked only as a ratio (>= 50x; about 1000x on a laptop).

A put of an agent turn (8 KB of input items, a 2 KB answer, 500 sampled ids) costs the
event loop under a microsecond; the commit it replaces (item listing, JSON, two
inserts, a WAL commit) costs hundreds, which alone would exceed the 0.3 ms per-turn
budget. The background writer does that work on its own thread.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
from hotloop.store import StoredResponse, open_store
from hotloop.store.sqlite import SQLiteDatabase

TURNS = 200


def agent_turn(n: int) -> StoredResponse:
    items = [
        {"role": "user", "content": "x" * 2000},
        {"type": "function_call_output", "call_id": f"call_{n}", "output": "y" * 6000},
    ]
    text = {"type": "output_text", "text": "z" * 2000, "annotations": []}
    body = {"id": f"resp_{n}", "object": "response", "output": [{"content": [text]}]}
    return StoredResponse(
        id=f"resp_{n}",
        owner="key_bench",
        previous_response_id=f"resp_{n - 1}" if n else None,
        created_at=1_700_000_000,
        response=orjson.dumps(body),
        input_items=orjson.dumps(items),
        output_token_ids=list(range(500)),
    )


async def put_all(data_dir: Path, turns: list[StoredResponse]) -> float:
    store = await open_store(data_dir, queue_size=len(turns))
    start = time.perf_counter()
    for turn in turns:
        await store.put(turn)
    elapsed = time.perf_counter() - start
    await store.close()
    return elapsed


def commit_all(data_dir: Path, turns: list[StoredResponse]) -> float:
    database = SQLiteDatabase(data_dir / "inline.sqlite3")
    start = time.perf_counter()
    for turn in turns:
        database.write([turn])
    elapsed = time.perf_counter() - start
    database.close()
    return elapsed


def test_a_put_costs_the_turn_far_less_than_an_inline_commit(tmp_path: Path) -> None:
    put = asyncio.run(put_all(tmp_path / "queued", [agent_turn(n) for n in range(TURNS)]))
    inline = commit_all(tmp_path, [agent_turn(n) for n in range(TURNS)])
    ratio = inline / put
    print(
        f"\nstore: put {put / TURNS * 1e6:.2f} us/turn, inline commit "
        f"{inline / TURNS * 1e6:.0f} us/turn, ratio {ratio:.0f}x"
    )
    assert ratio >= 50
