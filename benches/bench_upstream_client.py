"""Client CPU per streamed token of three ways to read a vLLM stream, in one run:

    .venv/bin/python benches/bench_upstream_client.py [--streams 8] [--rate 1000]
        [--per-event 1] [--turns 3]

The fake vLLM of bench_upstream_stream.py in its own process (paced, chunked, keep-alive);
in this process, `--streams` concurrent streams read by each option in turn, and this
process's CPU clock per token received:

- `httpx`: `AsyncClient.stream(...).aiter_raw()` (httpcore, h11, anyio), each read fed to
  the Rust decoder (what the upstream engine did before `hotloop.engines.http1`);
- `streams`: asyncio streams (`open_connection`, `await reader.read()`), each read fed to
  the Rust reader (head, chunks and events);
- `protocol`: `hotloop.engines.http1` (an asyncio protocol feeding the Rust reader from
  `data_received`, the consumer woken only when ids are ready).

Only the client's share is measured: the server's other per-token work (parsing the
model's output, events, frames) is the same for all three.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable

import httpx
import orjson
import uvloop
from bench_upstream_stream import start_fake
from hotloop._core import ResponseReader
from hotloop.engines.http1 import Client, Origin
from hotloop.lab.proc import free_port

BODY = orjson.dumps({"model": "bench", "prompt": [1], "stream": True, "return_token_ids": True})
HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity"}

Reader = Callable[[str], Awaitable[int]]


def body_reader() -> ResponseReader:
    """A Rust reader past the head: what httpx hands over is the body alone."""
    reader = ResponseReader("vllm")
    reader.feed(b"HTTP/1.1 200 OK\r\n\r\n")
    return reader


async def with_httpx(url: str, client: httpx.AsyncClient) -> int:
    tokens = 0
    async with client.stream("POST", url + "/v1/completions", content=BODY, headers=HEADERS) as r:
        reader = body_reader()
        async for data in r.aiter_raw():
            ids, _ = reader.feed(data)
            tokens += len(ids)
    return tokens


async def with_streams(url: str) -> int:
    origin = Origin.from_url(url)
    stream_reader, writer = await asyncio.open_connection(origin.host, origin.port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (origin.authority.encode(), len(BODY), BODY)
    )
    reader = ResponseReader("vllm")
    tokens = 0
    while not reader.complete:
        data = await stream_reader.read(65536)
        if not data:
            break
        ids, _ = reader.feed(data)
        tokens += len(ids)
    writer.close()
    return tokens


async def with_protocol(url: str, client: Client) -> int:
    origin = Origin.from_url(url)
    link = await client.send(origin, "POST", "/v1/completions", HEADERS, BODY, stream="vllm")
    reader = link.reader
    assert reader is not None
    tokens = 0
    try:
        while not reader.complete:
            batch = await link.next()
            if batch is not None:
                tokens += len(batch)
    finally:
        client.done(origin, link)
    return tokens


async def run(option: str, url: str, streams: int, turns: int) -> tuple[float, int]:
    """CPU seconds of this process and tokens received, `streams` x `turns` streams."""
    http = httpx.AsyncClient(timeout=60)
    lean = Client(headers={}, connect_timeout=5, read_timeout=60, max_connections=256)
    read: Reader = {
        "httpx": lambda u: with_httpx(u, http),
        "streams": with_streams,
        "protocol": lambda u: with_protocol(u, lean),
    }[option]

    async def one() -> int:
        return sum([await read(url) for _ in range(turns)])

    await asyncio.gather(*(read(url) for _ in range(streams)))  # warm: connections, imports
    cpu = time.process_time()
    tokens = sum(await asyncio.gather(*(one() for _ in range(streams))))
    cpu = time.process_time() - cpu
    await http.aclose()
    lean.close()
    return cpu, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--per-event", type=int, default=1)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    fake = start_fake(port, args.rate, args.per_event)
    url = f"http://127.0.0.1:{port}"
    try:
        print(
            f"{args.streams} streams at {args.rate:.0f} tokens/s, {args.per_event} tokens/event,"
            f" medians of {args.rounds}; load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        results: dict[str, float] = {}
        for option in ("httpx", "streams", "protocol"):
            rounds = []
            for _ in range(args.rounds):
                cpu, tokens = uvloop.run(run(option, url, args.streams, args.turns))
                rounds.append(cpu / tokens * 1e6)
            results[option] = statistics.median(rounds)
        for option, us in results.items():
            print(
                f"  {option:9s} {us:6.2f} us/token = {us / results['protocol']:.2f}x protocol,"
                f" load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    finally:
        fake.kill()
        fake.wait()


if __name__ == "__main__":
    main()
