"""Server CPU per streamed token in front of a paced vLLM, beside the sim path, in one run,
and the latency hotloop adds on the way:

    .venv/bin/python benches/bench_upstream_stream.py [--streams 8,64] [--rate 1000]
        [--rounds 3] [--coalesce-ms 1,2,5] [--ramp 8,16,32,64]
        [--baseline NAME=/path/to/other/.venv/bin/python ...]

Three processes: a paced fake vLLM (this file with `--fake-vllm`: `POST /v1/completions`
with `return_token_ids`, HTTP/1.1 keep-alive, chunked; like vLLM's batched decode, one
clock steps every running request at once, `N` tokens per SSE event every `N / rate`
seconds), `hotloop serve` (`--engine upstream --upstream-dialect vllm` in front of it,
or `--engine sim` at the same rate), and the WebSocket clients (this process: `streams`
connections, each running turns back to back).

Reported per configuration, medians over `--rounds`: the server process's CPU per streamed
token (its CPU clock, all threads), the server's own sampled figure from /metrics
(`hotloop_stream_sampled_cpu_seconds_total / _tokens_total`: batch in to frames written),
the aggregate tokens/s achieved, the upstream/sim ratio, and the load average beside each
figure (the machine is shared: compare figures within one run only).

For the upstream path also the latency hotloop adds (all rounds pooled): the fake vLLM
records when each request arrived and when it wrote each event (CLOCK_MONOTONIC, shared by
the processes); a client records when it sent `response.create` and when each delta
arrived. Per token: delta received minus its event written (p50/p99, includes the
clients' own delay: on a loaded machine an upper bound). Per turn, hotloop's time to
first token: (request arrived upstream - request sent) + (first delta received - its
event written), i.e. the client's time to first token minus the upstream's own.

`--coalesce-ms`: the upstream 1 token/event configuration again with
`--stream-coalesce-ms` at each value. `--ramp`: the upstream 1 token/event path at each
stream count in turn, until the added p99 per-token delay passes 5 ms (how many tokens/s
one hotloop process carries). With `--baseline` (repeatable), every configuration but the
coalescing ones also runs on other installations' hotloop (that interpreter's
`-m hotloop.cli`, labelled NAME), right after ours.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvloop
from hotloop.lab.proc import HOTLOOP, ServerProcess, free_port
from websockets.asyncio.client import connect

TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}
TURN_SECONDS = 1.0
WORD = "word"
LAG_LIMIT_MS = 5.0


def answer_ids(tokens: int) -> list[int]:
    """The ids of a harmony final answer of about `tokens` tokens (what the sim sends)."""
    from hotloop._core import ChatFormat

    return list(ChatFormat.harmony().completion_tokens(text=f"{WORD} " * tokens))


def words_through(ids: list[int]) -> list[int]:
    """For each token of the answer, how many words the text holds up to and with it."""
    from hotloop._core import ChatFormat

    tokenizer = ChatFormat.harmony().tokenizer
    counts, total = [], 0
    for token in ids:
        total += tokenizer.decode([token]).count(WORD)
        counts.append(total)
    return counts


# ---------------------------------------------------------------- the fake vLLM


@dataclass
class PacedStream:
    """One streamed completion: its framed events, the next one to write, and when each
    was written."""

    writer: asyncio.StreamWriter
    events: list[bytes]
    arrived: float
    written: list[float] = field(default_factory=list)
    finished: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


def framed_events(ids: list[int], per_event: int) -> list[bytes]:
    """vLLM's completion chunks for `ids`, `per_event` ids each, chunk-framed; the last one
    also carries `[DONE]` and the body's end."""
    out = []
    for at in range(0, len(ids), per_event):
        last = at + per_event >= len(ids)
        choice = {
            "index": 0,
            "text": "",
            "logprobs": None,
            "finish_reason": "stop" if last else None,
            "stop_reason": None,
            "token_ids": ids[at : at + per_event],
        }
        event = {
            "id": "cmpl-bench",
            "object": "text_completion",
            "created": 0,
            "model": "bench",
            "choices": [choice],
        }
        data = b"data: " + orjson.dumps(event) + b"\n\n"
        if last:
            data += b"data: [DONE]\n\n"
        framed = b"%x\r\n%s\r\n" % (len(data), data)
        out.append(framed + b"0\r\n\r\n" if last else framed)
    return out


async def fake_vllm(port: int, rate: float, per_event: int, tokens: int) -> None:
    """Serve paced vLLM completions on 127.0.0.1:`port` until killed; `GET /timings`
    answers (and forgets) what was recorded, by `x-session-id`."""
    ids = answer_ids(tokens)
    step = per_event / rate
    events: dict[int, list[bytes]] = {}
    running: list[PacedStream] = []
    records: dict[str, tuple[float, list[float]]] = {}

    async def clock() -> None:
        start = time.monotonic()
        tick = 0
        while True:
            # Absolute schedule; a late step is late, not followed by a burst.
            tick = max(tick + 1, int((time.monotonic() - start) / step))
            delay = start + tick * step - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            now = time.monotonic()
            for stream in list(running):
                stream.writer.write(stream.events[len(stream.written)])
                stream.written.append(now)
                if len(stream.written) == len(stream.events):
                    running.remove(stream)
                    stream.finished.set_result(None)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                arrived = time.monotonic()
                length, session = 0, ""
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"x-session-id":
                        session = value.strip().decode()
                body = await reader.readexactly(length) if length else b""
                if head.startswith(b"GET /timings"):
                    reply = orjson.dumps(records)
                    records.clear()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(reply), reply)
                    )
                    continue
                request = orjson.loads(body)
                count = request.get("max_tokens") or len(ids)
                if count not in events:
                    events[count] = framed_events(ids[:count], per_event)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                stream = PacedStream(writer, events[count], arrived)
                running.append(stream)
                await stream.finished
                records[session] = (stream.arrived, stream.written)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    ticking = asyncio.create_task(clock())
    print("listening", flush=True)  # what `start_fake` waits for
    async with server:
        await server.serve_forever()
    ticking.cancel()


def start_fake(port: int, rate: float, per_event: int) -> subprocess.Popen[str]:
    """The fake vLLM in its own process, once it accepts connections."""
    pacing = ["--rate", str(rate), "--fake-per-event", str(per_event)]
    fake = subprocess.Popen(
        [sys.executable, __file__, "--fake-vllm", str(port), *pacing],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert fake.stdout is not None
    if fake.stdout.readline().strip() != "listening":
        fake.kill()
        raise RuntimeError("the fake vLLM did not start")
    return fake


# ---------------------------------------------------------------- clients and figures


@dataclass
class Turn:
    response_id: str
    sent: float
    deltas: list[tuple[float, int]]
    """(received, words so far) per delta event."""
    tokens: int


@dataclass
class Figures:
    whole_us: float
    sampled_us: float
    tokens_per_s: float
    load: float
    lag_ms: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Run:
    """One `hotloop serve` configuration and `streams` WebSocket clients of it."""

    def __init__(
        self,
        name: str,
        flags: list[str],
        streams: int,
        command: tuple[str, ...],
        fake_port: int | None,
        per_event: int,
        words: list[int],
    ) -> None:
        self.name = name
        self.streams = streams
        self.fake_port = fake_port
        self.per_event = per_event
        self.words = words
        self.server = ServerProcess.start(flags, command=command)

    def sampled(self) -> tuple[float, float]:
        values = self.server.metrics("hotloop_stream")
        return (
            values["hotloop_stream_sampled_cpu_seconds_total"],
            values["hotloop_stream_sampled_tokens_total"],
        )

    async def _client(self, turns: int, out: list[Turn]) -> None:
        async with connect(self.server.ws_url, max_size=None) as ws:
            for _ in range(turns):
                event = {"type": "response.create", "model": "sim", "input": "go", "store": False}
                sent = time.monotonic()
                await ws.send(orjson.dumps(event).decode())
                turn = Turn("", sent, [], 0)
                words = 0
                while True:
                    frame: dict[str, Any] = orjson.loads(await ws.recv())
                    kind = frame["type"]
                    if kind == "response.output_text.delta":
                        words += frame["delta"].count(WORD)
                        turn.deltas.append((time.monotonic(), words))
                    elif kind == "response.created":
                        turn.response_id = frame["response"]["id"]
                    elif kind in TERMINAL:
                        if kind not in ("response.completed", "response.incomplete"):
                            raise RuntimeError(f"{self.name}: {frame}")
                        turn.tokens = frame["response"]["usage"]["output_tokens"]
                        break
                out.append(turn)

    async def _clients(self, turns: int) -> list[Turn]:
        out: list[Turn] = []
        await asyncio.gather(*(self._client(turns, out) for _ in range(self.streams)))
        return out

    def measure(self, turns: int) -> Figures:
        sampled0, sampled_tokens0 = self.sampled()
        cpu0, wall0 = self.server.cpu_ns(), time.perf_counter()
        done = uvloop.run(self._clients(turns))
        cpu1, wall1 = self.server.cpu_ns(), time.perf_counter()
        sampled1, sampled_tokens1 = self.sampled()
        tokens = sum(t.tokens for t in done)
        figures = Figures(
            (cpu1 - cpu0) / 1e3 / tokens,
            (sampled1 - sampled0) / (sampled_tokens1 - sampled_tokens0) * 1e6,
            tokens / (wall1 - wall0),
            os.getloadavg()[0],
        )
        if self.fake_port is not None:
            self._latencies(done, figures)
        return figures

    def _latencies(self, turns: list[Turn], figures: Figures) -> None:
        url = f"http://127.0.0.1:{self.fake_port}/timings"
        with urllib.request.urlopen(url) as reply:
            records: dict[str, tuple[float, list[float]]] = orjson.loads(reply.read())
        for turn in turns:
            if turn.response_id not in records or not turn.deltas:
                continue
            arrived, written = records[turn.response_id]
            for n, (received, words) in enumerate(turn.deltas):
                token = bisect.bisect_left(self.words, words)  # the delta's last word
                lag = received - written[min(token // self.per_event, len(written) - 1)]
                figures.lag_ms.append(lag * 1e3)
                if n == 0:
                    figures.ttft_ms.append((arrived - turn.sent + lag) * 1e3)

    def close(self) -> None:
        self.server.stop()


@dataclass
class Config:
    name: str
    streams: int
    per_event: int | None
    """None: the sim."""
    flags: list[str] = field(default_factory=list)


def measure(
    args: argparse.Namespace, config: Config, command: tuple[str, ...], words: list[int]
) -> Figures:
    """One configuration: medians of the CPU figures over the rounds, latencies pooled."""
    fake, port = None, None
    tokens = int(args.rate * TURN_SECONDS)
    flags = config.flags
    if config.per_event is None:
        sim = ["--engine", "sim", "--sim-ttft", "0", "--sim-tokens-per-second", str(args.rate)]
        flags = [*sim, "--sim-text", f"{WORD} " * tokens, *flags]
    else:
        port = free_port()
        fake = start_fake(port, args.rate, config.per_event)
        flags = ["--engine", "upstream", "--upstream-dialect", "vllm", *flags]
        flags += ["--upstream-replicas", f"http://127.0.0.1:{port}"]
        flags += ["--upstream-served-model", "bench"]
    try:
        run = Run(config.name, flags, config.streams, command, port, config.per_event or 1, words)
        try:
            run.measure(1)  # warm: imports, first allocations, pooled connections
            rounds = [run.measure(args.turns) for _ in range(args.rounds)]
        finally:
            run.close()
    finally:
        if fake is not None:
            fake.kill()
            fake.wait()
    return Figures(
        statistics.median(r.whole_us for r in rounds),
        statistics.median(r.sampled_us for r in rounds),
        statistics.median(r.tokens_per_s for r in rounds),
        statistics.median(r.load for r in rounds),
        [lag for r in rounds for lag in r.lag_ms],
        [ttft for r in rounds for ttft in r.ttft_ms],
    )


def report(name: str, figures: Figures, sim_us: float | None) -> None:
    ratio = "" if sim_us is None else f" = {figures.whole_us / sim_us:.2f}x sim"
    line = (
        f"  {name:44s} whole process {figures.whole_us:6.2f} us/token{ratio}, server's own"
        f" (sampled) {figures.sampled_us:6.2f}, {figures.tokens_per_s:6.0f} tokens/s"
    )
    if figures.lag_ms:
        line += (
            f", added per token p50/p99 {percentile(figures.lag_ms, 0.5):.2f}/"
            f"{percentile(figures.lag_ms, 0.99):.2f} ms, added TTFT p50/p99"
            f" {percentile(figures.ttft_ms, 0.5):.2f}/{percentile(figures.ttft_ms, 0.99):.2f} ms"
        )
    print(f"{line}, load {figures.load:.1f}", flush=True)


def numbers(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="8", help="comma-separated stream counts")
    parser.add_argument("--rate", type=float, default=1000.0, help="tokens/s per stream")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=2, help="turns per stream per round")
    parser.add_argument("--per-event", default="1,4", help="comma-separated tokens per event")
    parser.add_argument("--coalesce-ms", default="", help="comma-separated windows to try")
    parser.add_argument("--ramp", default="", help="comma-separated stream counts to ramp")
    parser.add_argument(
        "--baseline", metavar="NAME=PYTHON", action="append", default=[], help="also run this"
    )
    parser.add_argument("--fake-vllm", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--fake-per-event", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    tokens = int(args.rate * TURN_SECONDS)
    if args.fake_vllm:
        uvloop.run(fake_vllm(args.fake_vllm, args.rate, args.fake_per_event, tokens))
        return
    words = words_through(answer_ids(tokens))
    print(
        f"{args.rate:.0f} tokens/s per stream, {args.turns} turns of ~{tokens} tokens each per"
        f" round, medians of {args.rounds}; load average at start {os.getloadavg()[0]:.1f}"
        f" on {os.cpu_count()} cores",
        flush=True,
    )
    installs = [("", HOTLOOP)]
    for baseline in args.baseline:
        name, _, python = baseline.partition("=")
        installs.append((f" [{name}]", (python, "-m", "hotloop.cli")))
    for streams in (int(n) for n in numbers(args.streams)):
        configs = [Config(f"sim, {streams} streams", streams, None)]
        for per_event in (int(n) for n in numbers(args.per_event)):
            configs.append(
                Config(f"upstream, {streams} streams, {per_event}/event", streams, per_event)
            )
        for window in numbers(args.coalesce_ms):
            configs.append(
                Config(
                    f"upstream, {streams} streams, 1/event, coalesce {window:g} ms",
                    streams,
                    1,
                    ["--stream-coalesce-ms", str(window)],
                )
            )
        sim_us: dict[str, float] = {}
        for config in configs:
            for label, command in (
                installs if "--stream-coalesce-ms" not in config.flags else installs[:1]
            ):
                figures = measure(args, config, command, words)
                if config.per_event is None:
                    sim_us[label] = figures.whole_us
                report(
                    config.name + label, figures, sim_us.get(label) if config.per_event else None
                )
    for streams in (int(n) for n in numbers(args.ramp)):
        figures = measure(
            args, Config(f"ramp: upstream, {streams} streams, 1/event", streams, 1), HOTLOOP, words
        )
        report(f"ramp: upstream, {streams} streams, 1/event", figures, None)
        if percentile(figures.lag_ms, 0.99) > LAG_LIMIT_MS:
            print(f"  added p99 per-token delay above {LAG_LIMIT_MS:g} ms: ramp stops", flush=True)
            break


if __name__ == "__main__":
    main()
