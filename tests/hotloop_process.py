"""A real `hotloop serve` process for fault tests, and the clients that drive it.

`HotloopProcess` starts the server as a subprocess on a free loopback port (its log is
drained by a thread, so a full pipe never blocks it) and waits for uvicorn's startup
line or its exit. `store_true_turn` runs one `store=true` response over HTTP (JSON or
SSE) or WebSocket and returns its terminal event: what a client was told.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import orjson
import pytest
from pg_server import free_port
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

READY = "Uvicorn running on"  # logged once the socket listens
HANG_GUARD = 120.0  # seconds; only bounds a broken run, never part of what is checked


class HotloopProcess:
    def __init__(
        self, args: Sequence[str], *, python: str = sys.executable, cwd: str | None = None
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/v1/responses"
        self.log: list[str] = []
        self._ready = threading.Event()
        self.process = subprocess.Popen(
            [python, "-m", "hotloop.cli", "serve", "--port", str(self.port), *args],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            cwd=cwd,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)
            if READY in line:
                self._ready.set()
        self._ready.set()  # exited: let the waiter see it

    def wait_ready(self) -> HotloopProcess:
        assert self._ready.wait(HANG_GUARD)
        assert self.process.poll() is None, "".join(self.log)
        return self

    def exit_code(self) -> int:
        """Wait for the process to end by itself."""
        code = self.process.wait(HANG_GUARD)
        self._reader.join(HANG_GUARD)
        return code

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(HANG_GUARD)
        self._reader.join(HANG_GUARD)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(HANG_GUARD)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(HANG_GUARD)

    def __enter__(self) -> HotloopProcess:
        return self.wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()


TERMINAL = ("response.completed", "response.failed", "response.incomplete", "error")


def body(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": "sim", "input": text, "store": True, **fields}


def http_turn(client: httpx.Client, text: str, *, stream: bool, **fields: Any) -> dict[str, Any]:
    """One response over HTTP; its terminal event (a JSON reply becomes the event it
    stands for)."""
    payload = body(text, stream=stream, **fields)
    if not stream:
        reply = client.post("/v1/responses", json=payload)
        if reply.status_code == 200:
            return {"type": "response.completed", "response": reply.json()}
        return {"type": "error", "status": reply.status_code, "error": reply.json()["error"]}
    last: dict[str, Any] = {}
    with client.stream("POST", "/v1/responses", json=payload) as events:
        for line in events.iter_lines():
            if line.startswith("data: "):
                last = orjson.loads(line[6:])
    return last


def ws_turn(socket: ClientConnection, text: str, **fields: Any) -> dict[str, Any]:
    socket.send(orjson.dumps({"type": "response.create", **body(text, **fields)}).decode())
    while True:
        event: dict[str, Any] = orjson.loads(socket.recv(HANG_GUARD))
        if event["type"] in TERMINAL:
            return event


def stopped_while_waiting(
    socket: ClientConnection, stop: Callable[[], None], **fields: Any
) -> tuple[str, dict[str, Any]]:
    """Start a long-running response (the server runs with `--inject` and a model that
    calls a tool), and once its call item is done (it waits for the output) `stop` the
    server: the response ends at once as `connection_closing`, then the socket closes
    with 1012. Returns the response id and the call item."""
    create = {"type": "response.create", "model": "sim", "input": "Fix the test.", **fields}
    socket.send(orjson.dumps(create).decode())
    events = [orjson.loads(socket.recv(HANG_GUARD))]
    while events[-1]["type"] != "response.output_item.done":
        events.append(orjson.loads(socket.recv(HANG_GUARD)))
    stop()
    ended = orjson.loads(socket.recv(HANG_GUARD))
    assert ended["type"] == "response.incomplete", ended
    assert ended["response"]["incomplete_details"] == {"reason": "connection_closing"}
    with pytest.raises(ConnectionClosed) as closed:
        socket.recv(HANG_GUARD)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
    return events[0]["response"]["id"], events[-1]["item"]


def acknowledged(event: dict[str, Any]) -> str | None:
    """The response id a client was told is complete, if it was."""
    if event.get("type") == "response.completed":
        rid: str = event["response"]["id"]
        return rid
    return None


__all__ = ["HotloopProcess", "acknowledged", "http_turn", "stopped_while_waiting", "ws_turn"]
