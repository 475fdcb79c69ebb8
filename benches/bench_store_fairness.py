"""The store's writer shared between tenants (issue 21, defect 5; issue 39): how long
tenant B's `store: true` response waits for its commit (what the terminal event waits
for), quiet and while tenant A floods the writer from four sockets with large stored
responses (no engine time), on SQLite and on PostgreSQL (a server of its own, when
PostgreSQL 15 is installed), through the store's public interface, as the server calls
it: A's four "sockets" each put a response and put the next once it committed; B puts
one turn after another. A's responses, about 350 KB each, in three shapes (`SHAPES`):
`items`, 10,000 input items (stored warm-ups, `generate: false`); `item`, one input
item of 350 KB (a large file or tool output sent back); `output`, an output of 350 KB
(a long answer). The target is a ratio of at most 2.

Quiet and attacked alternate in `--rounds` rounds of SECONDS / rounds each on the same
database, and the ratio is the median of each round's attacked median over its quiet
one: on a shared machine the disk's fsync time drifts several-fold within a minute
(other jobs' writes), so one long quiet run then one long attacked run measured the
drift as much as the attack. Each run is a process of its own; `--baseline NAME=DIR`
adds the same runs from another hotloop package (DIR first on PYTHONPATH), interleaved
with this one's in every round, for before/after figures measured together. Prints one
JSON line per store and shape (per version: B's median and p99 commit wait, quiet and
attacked, the rounds' ratios and their median, A's responses stored) and one of them all.

    .venv/bin/python benches/bench_store_fairness.py [SECONDS] [--shape items,item,output]
        [--rounds 3] [--baseline NAME=DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
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
SIZE = 350_000
"""What one of A's responses weighs (bytes of JSON, about)."""
SHAPES = ("items", "item", "output")


def record(
    rid: str, owner: str, items: bytes, output: list[object] | None = None
) -> StoredResponse:
    body = {
        "id": rid,
        "object": "response",
        "output": output or [],
        "tools": [],
        "status": "completed",
    }
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


def large(rid: str, shape: str) -> StoredResponse:
    """One of tenant A's responses, of `shape`."""
    if shape == "items":
        items = [{"role": "user", "content": f"item {n}"} for n in range(10_000)]
        return record(rid, "key_a", orjson.dumps(items))
    if shape == "item":
        return record(rid, "key_a", orjson.dumps([{"role": "user", "content": "x" * SIZE}]))
    text = {"type": "output_text", "text": "y" * SIZE, "annotations": []}
    message = {"type": "message", "id": f"msg_{rid}", "role": "assistant", "content": [text]}
    return record(rid, "key_a", orjson.dumps([{"role": "user", "content": "hi"}]), [message])


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


async def attacker(store: Store, running: asyncio.Event, shape: str) -> int:
    """Tenant A's socket: large responses of `shape`, back to back."""
    stored = 0
    while running.is_set():
        await store.put(large(f"resp_a{time.monotonic_ns()}", shape))
        stored += 1
    return stored


async def scenario(
    target: str | Path, seconds: float, shape: str | None
) -> tuple[list[float], int]:
    """B's commit waits, and A's responses stored (`shape` None: quiet)."""
    store = await open_store(target)
    running = asyncio.Event()
    running.set()
    try:
        attackers = [
            asyncio.create_task(attacker(store, running, shape))
            for _ in range(0 if shape is None else SOCKETS)
        ]
        waits_task = asyncio.create_task(victim(store, running))
        await asyncio.sleep(seconds)
        running.clear()
        waits = await waits_task
        stored = sum(await asyncio.gather(*attackers))
    finally:
        await store.close()
    return waits, stored


def run(package: str | None, target: str | Path, seconds: float, shape: str | None) -> dict:
    """One scenario in a process of its own, from `package` (None: this checkout's)."""
    env = dict(os.environ)
    if package is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package, env.get("PYTHONPATH")]))
    args = ["--scenario", str(target), str(seconds), shape or "quiet"]
    answer = subprocess.run(
        [sys.executable, __file__, *args], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(answer.stdout.splitlines()[-1])


def summary(runs: list[dict]) -> dict[str, object]:
    waits = [wait for run in runs for wait in run["waits"]]
    return {
        "turns": len(waits),
        "p50_ms": round(percentile(waits, 0.5) * 1e3, 2),
        "p99_ms": round(percentile(waits, 0.99) * 1e3, 2),
        "attacker_responses": sum(run["stored"] for run in runs),
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
    parser = argparse.ArgumentParser()
    parser.add_argument("seconds", nargs="?", type=float, default=15.0)
    parser.add_argument("--shape", default=",".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", action="append", default=[], metavar="NAME=DIR")
    args = parser.parse_args()
    versions: dict[str, str | None] = dict(spec.split("=", 1) for spec in args.baseline)
    versions["current"] = None
    seconds = args.seconds / args.rounds
    rows = []
    for name in ("sqlite", "postgresql"):
        with target(name) as where:
            if where is None:
                continue
            for shape in args.shape.split(","):
                runs: dict[tuple[str, bool], list[dict]] = {
                    (version, attacked): [] for version in versions for attacked in (False, True)
                }
                for _ in range(args.rounds):
                    for version, package in versions.items():
                        for attacked in (False, True):
                            runs[version, attacked].append(
                                run(package, where, seconds, shape if attacked else None)
                            )
                row: dict[str, object] = {"store": name, "shape": shape}
                for version in versions:
                    quiet, attacked = runs[version, False], runs[version, True]
                    rounds = [
                        round(percentile(a["waits"], 0.5) / percentile(q["waits"], 0.5), 2)
                        for q, a in zip(quiet, attacked, strict=True)
                    ]
                    row[version] = {
                        "quiet": summary(quiet),
                        "attacked": summary(attacked),
                        "rounds": rounds,
                        "ratio": percentile(rounds, 0.5),
                    }
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(json.dumps(rows))


def scenario_main(where: str, seconds: str, shape: str) -> None:
    target: str | Path = where if "://" in where else Path(where)
    waits, stored = asyncio.run(
        scenario(target, float(seconds), None if shape == "quiet" else shape)
    )
    print(json.dumps({"waits": waits, "stored": stored}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--scenario"]:
        scenario_main(*sys.argv[2:5])
    else:
        main()
