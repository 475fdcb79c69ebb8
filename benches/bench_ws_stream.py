"""Server CPU per streamed token in WebSocket mode, in one run:

    .venv/bin/python benches/bench_ws_stream.py [--tokens 6000] [--rounds 5]

1. Our path alone, in process: the protocol state machine, the Rust output parser, event
   serialisation and the socket's sends, with a no-op ASGI `send` and an engine that
   hands over one token (or a batch of four) per event-loop step; then four per 1 ms
   timer wake-up, minus that pacing alone: the same code starting from cold caches.
2. The simulated engine's pacing alone, in process: `SimSession.generate` at 1,000,
   4,000 and 8,000 tokens/s with a consumer that does nothing. Each batch is one timer wake-up
   of the event loop (epoll, the timer, the generator); that is engine cost, which a
   real engine pays in its own thread or process.
3. The whole server (`hotloop serve --engine sim` in its own process, a WebSocket client
   in this one): the server process's CPU per streamed token at the same rates, from
   its CPU clock (the user share from /proc). This adds uvicorn's frame encoding, the
   kernel's TCP send and (2) to (1).
4. The server's own streaming path, measured inside the server: its sampled thread-CPU
   clock around every 8th engine batch, from the batch's ids to its frames written
   (output parser, events, frames, the write system call), read from /metrics
   (`hotloop_stream_sampled_*`, see `hotloop.metrics.StreamCpu`). No subtraction. The
   same samples give the thread's CPU between the previous batch's frames written and
   the batch's arrival: the engine's hand-over (the loop waking for the batch, the
   sim's own pacing code), measured where it runs instead of in another process.
5. The kernel's part of a frame: the CPU one `send` of a delta frame costs the sending
   thread over loopback TCP, one send per millisecond as the server sends one frame per
   wake-up (on loopback the client's TCP receive runs inside the sender's call too).

Reported: medians over `--rounds` of microseconds of CPU per token, frames per token
(one batch's deltas of one item go out as one frame), the server's own cost both ways,
(3) minus (2) and (4), per token as a ratio of the 10 us budget and per frame.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import uvloop
from hotloop._core import ChatFormat, Conversation, Prompt, parse_request
from hotloop.engines.base import Sampling
from hotloop.engines.sim import SimEngine, SimScript, SimSpeed
from hotloop.lab.proc import ServerProcess
from hotloop.lab.scripted import ScriptedClient
from hotloop.protocol import CacheBudget, Connection, ConnectionCache
from hotloop.transport.asgi import Message
from hotloop.transport.websocket import Socket
from websockets.sync.client import connect

FORMAT = ChatFormat.harmony()
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}
BUDGET_US = 10.0
TURNS = 3
# A text delta frame as the server sends it at 4,000 tokens/s (about four tokens).
DELTA = (
    b'{"type":"response.output_text.delta","item_id":"msg_' + b"0" * 48 + b'",'
    b'"output_index":0,"content_index":0,"logprobs":[],"delta":" word word word word",'
    b'"sequence_number":1234}'
)
DELTA_FRAME = b"\x81\x7e" + len(DELTA).to_bytes(2, "big") + DELTA  # FIN, text, 16-bit length


class Steps:
    """An engine that yields `batch` ids per event-loop step, `pause` seconds apart (0:
    back to back, so the path stays in the CPU's caches)."""

    def __init__(self, ids: list[int], batch: int, pause: float = 0.0) -> None:
        self.ids = ids
        self.batch = batch
        self.pause = pause

    async def generate(
        self, prompt: Prompt, sampling: Sampling, route_key: str | None = None
    ) -> AsyncIterator[list[int]]:
        for at in range(0, len(self.ids), self.batch):
            yield self.ids[at : at + self.batch]
            await asyncio.sleep(self.pause)  # the engine's pacing, as in the sim

    async def close(self) -> None:
        """Nothing to release."""


def go_prompt() -> Prompt:
    """The prompt of a first turn that says "go"."""
    conversation = Conversation(FORMAT, context_window=1 << 22)
    conversation.extend(parse_request('{"model":"sim","input":"go"}'))
    return conversation.prompt()


async def steps_alone(ids: list[int], batch: int, pause: float) -> float:
    """CPU microseconds per token of `Steps` with a consumer that does nothing."""
    start = time.process_time()
    async for _ in Steps(ids, batch, pause).generate(go_prompt(), Sampling(0)):
        pass
    return (time.process_time() - start) / len(ids) * 1e6


async def in_process(
    ids: list[int], batch: int, pause: float = 0.0, way: str = "text"
) -> tuple[float, float]:
    """CPU microseconds per token and frames per token of our own path (with `Steps`'
    own cost). `way`: how frames leave the Socket: `text` (plain `websocket.send`),
    `message` (hotloop's `send_frames` extension, each batch's frames an awaited
    message) or `write` (its plain writer); the server's side of each does nothing."""
    connection = Connection(
        chat_format=FORMAT,
        context_window=1 << 22,
        model="sim",
        cache=ConnectionCache(1 << 30, CacheBudget(1 << 30)),
    )
    client = ScriptedClient(
        orjson.dumps({"type": "response.create", "model": "sim", "input": "go"}).decode()
    )
    frames = 0

    def went_out(payloads: list[bytes]) -> bool:
        nonlocal frames
        frames += 1
        if b'"response.completed"' in payloads[-1]:
            client.finish()
        return True

    async def send(message: Message) -> None:
        went_out(message.get("frames") or [message.get("text", "").encode()])

    socket_ = Socket(
        connection,
        Steps(ids, batch, pause),
        send,
        high_water=1 << 24,
        lifetime=3600,
        send_frames=way != "text",
        write_frames=went_out if way == "write" else None,
    )
    start = time.process_time()
    await socket_.run(client.receive)
    spent = time.process_time() - start
    return spent / len(ids) * 1e6, frames / len(ids)


async def pacing(tokens_per_second: float, words: int) -> tuple[float, float]:
    """CPU microseconds per token and tokens per wake-up of the sim's pacing alone."""
    sim = SimEngine(
        FORMAT,
        speed=SimSpeed(tokens_per_second=tokens_per_second, ttft=0.0),
        script=SimScript(text="word " * words),
    )
    tokens = wakes = 0
    start = time.process_time()
    async for ids in sim.session().generate(go_prompt(), Sampling(1 << 22)):
        tokens += len(ids)
        wakes += 1
    return (time.process_time() - start) / tokens * 1e6, tokens / wakes


def loopback_send(frame: bytes, sends: int) -> float:
    """CPU microseconds of the sending thread per `send` of `frame` on loopback TCP."""
    listener = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(listener.getsockname())
    sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    receiver, _ = listener.accept()

    def drain() -> None:
        while receiver.recv(1 << 16):
            pass

    reader = threading.Thread(target=drain)
    reader.start()
    spent = 0.0
    try:
        for _ in range(sends):
            time.sleep(0.001)  # pacing: one frame per engine wake-up, as the server sends
            start = time.thread_time()
            sender.send(frame)
            spent += time.thread_time() - start
    finally:
        sender.close()
        reader.join()
        receiver.close()
        listener.close()
    return spent / sends * 1e6


def process_cpu(pid: int) -> tuple[float, float, float]:
    """CPU seconds of a process, all its threads: user and system from /proc (in clock
    ticks of 10 ms), and their sum to the nanosecond from the process's CPU clock."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    # Linux's clock id for another process's CPU time: ~pid << 3 | CPUCLOCK_SCHED.
    cpu = time.clock_gettime((~pid << 3) | 2)
    return int(fields[11]) / tick, int(fields[12]) / tick, cpu


class Served:
    """`hotloop serve --engine sim` at one rate, and a WebSocket client of it."""

    def __init__(self, tokens_per_second: float, words: int, deflate: bool = False) -> None:
        """`deflate`: the server accepts permessage-deflate and the client offers it
        (benches/bench_ws_deflate.py); otherwise neither uses it."""
        self.server = ServerProcess.start(
            [
                "--engine",
                "sim",
                "--sim-ttft",
                "0",
                "--sim-tokens-per-second",
                str(tokens_per_second),
                "--sim-text",
                "word " * words,
                "--websocket-deflate" if deflate else "--no-websocket-deflate",
            ]
        )
        try:
            compression = "deflate" if deflate else None
            self.ws = connect(self.server.ws_url, max_size=None, compression=compression)
        except OSError:
            self.server.stop()
            raise
        first, _ = self._turn(None)  # warm: imports, first allocations
        self.previous: str = first["response"]["id"]

    def _turn(self, previous: str | None) -> tuple[dict[str, Any], int]:
        event: dict[str, Any] = {
            "type": "response.create",
            "model": "sim",
            "input": "go",
            "store": False,
        }
        if previous:
            event["previous_response_id"] = previous
        self.ws.send(orjson.dumps(event).decode())
        frames = 0
        while True:
            frame = orjson.loads(self.ws.recv())
            frames += 1
            if frame["type"] in TERMINAL:
                return frame, frames

    def sampled(self) -> tuple[float, float, float]:
        """The server's sampled streaming CPU seconds, CPU seconds between batches and
        tokens (`StreamCpu`)."""
        values = self.server.metrics("hotloop_stream")
        return (
            values["hotloop_stream_sampled_cpu_seconds_total"],
            values["hotloop_stream_sampled_between_cpu_seconds_total"],
            values["hotloop_stream_sampled_tokens_total"],
        )

    def measure(self) -> tuple[float, float, float, float, float, float]:
        """CPU microseconds per token, the share of it in user mode, frames per token,
        tokens/s, and the server's sampled microseconds per token: its own streaming
        path, and between batches (the engine's hand-over)."""
        pid = self.server.process.pid
        cpu_sampled0, between0, tokens_sampled0 = self.sampled()
        (user0, system0, cpu0), wall0 = process_cpu(pid), time.perf_counter()
        tokens = frames = 0
        for _ in range(TURNS):
            last, n = self._turn(self.previous)
            self.previous = last["response"]["id"]
            tokens += last["response"]["usage"]["output_tokens"]
            frames += n
        (user1, system1, cpu1), wall1 = process_cpu(pid), time.perf_counter()
        cpu_sampled1, between1, tokens_sampled1 = self.sampled()
        sampled_tokens = tokens_sampled1 - tokens_sampled0
        ticks = (user1 - user0) + (system1 - system0)
        return (
            (cpu1 - cpu0) / tokens * 1e6,
            (user1 - user0) / ticks if ticks else 1.0,
            frames / tokens,
            tokens / (wall1 - wall0),
            (cpu_sampled1 - cpu_sampled0) / sampled_tokens * 1e6,
            (between1 - between0) / sampled_tokens * 1e6,
        )

    def close(self) -> None:
        self.ws.close()
        self.server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=6000, help="tokens per in-process run")
    parser.add_argument("--rounds", type=int, default=5, help="measurements per figure")
    args = parser.parse_args()
    median = statistics.median
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; medians of {args.rounds}"
    )
    ids = FORMAT.completion_tokens(text="word " * args.tokens)
    print("our path, in process (no socket):")
    for batch in (1, 4):
        runs = [uvloop.run(in_process(ids, batch)) for _ in range(args.rounds)]
        us, frames = median(r[0] for r in runs), median(r[1] for r in runs)
        print(f"  {batch} token(s) per engine step: {us:6.2f} us/token, {frames:.2f} frames/token")
    # The frames extension both ways, rounds interleaved: what the plain writer saves.
    ways: dict[str, list[float]] = {"message": [], "write": []}
    for _ in range(args.rounds):
        for way, spent in ways.items():
            spent.append(uvloop.run(in_process(ids, 1, way=way))[0])
    print(
        "  1 token per engine step, send_frames: "
        + ", ".join(f"{way} {median(spent):6.2f} us/token" for way, spent in ways.items())
    )
    # The same path woken by a 1 ms timer per batch, as in the server: between wake-ups
    # other processes run, and the path starts from cold caches.
    cold = [
        uvloop.run(in_process(ids, 4, 0.001))[0] - uvloop.run(steps_alone(ids, 4, 0.001))
        for _ in range(args.rounds)
    ]
    print(
        f"  4 tokens per 1 ms timer wake-up, minus the pacing alone: {median(cold):6.2f} us/token"
    )
    print("whole server process (uvicorn websockets-sansio, uvloop, sim engine), per token:")
    # 8,000 tokens/s: about twice the tokens per wake-up and per frame as at 4,000.
    for rate in (1000.0, 4000.0, 8000.0):
        words = int(rate * 3 / 4)  # about 0.75 s per turn
        served = Served(rate, words)
        try:
            rounds = []
            for _ in range(args.rounds):
                rounds.append((*served.measure(), *uvloop.run(pacing(rate, words))))
        finally:
            served.close()
        total, user_share, frames, achieved, sampled, between, paced, per_wake = (
            median(r[i] for r in rounds) for i in range(8)
        )
        own = median(r[0] - r[6] for r in rounds)
        kernel = median(loopback_send(DELTA_FRAME, 1000) for _ in range(args.rounds))
        print(
            f"  {rate:6.0f} tokens/s (achieved {achieved:.0f}): {total:6.2f} us "
            f"({user_share:.0%} user), {frames:.2f} frames/token\n"
            f"    sim pacing alone (engine cost, {per_wake:.1f} tokens/wake-up): {paced:6.2f} us\n"
            f"    server's own (whole process minus pacing): {own:6.2f} us = "
            f"{own / BUDGET_US:.2f}x the {BUDGET_US:.0f} us budget ({own / frames:.1f} us/frame)\n"
            f"    server's own (sampled in the server, batch to frames written): {sampled:6.2f} us"
            f" = {sampled / BUDGET_US:.2f}x the budget ({sampled / frames:.1f} us/frame)\n"
            f"    between batches, in the server (the engine's hand-over and the sim's code):"
            f" {between:6.2f} us ({between / frames:.1f} us/frame)\n"
            f"    of which the kernel's loopback TCP send of a frame: {kernel:.1f} us per frame "
            f"= {kernel * frames:.2f} us"
        )


if __name__ == "__main__":
    main()
