"""Group commit keeps durable storage cheap per response: 200 agent turns finishing
together (a 2 KB user turn and 300 sampled ids each, `bench_store.stored`), committed through
the store's writer (responses arriving together share one fsync'd transaction) vs one
fsync'd transaction per response, measured in one run and checked only as a ratio
(>= 5x, about half the lowest measured on the dev machine: 9.7-29.6x, where one fsync
costs a few milliseconds and varies with the disk's load).

Each put returns only once its response is durable (commit before acknowledge), so
this ratio is what keeps the terminal event's wait short under load.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from bench_store import stored
from hotloop.metrics import Metrics
from hotloop.store import StoredResponse, open_store
from hotloop.store.records import prepare
from hotloop.store.sqlite import SQLiteDatabase

TURNS = 200


async def grouped(data_dir: Path, turns: list[StoredResponse]) -> tuple[float, float]:
    metrics = Metrics()
    store = await open_store(data_dir, metrics=metrics)
    start = time.perf_counter()
    await asyncio.gather(*(store.put(turn) for turn in turns))
    elapsed = time.perf_counter() - start
    await store.close()
    return elapsed, metrics.store_commits.value


def one_by_one(data_dir: Path, turns: list[StoredResponse]) -> float:
    database = SQLiteDatabase.in_directory(data_dir)
    start = time.perf_counter()
    for turn in turns:
        database.write([prepare(turn)], [])
    elapsed = time.perf_counter() - start
    database.close()
    return elapsed


def test_group_commit_beats_a_transaction_per_response(tmp_path: Path) -> None:
    together, commits = asyncio.run(
        grouped(tmp_path / "grouped", [stored(n) for n in range(TURNS)])
    )
    alone = one_by_one(tmp_path / "alone", [stored(n) for n in range(TURNS)])
    ratio = alone / together
    print(
        f"\nstore: {TURNS} responses in {commits:.0f} group commits {together * 1e3:.1f} ms, "
        f"one commit each {alone * 1e3:.1f} ms, ratio {ratio:.1f}x"
    )
    assert ratio >= 5
