"""The durable store's figures (docs/benchmarks-store.md), each printed as one JSON line:

python benches/bench_store.py sigkill [--runs 5] [--tree DIR]
    SIGKILL `hotloop serve --engine sim` 0-50 ms after clients (3 WebSocket, 1 HTTP
    JSON, 1 SSE) saw `response.completed` for 200 `store=true` responses, restart,
    and count the acknowledged responses that are not readable. `--tree` runs the
    server from another checkout's `python/` (with its compiled `_core` beside it),
    e.g. the code before commit-before-acknowledge.
python benches/bench_store.py commit [--store postgresql://...]
    What a put (a commit before the terminal event) waits, p50/p99, and commits and
    responses per second, with 1, 16 and 64 responses finishing at once; SQLite in a
    temporary directory unless `--store` names a PostgreSQL database.
python benches/bench_store.py dedup
    Bytes one 50-turn session with a 46 KB tool list takes in the SQLite file, with
    the list kept once (this schema) and inline in every response (the first
    release's schema, `MIGRATIONS[0]`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from hotloop.metrics import Metrics
from hotloop.store import StoredResponse, open_store
from hotloop.store.sqlite import FILE_NAME, MIGRATIONS
from websockets.exceptions import WebSocketException
from websockets.sync.client import connect

TARGET = 200
GUARD = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def serve(data_dir: str, tree: str | None) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if tree:
        env["PYTHONPATH"] = str(Path(tree) / "python")
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "hotloop.cli", "serve", "--engine=sim", "--port", str(port)),
            *("--data-dir", data_dir, "--sim-ttft", "0", "--sim-tokens-per-second", "5000"),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tree or None,
    )
    ready = threading.Event()

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            if "Uvicorn running on" in line:
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    assert ready.wait(GUARD) and process.poll() is None
    return process, f"127.0.0.1:{port}"


def acknowledge(acked: list[str], seen: threading.Condition, response_id: str) -> None:
    with seen:
        acked.append(response_id)
        seen.notify_all()


def client(address: str, kind: str, acked: list[str], seen: threading.Condition) -> None:
    body = {"model": "sim", "input": "hi", "store": True}
    try:
        if kind == "ws":
            with connect(f"ws://{address}/v1/responses", open_timeout=GUARD) as ws:
                while True:
                    ws.send(orjson.dumps({"type": "response.create", **body}).decode())
                    while (event := orjson.loads(ws.recv(GUARD)))["type"] not in (
                        "response.completed",
                        "response.failed",
                        "error",
                    ):
                        pass
                    if event["type"] == "response.completed":
                        acknowledge(acked, seen, event["response"]["id"])
        with httpx.Client(base_url=f"http://{address}", timeout=GUARD) as http:
            while True:
                if kind == "http":
                    reply = http.post("/v1/responses", json=body)
                    if reply.status_code == 200:
                        acknowledge(acked, seen, reply.json()["id"])
                    continue
                last: dict[str, Any] = {}
                with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as s:
                    for line in s.iter_lines():
                        if line.startswith("data: "):
                            last = orjson.loads(line[6:])
                if last.get("type") == "response.completed":
                    acknowledge(acked, seen, last["response"]["id"])
    except (OSError, ValueError, httpx.HTTPError, WebSocketException):
        return  # the server was killed: what this client saw is the record


def sigkill_run(tree: str | None) -> dict[str, int]:
    with tempfile.TemporaryDirectory(prefix="hotloop-kill-") as data_dir:
        process, address = serve(data_dir, tree)
        acked: list[str] = []
        seen = threading.Condition()
        threads = [
            threading.Thread(target=client, args=(address, kind, acked, seen), daemon=True)
            for kind in ("ws", "ws", "ws", "http", "sse")
        ]
        for thread in threads:
            thread.start()
        # Woken by each acknowledgement instead of polling; GUARD only bounds a broken run.
        with seen:
            seen.wait_for(lambda: len(acked) >= TARGET, GUARD)
        time.sleep(random.uniform(0, 0.05))
        process.send_signal(signal.SIGKILL)
        process.wait()
        for thread in threads:
            thread.join(GUARD)
        seen = list(acked)
        process, address = serve(data_dir, tree)
        try:
            with httpx.Client(base_url=f"http://{address}", timeout=GUARD) as http:
                lost = sum(http.get(f"/v1/responses/{rid}").status_code != 200 for rid in seen)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(GUARD)
    return {"acknowledged": len(seen), "lost": lost}


def stored(n: int, tools: list[Any] | None = None) -> StoredResponse:
    items = [{"role": "user", "content": "x" * 2000}]
    body = {"id": f"resp_{n}", "object": "response", "output": [], "tools": tools or []}
    return StoredResponse(
        id=f"resp_{n}",
        owner="key_bench",
        previous_response_id=f"resp_{n - 1}" if n else None,
        created_at=1_700_000_000,
        response=orjson.dumps(body),
        input_items=orjson.dumps(items),
        output_token_ids=list(range(300)),
        fingerprint="bench",
    )


async def commit_figures(
    target: str, together: int, rounds: int, window: float
) -> dict[str, float]:
    metrics = Metrics()
    store = await open_store(target, metrics=metrics, commit_window=window)
    waits: list[float] = []
    serial = 0

    async def put(record: StoredResponse) -> None:
        start = time.perf_counter()
        await store.put(record)
        waits.append(time.perf_counter() - start)

    start = time.perf_counter()
    for _ in range(rounds):
        batch = []
        for _ in range(together):
            serial += 1
            batch.append(put(stored(serial)))
        await asyncio.gather(*batch)
    elapsed = time.perf_counter() - start
    await store.close()
    waits.sort()
    return {
        "window_ms": window * 1e3,
        "together": together,
        "wait_p50_ms": round(statistics.median(waits) * 1e3, 2),
        "wait_p99_ms": round(waits[int(len(waits) * 0.99) - 1] * 1e3, 2),
        "commits_per_s": round(metrics.store_commits.value / elapsed, 1),
        "responses_per_s": round(len(waits) / elapsed, 1),
    }


def dedup_figures() -> dict[str, int]:
    tools = [
        {
            "type": "function",
            "name": f"tool_{i}",
            "description": "d" * 300,
            "parameters": {"type": "object", "properties": {"p": {"type": "string"}}},
            "strict": False,
        }
        for i in range(110)
    ]
    records = [stored(n, tools) for n in range(50)]
    with tempfile.TemporaryDirectory() as once, tempfile.TemporaryDirectory() as inline:

        async def write_once() -> None:
            store = await open_store(once)
            for record in records:
                await store.put(record)
            await store.close()

        asyncio.run(write_once())
        with sqlite3.connect(Path(inline) / FILE_NAME) as db:
            for statement in MIGRATIONS[0]:
                db.execute(statement)
            db.executemany(
                "INSERT INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        *(r.id, r.owner, r.previous_response_id, r.created_at, r.response),
                        *(r.input_items, orjson.dumps(list(r.output_token_ids))),
                    )
                    for r in records
                ],
            )
        for directory in (once, inline):
            with sqlite3.connect(Path(directory) / FILE_NAME) as db:
                db.execute("VACUUM")
        return {
            "tool_list_bytes": len(orjson.dumps(tools)),
            "turns": len(records),
            "file_bytes_list_once": (Path(once) / FILE_NAME).stat().st_size,
            "file_bytes_list_inline": (Path(inline) / FILE_NAME).stat().st_size,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("figure", choices=["sigkill", "commit", "dedup"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tree", default=None)
    parser.add_argument("--store", default=None)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    if args.figure == "sigkill":
        runs = [sigkill_run(args.tree) for _ in range(args.runs)]
        print(json.dumps({"tree": args.tree or "this", "runs": runs}))
    elif args.figure == "commit":
        with tempfile.TemporaryDirectory() as directory:
            target = args.store or directory
            figures = [
                asyncio.run(commit_figures(target, together, args.rounds, window))
                for window in (0.0, 0.002)
                for together in (1, 16, 64)
            ]
        print(json.dumps({"store": "postgresql" if args.store else "sqlite", "runs": figures}))
    else:
        print(json.dumps(dedup_figures()))


if __name__ == "__main__":
    main()
