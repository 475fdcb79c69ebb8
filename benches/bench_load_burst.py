"""The arrival burst behind issue 5's handshake timeouts, measured directly: AGENTS
agents connect at once, each sending a first request with HISTORY_BYTES of real text
(source files), while one probe connection already open runs small turns back to back
and records the time from its `response.create` to `response.created` (server time
only: the sim's first token comes after it). Also recorded: each arriving agent's
handshake time. One `hotloop serve` process, sim engine.

    python benches/bench_load_burst.py    # prints one JSON line

`benches/results/history/load_burst_before_after.json` holds runs before and after the
offload, alternated back to back.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

import orjson
from hotloop.lab.proc import ServerProcess
from websockets.asyncio.client import ClientConnection, connect

AGENTS = 60
HISTORY_BYTES = 400_000
HEADERS = {"Authorization": "Bearer bench"}
FLAGS = [
    "--engine",
    "sim",
    "--model",
    "sim",
    "--api-keys",
    "bench",
    "--sim-tokens-per-second",
    "1000",
    "--sim-ttft",
    "0.01",
    "--sim-prefill-tokens-per-second",
    "1e7",
]


def corpus() -> str:
    root = Path(__file__).resolve().parents[1]
    files = sorted([*root.glob("python/**/*.py"), *root.glob("rust/src/**/*.rs")])
    text = "\n".join(f.read_text() for f in files)
    while len(text) < 2 * HISTORY_BYTES:
        text += text
    return text


async def turn(ws: ClientConnection, text: str) -> float:
    start = time.perf_counter()
    await ws.send(orjson.dumps({"type": "response.create", "model": "sim", "input": text}).decode())
    created = None
    while True:
        event = orjson.loads(await ws.recv())
        if created is None:
            created = time.perf_counter() - start
        if event["type"] in ("response.completed", "error", "response.failed"):
            assert created is not None
            return created


async def burst(url: str, text: str) -> dict[str, float]:
    probe_times: list[float] = []
    handshakes: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        async with connect(url, additional_headers=HEADERS) as ws:
            await turn(ws, "warm up")
            ready.set()
            while not done.is_set():
                probe_times.append(await turn(ws, "a short tool output"))

    async def agent(i: int) -> None:
        start = time.perf_counter()
        async with connect(url, additional_headers=HEADERS, open_timeout=60) as ws:
            handshakes.append(time.perf_counter() - start)
            offset = (i * 7919) % HISTORY_BYTES
            await turn(ws, text[offset : offset + HISTORY_BYTES])

    ready = asyncio.Event()
    probing = asyncio.create_task(probe())
    await ready.wait()
    start = time.perf_counter()
    await asyncio.gather(*(agent(i) for i in range(AGENTS)))
    elapsed = time.perf_counter() - start
    done.set()
    await probing
    return {
        "burst_s": elapsed,
        "probe_turns": len(probe_times),
        "probe_created_p50_ms": 1000 * statistics.median(probe_times),
        "probe_created_max_ms": 1000 * max(probe_times),
        "handshake_p50_ms": 1000 * statistics.median(handshakes),
        "handshake_max_ms": 1000 * max(handshakes),
    }


def main() -> None:
    text = corpus()
    with ServerProcess.start(FLAGS) as server:
        url = f"ws://127.0.0.1:{server.port}/v1/responses"
        result = asyncio.run(burst(url, text))
    result["agents"], result["history_bytes"] = AGENTS, HISTORY_BYTES
    print(json.dumps(result))


if __name__ == "__main__":
    main()
