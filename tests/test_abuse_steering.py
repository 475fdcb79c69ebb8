"""Steering input is queued input: one tenant steering with megabyte messages against a
real `hotloop serve --inject` process on loopback is held to its key's queue bound
across its connections, refused with `queue_memory_exceeded` (the input returned), and
another tenant is not affected. The sim calls a tool on every turn, so each response
waits open for injected output and the steers it accepts stay queued until then. Every
client call is bounded by a timeout; each socket sends a handful of frames."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import orjson
import pytest
from hotloop.lab.proc import ServerProcess
from websockets.sync.client import ClientConnection, connect

pytestmark = pytest.mark.abuse

MIB = 1024 * 1024
GUARD = 30.0
STEER_BYTES = MIB
FLAGS = [
    "--engine",
    "sim",
    "--api-keys",
    "sk-a,sk-b",
    "--sim-tool",
    "exec_command",
    "--sim-tool-calls",
    "1000",
    "--inject",
]
# Three 1 MiB steers fit a key's 4 MiB; the fourth does not.
ENV = {"HOTLOOP_MAX_QUEUED_BYTES_PER_KEY": str(4 * MIB), "HOTLOOP_MAX_QUEUED_BYTES": str(16 * MIB)}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess.start(FLAGS, env={**os.environ, **ENV}) as running:
        yield running


def waiting(
    sockets: ExitStack, server: ServerProcess, key: str
) -> tuple[ClientConnection, str, str]:
    """A socket (closed with `sockets`) whose response called the tool and waits:
    (socket, response id, call id)."""
    ws = sockets.enter_context(
        connect(server.ws_url, additional_headers={"authorization": f"Bearer {key}"}, max_size=None)
    )
    ws.send(orjson.dumps({"type": "response.create", "model": "sim", "input": "go"}).decode())
    target = ""
    while True:
        event = orjson.loads(ws.recv(GUARD))
        assert event["type"] not in ("response.completed", "error"), event
        if event["type"] == "response.created":
            target = event["response"]["id"]
        if event["type"] == "response.output_item.done":
            return ws, target, event["item"]["call_id"]


def steer(ws: ClientConnection, target: str) -> dict[str, Any]:
    """One 1 MiB steer; its answer (`accepted`, then `pending`; or `failed`)."""
    frame = {"type": "response.steer", "previous_response_id": target, "input": "s" * STEER_BYTES}
    ws.send(orjson.dumps(frame).decode())
    answer: dict[str, Any] = orjson.loads(ws.recv(GUARD))
    if answer["type"] == "response.steer.accepted":
        pending = orjson.loads(ws.recv(GUARD))
        assert pending["type"] == "response.steer.pending", pending
    return answer


def test_steers_are_bounded_per_key_across_connections(server: ServerProcess) -> None:
    with ExitStack() as sockets:
        first, first_id, call_id = waiting(sockets, server, "sk-a")
        second, second_id, _ = waiting(sockets, server, "sk-a")
        other, other_id, _ = waiting(sockets, server, "sk-b")
        answers = [steer(first, first_id)["type"] for _ in range(3)]
        assert answers == ["response.steer.accepted"] * 3
        refused = steer(first, first_id)
        assert refused["type"] == "response.steer.failed"
        assert refused["error"]["code"] == "queue_memory_exceeded"
        assert len(refused["steer"]["input"]) == STEER_BYTES
        # The key's bound holds across its connections; another key has its own.
        assert steer(second, second_id)["error"]["code"] == "queue_memory_exceeded"
        assert steer(other, other_id)["type"] == "response.steer.accepted"

        # The injected output resumes the first response with its steers: their bytes
        # leave the queue before the server answers, so the key may queue again.
        output = {"type": "function_call_output", "call_id": call_id, "output": "done"}
        first.send(
            orjson.dumps(
                {"type": "response.inject", "response_id": first_id, "input": [output]}
            ).decode()
        )
        assert orjson.loads(first.recv(GUARD))["type"] == "response.inject.created"
        assert steer(second, second_id)["type"] == "response.steer.accepted"
