"""Server CPU per streamed token in WebSocket mode, in one run:

    .venv/bin/python benches/bench_ws_stream.py [--tokens 6000]

1. Our path alone, in process: the protocol state machine, the Rust output parser, event
   serialisation and the socket driver's dispatch, with a no-op ASGI `send` and an
   engine that hands over one token (or a batch of four) per event-loop step.
2. The whole server (`hotloop serve --engine sim` in its own process, a WebSocket client
   in this one): the server process's CPU time per streamed token at 1,000 and 4,000
   tokens/s, read from /proc. This adds uvicorn's frame encoding, the kernel's TCP send
   and the simulated engine's own timers to (1).

Reported: microseconds of CPU per token, and frames per token (one batch's deltas of
one item go out as one frame).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import uvloop
from hotloop._core import ChatFormat, Prompt
from hotloop.engines.base import Sampling
from hotloop.protocol import CacheBudget, Connection, ConnectionCache
from hotloop.transport.asgi import Message
from hotloop.transport.websocket import Socket
from websockets.sync.client import connect

FORMAT = ChatFormat.harmony()
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


class Steps:
    """An engine that yields `batch` ids per event-loop step, with no pacing."""

    def __init__(self, ids: list[int], batch: int) -> None:
        self.ids = ids
        self.batch = batch

    async def generate(self, prompt: Prompt, sampling: Sampling) -> AsyncIterator[list[int]]:
        for at in range(0, len(self.ids), self.batch):
            yield self.ids[at : at + self.batch]
            await asyncio.sleep(0)

    async def close(self) -> None:
        """Nothing to release."""


async def in_process(ids: list[int], batch: int) -> tuple[float, float]:
    """CPU microseconds per token and frames per token of our own path."""
    connection = Connection(
        chat_format=FORMAT,
        context_window=1 << 22,
        model="sim",
        cache=ConnectionCache(1 << 30, CacheBudget(1 << 30)),
    )
    done = asyncio.Event()
    frames = 0

    async def send(message: Message) -> None:
        nonlocal frames
        frames += 1
        if '"response.completed"' in message.get("text", ""):
            done.set()

    pending = [orjson.dumps({"type": "response.create", "input": "go"}).decode()]

    async def receive() -> Message:
        if pending:
            return {"type": "websocket.receive", "text": pending.pop()}
        await done.wait()
        return {"type": "websocket.disconnect", "code": 1000}

    socket_ = Socket(connection, Steps(ids, batch), send, high_water=1 << 24, lifetime=3600)
    start = time.process_time()
    await socket_.run(receive)
    spent = time.process_time() - start
    return spent / len(ids) * 1e6, frames / len(ids)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def process_cpu(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def served(tokens_per_second: float, words: int) -> tuple[float, float, float]:
    """Server CPU microseconds per token, frames per token, achieved tokens/s."""
    port = free_port()
    env = {
        **os.environ,
        "HOTLOOP_ENGINE": "sim",
        "HOTLOOP_PORT": str(port),
        "HOTLOOP_LOG_LEVEL": "warning",
        "HOTLOOP_DATA_DIR": f"/tmp/hotloop-bench-{port}",
        "HOTLOOP_SIM_TTFT": "0",
        "HOTLOOP_SIM_TOKENS_PER_SECOND": str(tokens_per_second),
        "HOTLOOP_SIM_TEXT": "word " * words,
    }
    server = subprocess.Popen([sys.executable, "-m", "hotloop.cli", "serve"], env=env)
    try:
        ws = None
        deadline = time.monotonic() + 60
        while ws is None:
            try:
                ws = connect(f"ws://127.0.0.1:{port}/v1/responses", max_size=None)
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.1)  # the server process is starting; nothing to wait on

        def turn(previous: str | None) -> tuple[dict[str, Any], int]:
            event: dict[str, Any] = {"type": "response.create", "input": "go", "store": False}
            if previous:
                event["previous_response_id"] = previous
            ws.send(orjson.dumps(event).decode())
            frames = 0
            while True:
                frame = orjson.loads(ws.recv())
                frames += 1
                if frame["type"] in TERMINAL:
                    return frame, frames

        first, _ = turn(None)  # warm: imports, first allocations
        previous = first["response"]["id"]
        cpu0, wall0 = process_cpu(server.pid), time.perf_counter()
        tokens = frames = 0
        for _ in range(3):
            last, n = turn(previous)
            previous = last["response"]["id"]
            tokens += last["response"]["usage"]["output_tokens"]
            frames += n
        cpu1, wall1 = process_cpu(server.pid), time.perf_counter()
        ws.close()
        return (cpu1 - cpu0) / tokens * 1e6, frames / tokens, tokens / (wall1 - wall0)
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=6000, help="tokens per in-process run")
    args = parser.parse_args()
    ids = FORMAT.completion_tokens(text="word " * args.tokens)
    print("our path, in process (no socket):")
    for batch in (1, 4):
        us, frames = uvloop.run(in_process(ids, batch))
        print(f"  {batch} token(s) per engine step: {us:6.2f} us/token, {frames:.2f} frames/token")
    print("whole server process (uvicorn websockets-sansio, uvloop, sim engine):")
    for rate, words in ((1000.0, 1000), (4000.0, 3000)):
        us, frames, achieved = served(rate, words)
        print(
            f"  {rate:6.0f} tokens/s: {us:6.2f} us/token, {frames:.2f} frames/token "
            f"(achieved {achieved:.0f} tokens/s)"
        )


if __name__ == "__main__":
    main()
