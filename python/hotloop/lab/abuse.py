"""Abuse scenarios: one tenant attacks a running `hotloop serve` (loopback only) while a
victim tenant runs turns, for `tests/test_abuse.py` (which asserts) and
`benches/bench_abuse.py` (which prints the victim's latency figures).

Each attack runs in a process of its own (`python -m hotloop.lab.abuse ATTACK ...`),
so its CPU and GIL do not slow the victim's client, and stops by itself after its
duration and a bound on its work; it prints one JSON line of what it did and how the
server answered. The victim (`Victim`) runs WebSocket turns back to back, continuing
its own stored chain, with every few turns over HTTP, and records each turn's latency
and every response id it saw acknowledged, so the caller can read them all back.

It owns the attacks and the victim's measurements; it never starts a server.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect
from websockets.sync.connection import Connection

from hotloop.lab.proc import rss_bytes

ATTACKER = "sk-a"
VICTIM = "sk-b"
# Bounds every blocking client call, so a broken server cannot hang a run.
GUARD = 60.0
MIB = 1024 * 1024
# The server both the suite and the bench attack: turns of 40 tokens at 4,000 tokens/s;
# `SERVER_ENV` adds a 2 s header deadline, queues of 16 MiB per connection and 32 MiB
# per key (environment variables, so that a build without these options runs it too).
SERVER_FLAGS = [
    "--engine",
    "sim",
    "--api-keys",
    f"{ATTACKER},{VICTIM}",
    "--sim-text",
    " ".join(f"word{i}" for i in range(40)),
    "--sim-tokens-per-second",
    "4000",
    "--sim-ttft",
    "0",
]
SERVER_ENV = {
    "HOTLOOP_HEADER_TIMEOUT": "2",
    "HOTLOOP_MAX_QUEUED_BYTES": str(16 * MIB),
    "HOTLOOP_MAX_QUEUED_BYTES_PER_KEY": str(32 * MIB),
}


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/v1/responses"


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def create(**fields: Any) -> str:
    return orjson.dumps({"type": "response.create", "model": "sim", **fields}).decode()


def until_terminal(ws: Connection) -> dict[str, Any]:
    """Frames until the request's terminal event (or its `error`)."""
    while True:
        event: dict[str, Any] = orjson.loads(ws.recv(GUARD))
        if event["type"] in (
            "response.completed",
            "response.incomplete",
            "response.failed",
            "error",
        ):
            return event


# ---------------------------------------------------------------- attacks


def slowloris(base: str, key: str, deadline: float, connections: int = 200) -> dict[str, Any]:
    """`connections` sockets that never finish their headers: one more header line
    on each every 0.5 s; a socket the server closes is opened again."""
    host, port = base.removeprefix("http://").split(":")
    address = (host, int(port))
    open_: dict[socket.socket, int] = {}
    answered: dict[str, int] = {}

    def dial() -> None:
        sock = socket.create_connection(address, timeout=GUARD)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        sock.setblocking(False)
        open_[sock] = 0

    for _ in range(connections):
        dial()
    opened = connections
    while time.monotonic() < deadline:
        readable, _, _ = select.select(list(open_), [], [], 0.5)
        for sock in readable:
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "closed"
            answered[status] = answered.get(status, 0) + 1
            del open_[sock]
            sock.close()
            dial()
            opened += 1
        for sock in list(open_):
            try:
                sock.send(b"X-Slow: 1\r\n")
            except OSError:
                del open_[sock]
                sock.close()
                dial()
                opened += 1
    for sock in open_:
        sock.close()
    return {"opened": opened, "answered": answered}


def tool_tools(total_bytes: int = 13_500_000, count: int = 500) -> list[dict[str, Any]]:
    """Function tools of about `total_bytes` of JSON, as few as the core's limit of
    512 allows: each with a long description (rendered and tokenized into the prompt,
    then refused as longer than the context)."""
    sentence = "Looks up one record in the inventory by its id. "
    description = sentence * (total_bytes // count // len(sentence))
    return [
        {
            "type": "function",
            "name": f"lookup_{i}",
            "description": description,
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        }
        for i in range(count)
    ]


def tool_list(base: str, key: str, deadline: float, limit: int = 20) -> dict[str, Any]:
    """A 13.5 MB tool list sent back to back over one socket."""
    frame = create(input="hi", store=False, tools=tool_tools())
    latencies: list[float] = []
    outcomes: dict[str, int] = {}
    with connect(ws_url(base), additional_headers=auth(key), max_size=None) as ws:
        while time.monotonic() < deadline and len(latencies) < limit:
            start = time.perf_counter()
            ws.send(frame)
            event = until_terminal(ws)
            latencies.append(time.perf_counter() - start)
            outcome = event["error"]["code"] if event["type"] == "error" else event["type"]
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return {"bytes": len(frame), "sent": len(latencies), "latencies": latencies, **outcomes}


def full_queues(
    base: str, key: str, deadline: float, sockets: int = 8, frame_bytes: int = 256 * 1024
) -> dict[str, Any]:
    """`sockets` connections of one key, each queueing requests of `frame_bytes`
    until the server refuses, then holding them queued."""
    refused: dict[str, int] = {}
    queued = 0
    lock = threading.Lock()
    frame = create(input="q" * frame_bytes, store=False)

    def fill() -> None:
        nonlocal queued
        with connect(ws_url(base), additional_headers=auth(key), max_size=None) as ws:
            for _ in range(400):
                ws.send(frame)
                with lock:
                    queued += 1
                try:
                    event = orjson.loads(ws.recv(0))
                except TimeoutError:
                    continue
                if event["type"] == "error":
                    with lock:
                        code = event["error"]["code"]
                        refused[code] = refused.get(code, 0) + 1
                    break
            # Hold the queue: read (and drop) what the server sends until the end.
            while time.monotonic() < deadline:
                try:
                    ws.recv(max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    break

    threads = [threading.Thread(target=fill) for _ in range(sockets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(GUARD + deadline - time.monotonic())
    return {"sent": queued, "refused": refused}


def churn(base: str, key: str, deadline: float, limit: int = 3000) -> dict[str, Any]:
    """Connections opened and dropped as fast as they go: a WebSocket that sends a
    request and leaves, and an HTTP request on a fresh connection."""
    rounds = 0
    while time.monotonic() < deadline and rounds < limit:
        with connect(ws_url(base), additional_headers=auth(key)) as ws:
            ws.send(create(input="bye", store=False))
        httpx.get(base + "/health", timeout=GUARD)
        rounds += 1
    return {"rounds": rounds}


MALFORMED: list[str | bytes] = [
    "{not json",
    b"\x00\x01binary",
    '{"type": "response.nope"}',
    "[" * 10000 + "]" * 10000,
    '{"type": "response.create", "input": 1e999}',
    '{"type": "response.create", "model": "sim", "input": [{"type": "message"}]}',
    '{"type": "response.create", "stream_id": "bad id!", "input": "x"}',
    '"just a string"',
]


def malformed(base: str, key: str, deadline: float, limit: int = 20000) -> dict[str, Any]:
    """Malformed frames on one socket, and a text frame that is not UTF-8 (which
    closes its socket) every 50 frames."""
    sent = errors = closes = 0
    ws = connect(ws_url(base), additional_headers=auth(key))
    try:
        while time.monotonic() < deadline and sent < limit:
            if sent % 50 == 49:
                ws.send(b"\xff\xfe", text=True)
                try:
                    ws.recv(GUARD)
                except ConnectionClosed:
                    closes += 1
                ws = connect(ws_url(base), additional_headers=auth(key))
            else:
                ws.send(MALFORMED[sent % len(MALFORMED)])
                errors += orjson.loads(ws.recv(GUARD))["type"] == "error"
            sent += 1
    finally:
        ws.close()
    return {"sent": sent, "errors": errors, "closed_1007": closes}


def disconnect_mid_stream(
    base: str, key: str, deadline: float, limit: int = 2000
) -> dict[str, Any]:
    """Start a response, read its first delta, drop the TCP connection."""
    dropped = 0
    while time.monotonic() < deadline and dropped < limit:
        ws = connect(ws_url(base), additional_headers=auth(key))
        ws.send(create(input="talk", store=True))
        while orjson.loads(ws.recv(GUARD))["type"] != "response.output_text.delta":
            pass
        ws.socket.close()  # no close frame: what a crashed client does
        dropped += 1
    return {"dropped": dropped}


ATTACKS: dict[str, Callable[[str, str, float], dict[str, Any]]] = {
    "slowloris": slowloris,
    "tool_list": tool_list,
    "full_queues": full_queues,
    "churn": churn,
    "malformed": malformed,
    "disconnect_mid_stream": disconnect_mid_stream,
}


# ---------------------------------------------------------------- the victim


@dataclass
class Victim:
    """The tenant that must not notice: turns back to back, every `http_every`-th
    over HTTP, all `store=true` and continuing its own chain."""

    base: str
    key: str = VICTIM
    http_every: int = 5
    latencies: list[float] = field(default_factory=list)
    acknowledged: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _previous: str | None = None

    def run(self, running: Callable[[], bool], at_least: int = 3) -> None:
        """Turns until `running()` turns false (and at least `at_least` of them)."""
        with connect(ws_url(self.base), additional_headers=auth(self.key)) as ws:
            turns = 0
            while running() or turns < at_least:
                turns += 1
                start = time.perf_counter()
                if turns % self.http_every == 0:
                    response = self._http_turn(turns)
                else:
                    response = self._ws_turn(ws, turns)
                if response is not None:
                    self.latencies.append(time.perf_counter() - start)
                    self.acknowledged.append(response)
                    self._previous = response

    def _ws_turn(self, ws: Connection, turn: int) -> str | None:
        ws.send(create(input=f"turn {turn}", store=True, previous_response_id=self._previous))
        event = until_terminal(ws)
        if event["type"] != "response.completed":
            self.failures.append(orjson.dumps(event)[:300].decode())
            return None
        response_id: str = event["response"]["id"]
        return response_id

    def _http_turn(self, turn: int) -> str | None:
        body = {"model": "sim", "input": f"turn {turn}", "store": True}
        if self._previous is not None:
            body["previous_response_id"] = self._previous
        reply = httpx.post(
            self.base + "/v1/responses", json=body, headers=auth(self.key), timeout=GUARD
        )
        if reply.status_code != 200:
            self.failures.append(f"HTTP {reply.status_code}: {reply.text[:300]}")
            return None
        response_id: str = reply.json()["id"]
        return response_id

    def lost(self) -> list[str]:
        """Acknowledged responses the server cannot read back."""
        missing = []
        with httpx.Client(base_url=self.base, headers=auth(self.key), timeout=GUARD) as http:
            for response_id in self.acknowledged:
                if http.get(f"/v1/responses/{response_id}").status_code != 200:
                    missing.append(response_id)
        return missing


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@dataclass
class Scenario:
    """One attack and what the victim and the server's memory went through meanwhile."""

    attack: str
    report: dict[str, Any]
    latencies: list[float]
    failures: list[str]
    peak_rss: int
    stalls: int | None
    """Windows of more than `STALL` seconds of event-loop CPU without a break, from the
    server's `hotloop_event_loop_busy_seconds` (None when the server does not export it)."""
    seconds: float
    """How long the victim ran: the attack's duration, or longer when the attacker's
    last writes wait for a server that stopped reading its socket."""

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 0.5)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 0.99)


STALL = "0.1"


def loop_windows(base: str) -> tuple[int, int] | None:
    """The server's event-loop windows so far: all of them, and those of at most
    `STALL` seconds of CPU (None from a server without the metric)."""
    total = short = -1
    for line in httpx.get(base + "/metrics", timeout=GUARD).text.splitlines():
        if line.startswith("hotloop_event_loop_busy_seconds_count"):
            total = int(line.split()[-1])
        elif line.startswith(f'hotloop_event_loop_busy_seconds_bucket{{le="{STALL}"}}'):
            short = int(line.split()[-1])
    return None if total < 0 or short < 0 else (total, short)


def run_scenario(
    base: str, server_pid: int, attack: str | None, seconds: float
) -> tuple[Scenario, Victim]:
    """Run `attack` (None: nobody attacks, for the quiet baseline) for `seconds` in its
    own process while a `Victim` runs turns; sample the server's RSS meanwhile."""
    victim = Victim(base)
    peak = rss_bytes(server_pid)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.05):
            peak = max(peak, rss_bytes(server_pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    windows_before = loop_windows(base)
    started = time.monotonic()
    report: dict[str, Any] = {}
    try:
        if attack is None:
            end = time.monotonic() + seconds
            victim.run(lambda: time.monotonic() < end)
        else:
            attacker = subprocess.Popen(
                [sys.executable, "-m", "hotloop.lab.abuse", attack, base, str(seconds)],
                stdout=subprocess.PIPE,
                text=True,
            )
            victim.run(lambda: attacker.poll() is None)
            out, _ = attacker.communicate(timeout=GUARD)
            if attacker.returncode != 0:
                raise RuntimeError(f"attack {attack} failed with status {attacker.returncode}")
            report = json.loads(out.strip().splitlines()[-1])
    finally:
        done.set()
        sampler.join()
    seconds = time.monotonic() - started
    windows_after = loop_windows(base)
    stalls = None
    if windows_before is not None and windows_after is not None:
        total = windows_after[0] - windows_before[0]
        short = windows_after[1] - windows_before[1]
        stalls = total - short
    scenario = Scenario(
        attack or "none", report, victim.latencies, victim.failures, peak, stalls, seconds
    )
    return scenario, victim


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="run one abuse attack (loopback only)")
    parser.add_argument("attack", choices=sorted(ATTACKS))
    parser.add_argument("base", help="the server, http://127.0.0.1:PORT")
    parser.add_argument("seconds", type=float)
    parser.add_argument("--key", default=ATTACKER)
    args = parser.parse_args(argv)
    if not args.base.startswith(("http://127.0.0.1:", "http://localhost:")):
        raise SystemExit("abuse attacks run against loopback only")
    try:
        report = ATTACKS[args.attack](args.base, args.key, time.monotonic() + args.seconds)
    except InvalidStatus as e:
        report = {"refused_upgrade": e.response.status_code}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
