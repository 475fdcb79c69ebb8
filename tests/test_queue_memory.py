"""Queued request bytes bounded process-wide and per API key, not only per connection:
several connections of one key fill their queues until the key's bound answers 429
`queue_memory_exceeded` with a `retry-after`, another key still queues, and every byte
is given back when requests start or sockets close. Driven without sockets (the
state machine) and over real HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from connection_driver import FORMAT, ConnectionDriver
from hotloop._core import Limits
from hotloop.config import ServerConfig
from hotloop.protocol import (
    CacheBudget,
    Connection,
    ConnectionCache,
    ConnectionLimits,
    QueueMemory,
)
from hotloop.transport import App
from servers import serving, sim_engine
from test_protocol_connection import CALL, TOOLS

FILLER = "x" * 4000


def driver(
    memory: QueueMemory, principal: str | None, limits: ConnectionLimits | None = None
) -> ConnectionDriver:
    return ConnectionDriver(
        Connection(
            chat_format=FORMAT,
            context_window=1 << 20,
            model="sim",
            cache=ConnectionCache(1 << 30, CacheBudget(1 << 30)),
            principal=principal,
            queue_memory=memory,
            limits=limits,
        )
    )


def refusals(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == "error"]


def fill(client: ConnectionDriver, requests: int) -> list[dict[str, Any]]:
    """One request generating (it left the queue), then `requests` queued behind it."""
    frames = client.create(FILLER)
    for _ in range(requests):
        frames += client.create(FILLER)
    return frames


def test_one_key_is_bounded_across_its_connections() -> None:
    memory = QueueMemory(max_bytes=1 << 30, max_bytes_per_key=20_500)
    sockets = [driver(memory, "sk-a") for _ in range(4)]
    refused = [refusals(fill(s, 2)) for s in sockets]
    # 4 KB a request, 2 queued per socket: the key's 20.5 KB hold two sockets' worth
    # and one more request; at the bound even a request that would start at once is
    # refused (it is counted from its arrival to its start).
    assert [len(r) for r in refused] == [0, 0, 1, 3]
    error = refused[3][0]
    assert error["status"] == 429
    assert error["error"]["type"] == "rate_limit_error"
    assert error["error"]["code"] == "queue_memory_exceeded"
    assert error["error"]["headers"] == {"retry-after": "1"}
    # Another key is not refused for the first key's queues.
    assert refusals(fill(driver(memory, "sk-b"), 2)) == []
    assert memory.of("sk-a") <= 20_500


def test_the_process_bound_holds_across_keys() -> None:
    memory = QueueMemory(max_bytes=30_000, max_bytes_per_key=1 << 30)
    refused = [refusals(fill(driver(memory, f"sk-{i}"), 3)) for i in range(4)]
    assert sum(len(r) for r in refused) > 0
    assert memory.used_bytes <= 30_000


def test_every_byte_comes_back() -> None:
    memory = QueueMemory(max_bytes=1 << 30, max_bytes_per_key=1 << 30)
    finishing, closing = driver(memory, "sk-a"), driver(memory, "sk-a")
    fill(finishing, 3)
    fill(closing, 3)
    assert memory.used_bytes > 0
    for _ in range(4):
        finishing.finish()
    closing.conn.connection_lost()
    assert memory.used_bytes == 0 and memory.of("sk-a") == 0


def test_http_bodies_count_against_the_key(tmp_path: Path) -> None:
    """Over HTTP the body is held while it is read and parsed: a body larger than
    the key's bound is refused with 429 and the header `retry-after`."""
    config = ServerConfig(
        engine="sim",
        api_keys=("sk-a",),
        data_dir=str(tmp_path),
        max_queued_bytes_per_key=10_000,
    )
    with serving(App.from_config(config, sim_engine())) as base:
        auth = {"authorization": "Bearer sk-a"}
        big = httpx.post(
            base + "/v1/responses", json={"model": "sim", "input": "y" * 20_000}, headers=auth
        )
        metrics = httpx.get(base + "/metrics").text
        small = httpx.post(
            base + "/v1/responses", json={"model": "sim", "input": "hi"}, headers=auth
        )
    assert big.status_code == 429, big.text
    assert big.headers["retry-after"] == "1"
    error = big.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "queue_memory_exceeded"
    assert error["headers"] == {"retry-after": "1"}
    assert small.status_code == 200
    assert 'hotloop_refusals_total{code="queue_memory_exceeded"} 1' in metrics
    assert "hotloop_queued_request_bytes 0" in metrics


@pytest.mark.parametrize("bound", ["max_queued_bytes_total", "max_queued_bytes_per_key"])
def test_the_bounds_are_options(bound: str) -> None:
    assert getattr(ServerConfig.from_env({"HOTLOOP_" + bound.upper(): "123"}), bound) == 123


def test_a_waiting_request_keeps_its_frame_not_its_parse() -> None:
    """A queued request held its parsed form (its items plus the input's JSON for the
    store: ~2 bytes of RSS per queued byte, benches/bench_queue_memory.py); it now
    keeps the frame's text and is parsed again when its turn comes, with the same
    result as an unqueued one."""
    client = driver(QueueMemory(1 << 30, 1 << 30), "sk-a")
    client.create("first")
    queued = client.create(FILLER, instructions="Be brief.", metadata={"n": "2"}, store=False)
    assert queued == []
    waiting = client.conn.queue.lanes[None].queue[0]
    assert waiting.parsed is None and isinstance(waiting.frame, str)
    frames = client.finish()
    created = next(f for f in frames if f["type"] == "response.created")["response"]
    assert created["instructions"] == "Be brief." and created["metadata"] == {"n": "2"}
    assert created["store"] is False
    done = client.finish()
    assert done[-1]["type"] == "response.completed"
    alone = driver(QueueMemory(1 << 30, 1 << 30), "sk-a")
    alone.create(FILLER, instructions="Be brief.", metadata={"n": "2"}, store=False)
    reference = alone.finish()[-1]["response"]
    assert done[-1]["response"]["usage"] == reference["usage"]


def test_a_refused_steered_continuation_releases_its_bytes() -> None:
    """Issue 21 defect 6: the continuation that takes the steers queued for a response
    waiting for tool output is parsed again with them; when the core refused that (here
    over the item limit), the continuation's bytes stayed counted in the connection's,
    the key's and the process's bounds until the socket closed. Only the steers, still
    queued for the next continuation, stay counted now."""
    memory = QueueMemory(max_bytes=1 << 30, max_bytes_per_key=1 << 30)
    client = driver(memory, "sk-a", ConnectionLimits(request=Limits(max_items=2)))
    target = client.create("List files", tools=TOOLS)[0]["response"]["id"]
    call = client.finish(ids=CALL)[-1]["response"]["output"][-1]
    steer = {"type": "response.steer", "previous_response_id": target, "input": "Only .py."}
    assert client.send(steer)[0]["type"] == "response.steer.accepted"
    steers = memory.used_bytes
    assert steers > 0
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "a.py"}
    for _ in range(3):
        # Two items of its own, three with the steer: over the limit.
        more = {"role": "user", "content": "and b"}
        refused = client.create([output, more], previous_response_id=target, tools=TOOLS)
        assert refused[0]["error"]["code"] == "array_above_max_length", refused
        assert memory.used_bytes == memory.of("sk-a") == steers
    started = client.create([output], previous_response_id=target, tools=TOOLS)
    assert started[0]["type"] == "response.created"
    client.finish()
    assert memory.used_bytes == 0 and not client.conn.busy
