"""Where a turn's time to its first delta goes (`hotloop.turnclock`): a streamed turn
over WebSocket and one over HTTP, in front of the in-test vLLM, each record every phase
their transport measures in `hotloop_turn_phase_seconds`, and at DEBUG one line per
turn on `hotloop.phases`; phases are computed from the clock's stamps."""

from __future__ import annotations

import asyncio
import logging

import httpx
import orjson
import pytest
from fake_upstreams import FakeUpstream, Script, serving
from hotloop._core import ChatFormat
from hotloop.config import ServerConfig
from hotloop.engines.upstream import UpstreamConfig, UpstreamEngine
from hotloop.transport import App
from hotloop.turnclock import PHASES, TurnClock
from servers import serving as serving_hotloop
from websockets.sync.client import connect

HANG_GUARD = 60.0  # seconds; only bounds a broken run
REQUEST = {"model": "sim", "input": "Hi", "store": False}


def one_turn_each(url: str) -> str:
    """A streamed turn over WebSocket, one over HTTP; then the server's metrics."""
    with connect(url.replace("http", "ws", 1) + "/v1/responses") as socket:
        socket.send(orjson.dumps({"type": "response.create", **REQUEST}).decode())
        while (event := orjson.loads(socket.recv(HANG_GUARD)))["type"] != "response.completed":
            assert event["type"] not in ("response.failed", "error"), event
    body = {**REQUEST, "stream": True}
    with httpx.stream("POST", url + "/v1/responses", json=body, timeout=HANG_GUARD) as streamed:
        assert b"response.completed" in b"".join(streamed.iter_bytes())
    return httpx.get(url + "/metrics", timeout=HANG_GUARD).text


async def test_a_streamed_turn_records_each_phase_its_transport_measures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    format_ = ChatFormat.harmony()
    upstream = FakeUpstream("vllm", Script(reply=format_.completion_tokens(text="Hello there.")))
    async with serving(upstream):
        config = UpstreamConfig(
            dialect="vllm", replicas=(upstream.url,), model="sim", context_window=4096
        )
        app = App.from_config(ServerConfig(engine="upstream"), UpstreamEngine(config, format_))
        with caplog.at_level(logging.DEBUG, logger="hotloop.phases"), serving_hotloop(app) as url:
            text = await asyncio.to_thread(one_turn_each, url)
    counts = {
        line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("hotloop_turn_phase_seconds_count")
    }
    for transport, phases in (("websocket", PHASES), ("http", PHASES[1:])):
        for phase in PHASES:
            expected = 1 if phase in phases else None
            assert counts.get(f'transport="{transport}",phase="{phase}"') == expected, phase
    lines = [r.getMessage() for r in caplog.records if r.name == "hotloop.phases"]
    assert len(lines) == 2
    assert all("upstream_write=" in line and "delta_out=" in line for line in lines)


def test_phases_follow_the_stamps_and_leave_out_what_was_not_measured() -> None:
    ms = 1_000_000
    clock = TurnClock(received_ns=1 * ms, read_ns=3 * ms)
    clock.started_ns, clock.written_ns = 4 * ms, 6 * ms
    clock.arrived_ns, clock.handed_ns = 16 * ms, 19 * ms
    assert clock.phases(out_ns=20 * ms) == {
        "queued": 0.002,
        "prepare": 0.001,
        "upstream_write": 0.002,
        "upstream": 0.010,
        "handover": 0.003,
        "delta_out": 0.001,
    }
    # An engine without a socket (the sim), a request read as it arrived (HTTP).
    local = TurnClock(received_ns=1 * ms)
    local.started_ns, local.handed_ns = 2 * ms, 5 * ms
    assert local.phases(out_ns=6 * ms) == {"prepare": 0.001, "upstream": 0.003, "delta_out": 0.001}
