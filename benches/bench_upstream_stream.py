"""Server CPU per streamed token in front of a paced vLLM, beside the sim path, in one run:

    .venv/bin/python benches/bench_upstream_stream.py [--streams 8] [--rate 1000] [--rounds 3]
        [--baseline /path/to/other/.venv/bin/python]

Three processes: a paced fake vLLM (this file with `--fake-vllm`: `POST /v1/completions`
with `return_token_ids`, streaming `--rate` tokens/s per request, `N` tokens per SSE event,
HTTP/1.1 keep-alive, chunked), `hotloop serve` (`--engine upstream --upstream-dialect vllm`
in front of it, or `--engine sim` at the same rate), and the WebSocket clients (this
process: `--streams` connections, each running turns back to back).

Reported per configuration, medians over `--rounds`: the server process's CPU per streamed
token (its CPU clock, all threads), the server's own sampled figure from /metrics
(`hotloop_stream_sampled_cpu_seconds_total / _tokens_total`: batch in to frames written),
the aggregate tokens/s achieved, the upstream/sim ratio, and the load average beside each
figure (the machine is shared: compare figures within one run only). With `--baseline`,
every configuration also runs on another installation's hotloop (that interpreter's
`-m hotloop.cli`, say a checkout of the previous version), right after ours: before/after
in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import orjson
import uvloop
from hotloop.bench.proc import HOTLOOP, ServerProcess, free_port
from websockets.asyncio.client import connect

TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}
TURN_SECONDS = 1.0


def answer_ids(tokens: int) -> list[int]:
    """The ids of a harmony final answer of about `tokens` tokens (what the sim sends)."""
    from hotloop._core import ChatFormat

    return list(ChatFormat.harmony().completion_tokens(text="word " * tokens))


async def fake_vllm(port: int, rate: float, per_event: int, tokens: int) -> None:
    """Serve paced vLLM completions on 127.0.0.1:`port` until killed."""
    ids = answer_ids(tokens)
    step = per_event / rate

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                request = orjson.loads(await reader.readexactly(length)) if length else {}
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                reply = ids[: request.get("max_tokens") or len(ids)]
                start = time.monotonic()
                for n, at in enumerate(range(0, len(reply), per_event)):
                    batch = reply[at : at + per_event]
                    last = at + per_event >= len(reply)
                    choice = {
                        "index": 0,
                        "text": "",
                        "logprobs": None,
                        "finish_reason": "stop" if last else None,
                        "stop_reason": None,
                        "token_ids": batch,
                    }
                    event = {
                        "id": "cmpl-bench",
                        "object": "text_completion",
                        "created": 0,
                        "model": "bench",
                        "choices": [choice],
                    }
                    data = b"data: " + orjson.dumps(event) + b"\n\n"
                    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                    await writer.drain()
                    # Absolute schedule: a late wake-up does not slow the whole stream.
                    delay = start + (n + 1) * step - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                done = b"data: [DONE]\n\n"
                writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


class Run:
    """One `hotloop serve` configuration and `streams` WebSocket clients of it."""

    def __init__(self, name: str, flags: list[str], streams: int, command: tuple[str, ...]) -> None:
        self.name = name
        self.streams = streams
        self.server = ServerProcess.start(flags, command=command)

    def sampled(self) -> tuple[float, float]:
        values = self.server.metrics("hotloop_stream")
        return (
            values["hotloop_stream_sampled_cpu_seconds_total"],
            values["hotloop_stream_sampled_tokens_total"],
        )

    async def _client(self, turns: int) -> int:
        tokens = 0
        async with connect(self.server.ws_url, max_size=None) as ws:
            for _ in range(turns):
                event = {"type": "response.create", "input": "go", "store": False}
                await ws.send(orjson.dumps(event).decode())
                while True:
                    frame: dict[str, Any] = orjson.loads(await ws.recv())
                    if frame["type"] in TERMINAL:
                        if frame["type"] not in ("response.completed", "response.incomplete"):
                            raise RuntimeError(f"{self.name}: {frame}")
                        tokens += frame["response"]["usage"]["output_tokens"]
                        break
        return tokens

    async def _clients(self, turns: int) -> int:
        counts = await asyncio.gather(*(self._client(turns) for _ in range(self.streams)))
        return sum(counts)

    def measure(self, turns: int) -> tuple[float, float, float, float]:
        """Whole-process CPU us/token, sampled us/token, tokens/s, load average."""
        sampled0, sampled_tokens0 = self.sampled()
        cpu0, wall0 = self.server.cpu_ns(), time.perf_counter()
        tokens = uvloop.run(self._clients(turns))
        cpu1, wall1 = self.server.cpu_ns(), time.perf_counter()
        sampled1, sampled_tokens1 = self.sampled()
        return (
            (cpu1 - cpu0) / 1e3 / tokens,
            (sampled1 - sampled0) / (sampled_tokens1 - sampled_tokens0) * 1e6,
            tokens / (wall1 - wall0),
            os.getloadavg()[0],
        )

    def close(self) -> None:
        self.server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--rate", type=float, default=1000.0, help="tokens/s per stream")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=2, help="turns per stream per round")
    parser.add_argument("--baseline", metavar="PYTHON", help="also run this hotloop")
    parser.add_argument("--fake-vllm", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--per-event", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    tokens = int(args.rate * TURN_SECONDS)
    if args.fake_vllm:
        uvloop.run(fake_vllm(args.fake_vllm, args.rate, args.per_event, tokens))
        return
    print(
        f"{args.streams} streams at {args.rate:.0f} tokens/s, {args.turns} turns of ~{tokens}"
        f" tokens each per round, medians of {args.rounds}; load average at start "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    sim_flags = ["--engine", "sim", "--sim-ttft", "0", "--sim-tokens-per-second"]
    configs: list[tuple[str, list[str], int | None]] = [
        ("sim", [*sim_flags, str(args.rate), "--sim-text", "word " * tokens], None),
        ("upstream vllm, 1 token/event", [], 1),
        ("upstream vllm, 4 tokens/event", [], 4),
    ]
    installs = [("", HOTLOOP)]
    if args.baseline:
        installs.append((" [baseline]", (args.baseline, "-m", "hotloop.cli")))
    sim_us: dict[str, float] = {}
    for name, flags, per_event in configs:
        for label, command in installs:
            whole, sampled, rate, load = measure(args, name, flags, per_event, command)
            sim_us.setdefault(label, whole)
            ratio = "" if per_event is None else f" = {whole / sim_us[label]:.2f}x sim"
            print(
                f"  {name + label:40s} whole process {whole:7.2f} us/token{ratio}, server's own"
                f" (sampled) {sampled:6.2f} us/token, {rate:6.0f} tokens/s, load average"
                f" {load:.1f}"
            )


def measure(
    args: argparse.Namespace,
    name: str,
    flags: list[str],
    per_event: int | None,
    command: tuple[str, ...],
) -> list[float]:
    """Medians over the rounds of one configuration (see `Run.measure`)."""
    fake = None
    if per_event is not None:
        port = free_port()
        pacing = ["--rate", str(args.rate), "--per-event", str(per_event)]
        fake = subprocess.Popen([sys.executable, __file__, "--fake-vllm", str(port), *pacing])
        flags = ["--engine", "upstream", "--upstream-dialect", "vllm"]
        flags += ["--upstream-replicas", f"http://127.0.0.1:{port}"]
        flags += ["--upstream-served-model", "bench"]
    try:
        run = Run(name, flags, args.streams, command)
        try:
            run.measure(1)  # warm: imports, first allocations, pooled connections
            rounds = [run.measure(args.turns) for _ in range(args.rounds)]
        finally:
            run.close()
    finally:
        if fake is not None:
            fake.kill()
            fake.wait()
    return [statistics.median(r[i] for r in rounds) for i in range(4)]


if __name__ == "__main__":
    main()
