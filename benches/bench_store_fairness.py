"""The store's writer shared between tenants (issue 21, defect 5): how long tenant B's
`store: true` response waits for its commit (what the terminal event waits for),
quiet and while tenant A floods the writer from four sockets with stored warm-ups
(`generate: false`: no engine time) of 10,000 input items each. On SQLite and on
PostgreSQL (a server of its own, when PostgreSQL 15 is installed), through the store's
public interface in one process, as the server calls it: A's four "sockets" each put a
response and put the next once it committed; B puts one turn after another. Prints one
JSON line per store (B's median and p99 commit wait, quiet and attacked, their ratio,
A's responses) and one of them all; the target is a ratio of at most 2. Quiet and
attacked alternate in `ROUNDS` rounds of SECONDS / ROUNDS each on the same database,
and the ratio is the median of each round's attacked median over its quiet one: on a
shared machine the disk's fsync time drifts several-fold within a minute (other jobs'
writes), so one long quiet run then one long attacked run measured the drift as much
as the attack.

    .venv/bin/python benches/bench_store_fairness.py [SECONDS]
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
from hotloop.lab.abuse import percentile
from hotloop.lab.cluster import Postgres
from hotloop.store import Store, StoredResponse, open_store

SOCKETS = 4
ITEMS = 10_000
ROUNDS = 3


def record(rid: str, owner: str, items: bytes) -> StoredResponse:
    body = {"id": rid, "object": "response", "output": [], "tools": [], "status": "completed"}
    return StoredResponse(
        id=rid,
        owner=owner,
        previous_response_id=None,
        created_at=int(time.time()),
        response=orjson.dumps(body),
        input_items=items,
        output_token_ids=list(range(40)),
        fingerprint="bench",
    )


async def victim(store: Store, running: asyncio.Event) -> list[float]:
    """Tenant B: one small turn after another while `running` is set."""
    turn = orjson.dumps([{"role": "user", "content": "the next step"}])
    waits = []
    n = 0
    while running.is_set() or n < 3:
        n += 1
        started = time.perf_counter()
        await store.put(record(f"resp_b{time.monotonic_ns()}_{n}", "key_b", turn))
        waits.append(time.perf_counter() - started)
    return waits


async def attacker(store: Store, running: asyncio.Event) -> int:
    """Tenant A's socket: stored warm-ups of ITEMS items, back to back."""
    items = orjson.dumps([{"role": "user", "content": f"item {n}"} for n in range(ITEMS)])
    stored = 0
    while running.is_set():
        await store.put(record(f"resp_a{time.monotonic_ns()}", "key_a", items))
        stored += 1
    return stored


async def scenario(target: str | Path, seconds: float, attacked: bool) -> tuple[list[float], int]:
    """B's commit waits, and A's responses stored."""
    store = await open_store(target)
    running = asyncio.Event()
    running.set()
    try:
        attackers = [
            asyncio.create_task(attacker(store, running)) for _ in range(SOCKETS if attacked else 0)
        ]
        waits_task = asyncio.create_task(victim(store, running))
        await asyncio.sleep(seconds)
        running.clear()
        waits = await waits_task
        stored = sum(await asyncio.gather(*attackers))
    finally:
        await store.close()
    return waits, stored


def summary(runs: list[tuple[list[float], int]]) -> dict[str, object]:
    waits = [wait for run, _ in runs for wait in run]
    return {
        "turns": len(waits),
        "p50_ms": round(percentile(waits, 0.5) * 1e3, 2),
        "p99_ms": round(percentile(waits, 0.99) * 1e3, 2),
        "attacker_responses": sum(stored for _, stored in runs),
    }


@contextmanager
def target(name: str) -> Iterator[str | Path | None]:
    if name == "sqlite":
        with tempfile.TemporaryDirectory() as data:
            yield Path(data)
    elif not Postgres.installed():
        yield None
    else:
        with Postgres.temporary() as server:
            yield server.fresh_database()


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
    rows = []
    for name in ("sqlite", "postgresql"):
        with target(name) as where:
            if where is None:
                continue
            runs: dict[bool, list[tuple[list[float], int]]] = {False: [], True: []}
            for _ in range(ROUNDS):
                for attack in (False, True):
                    runs[attack].append(asyncio.run(scenario(where, seconds / ROUNDS, attack)))
        quiet, attacked = summary(runs[False]), summary(runs[True])
        rounds = [
            round(percentile(a, 0.5) / percentile(q, 0.5), 2)
            for (q, _), (a, _) in zip(runs[False], runs[True], strict=True)
        ]
        ratio = percentile(rounds, 0.5)
        row = {
            "store": name,
            "quiet": quiet,
            "attacked": attacked,
            "rounds": rounds,
            "ratio": ratio,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
