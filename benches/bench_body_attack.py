"""Attacks through the request body, each against one `hotloop serve --engine sim`
process; each prints one JSON line.

Issue 21, defect 1: the unauthenticated outage. `hotloop serve --api-keys sk-a
--max-connections CAP`; CAP attackers with no key each send complete headers announcing a
megabyte, read the 401, send one more byte and hold the connection (reconnecting whenever
the server closes it), while a legitimate client asks `GET /health` on a new connection
every 20 ms. Prints how many of those were answered 200 (and what the others got).

    .venv/bin/python benches/bench_body_attack.py [SECONDS [CAP]]

Issue 39, item 1: compressed bodies of many tiny frames (`frames`). `--api-keys
sk-a,sk-b` (and any hotloop FLAGS, such as `--max-compressed-frames 100000000` to time
the decoding itself past the bound); `sk-a` posts a body of 20-byte gzip members, then
one of 9-byte empty zstd frames, of each size in MiB of SIZES (comma-separated; timed:
its status, seconds and the server's CPU seconds); then `sk-b` posts 100 KB requests
and a new connection asks `GET /health`, back to back for SECONDS quiet, then SECONDS
while `sk-a` posts the bytes of the first size's gzip body from `ATTACKERS` connections
back to back (a process of their own, so that the victim's figures are not the
attackers' GIL): uncompressed first (what uploading them costs), then as gzip. Prints
the times, and `sk-b`'s medians, maxima and their ratios to quiet.

    .venv/bin/python benches/bench_body_attack.py frames [SECONDS [SIZES [FLAGS...]]]
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import multiprocessing
import statistics
import sys
import threading
import time
from collections import Counter
from multiprocessing.synchronize import Event

import httpx
import zstandard
from hotloop.lab.proc import ServerProcess

SLOW_BODY = (
    b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000000\r\n\r\n{"
)
HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


async def attacker(port: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        writer = None
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(SLOW_BODY)
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b" ")
            ended = asyncio.ensure_future(reader.read())  # held until the server closes
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait((ended, stopped), return_when=asyncio.FIRST_COMPLETED)
            ended.cancel()
            stopped.cancel()
        except (OSError, asyncio.IncompleteReadError):
            await asyncio.sleep(0.01)  # refused: try again, as an attacker would
        finally:
            if writer is not None:
                writer.close()


async def health(port: int) -> str:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(HEALTH)
        reply = await reader.read()
        writer.close()
    except OSError as e:
        return type(e).__name__
    return reply.split(b" ", 2)[1].decode() if reply else "closed"


async def attack(port: int, seconds: float, cap: int) -> Counter[str]:
    stop = asyncio.Event()
    attackers = [asyncio.ensure_future(attacker(port, stop)) for _ in range(cap)]
    await asyncio.sleep(1.0)  # the attackers hold their places
    answers: Counter[str] = Counter()
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        answers[await asyncio.wait_for(health(port), 30)] += 1
        await asyncio.sleep(0.02)
    stop.set()
    for task in attackers:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return answers


ATTACKERS = 4
TINY_FRAMES = {"gzip": gzip.compress(b""), "zstd": zstandard.ZstdCompressor().compress(b"")}
VICTIM_BODY = json.dumps(
    {"model": "sim", "input": "word " * 20_000, "max_output_tokens": 4, "store": False}
).encode()


def tiny_frames(encoding: str, mib: float) -> bytes:
    frame = TINY_FRAMES[encoding]
    return frame * (int(mib * (1 << 20)) // len(frame))


def post_encoded(client: httpx.Client, body: bytes, encoding: str) -> httpx.Response:
    headers = {"content-encoding": encoding, "content-type": "application/json"}
    return client.post("/v1/responses", content=body, headers=headers)


def decode_times(server: ServerProcess, sizes: list[float]) -> list[dict[str, object]]:
    """`sk-a`'s body of each size and encoding: its status, error code, seconds and the
    server's CPU seconds (the figure to compare on a shared machine)."""
    rows: list[dict[str, object]] = []
    headers = {"authorization": "Bearer sk-a"}
    base = f"http://127.0.0.1:{server.port}"
    with httpx.Client(base_url=base, headers=headers, timeout=3600) as client:
        for mib in sizes:
            for encoding in TINY_FRAMES:
                cpu = server.cpu_ns()
                start = time.perf_counter()
                reply = post_encoded(client, tiny_frames(encoding, mib), encoding)
                seconds = time.perf_counter() - start
                cpu_seconds = (server.cpu_ns() - cpu) / 1e9
                code = reply.json().get("error", {}).get("code")
                row = {"encoding": encoding, "mib": mib, "status": reply.status_code, "code": code}
                times = {"seconds": round(seconds, 4), "cpu_seconds": round(cpu_seconds, 4)}
                rows.append({**row, **times})
    return rows


def frame_attacker(base: str, body: bytes, encoding: str, stop: Event) -> None:
    headers = {"authorization": "Bearer sk-a"}
    with httpx.Client(base_url=base, headers=headers, timeout=3600) as client:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                post_encoded(client, body, encoding)


def frame_attackers(base: str, body: bytes, encoding: str, stop: Event) -> None:
    threads = [
        threading.Thread(target=frame_attacker, args=(base, body, encoding, stop))
        for _ in range(ATTACKERS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def attacked(base: str, seconds: float, body: bytes, encoding: str) -> dict[str, float]:
    """`victim` while `sk-a` posts `body` from `ATTACKERS` connections back to back."""
    stop = multiprocessing.Event()
    attack = multiprocessing.Process(target=frame_attackers, args=(base, body, encoding, stop))
    attack.start()
    try:
        return victim(base, seconds)
    finally:
        stop.set()
        attack.join()


def victim(base: str, seconds: float) -> dict[str, float]:
    """`sk-b`'s 100 KB requests and `/health`, back to back: medians and maxima in ms."""
    posts: list[float] = []
    healths: list[float] = []
    headers = {"authorization": "Bearer sk-b", "content-type": "application/json"}
    with httpx.Client(base_url=base, headers=headers, timeout=3600) as client:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            client.post("/v1/responses", content=VICTIM_BODY).raise_for_status()
            posts.append(time.perf_counter() - start)
            start = time.perf_counter()
            # A new connection each time, as a load balancer's check opens one.
            httpx.get(f"{base}/health", timeout=3600).raise_for_status()
            healths.append(time.perf_counter() - start)
    return {
        "post_p50_ms": round(statistics.median(posts) * 1000, 2),
        "post_max_ms": round(max(posts) * 1000, 2),
        "health_p50_ms": round(statistics.median(healths) * 1000, 2),
        "health_max_ms": round(max(healths) * 1000, 2),
        "requests": len(posts),
    }


def frames(seconds: float, sizes: list[float], flags: list[str]) -> dict[str, object]:
    """The decode times, then `sk-b` quiet, while `sk-a` uploads the first size's bytes
    uncompressed (`identity`: what any body of that size costs, refused at its first
    byte) and while it posts them as gzip (last: before the fix, decodes outlived it)."""
    server_flags = ["--engine", "sim", "--api-keys", "sk-a,sk-b", *flags]
    body = tiny_frames("gzip", sizes[0])
    with ServerProcess.start(server_flags) as server:
        base = f"http://127.0.0.1:{server.port}"
        decoded = decode_times(server, sizes)
        victim(base, 0.1)  # the first request warms the server up: not a quiet one
        quiet = victim(base, seconds)
        uploading = attacked(base, seconds, body, "identity")
        decoding = attacked(base, seconds, body, "gzip")
    return {
        "flags": flags,
        "decode": decoded,
        "attackers": ATTACKERS,
        "attack_mib": sizes[0],
        "quiet": quiet,
        "uploading": uploading,
        "decoding": decoding,
        "uploading_post_p50_ratio": round(uploading["post_p50_ms"] / quiet["post_p50_ms"], 2),
        "decoding_post_p50_ratio": round(decoding["post_p50_ms"] / quiet["post_p50_ms"], 2),
    }


def main() -> None:
    if sys.argv[1:2] == ["frames"]:
        seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
        sizes = [float(size) for size in (sys.argv[3] if len(sys.argv) > 3 else "1,2,4").split(",")]
        print(json.dumps(frames(seconds, sizes, sys.argv[4:])))
        return
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    cap = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    flags = ["--engine", "sim", "--api-keys", "sk-a", "--max-connections", str(cap)]
    with ServerProcess.start(flags) as server:
        answers = asyncio.run(attack(server.port, seconds, cap))
    total = sum(answers.values())
    row = {"cap": cap, "seconds": seconds, "health_200": answers["200"], "health_total": total}
    print(json.dumps({**row, "answers": dict(answers)}))


if __name__ == "__main__":
    main()
