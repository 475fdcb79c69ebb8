"""SIGTERM on the real server (`hotloop serve`, a subprocess, one process or two workers)
while responses stream over HTTP and WebSocket: the in-flight responses finish, the
process exits cleanly, and after a restart on the same data directory every acknowledged
stored response is readable."""

from __future__ import annotations

import signal
import threading
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hotloop_process import stopped_while_waiting
from servers import HANG_GUARD, ServedProcess, served_process
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

KEY = "sk-drain"
AUTH = {"authorization": f"Bearer {KEY}"}
# Slow enough that a response is still streaming when the signal arrives.
LONG_TEXT = " ".join(f"word{i}" for i in range(150))


def served(data_dir: Path, workers: int = 1) -> AbstractContextManager[ServedProcess]:
    return served_process(
        [
            "--data-dir",
            str(data_dir),
            "--api-keys",
            KEY,
            "--sim-text",
            LONG_TEXT,
            "--sim-tokens-per-second",
            "150",
            "--sim-ttft",
            "0",
            "--workers",
            str(workers),
        ],
        workers,
    )


class InFlight(threading.Thread, ABC):
    """One response streaming in its own thread: `started` is set at `response.created`
    (or when the stream ends first), `terminal` is its last event."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.started = threading.Event()
        self.terminal: dict[str, Any] | None = None

    def see(self, event: dict[str, Any]) -> None:
        if event["type"] == "response.created":
            self.started.set()
        if event["type"] in ("response.completed", "response.failed", "error"):
            self.terminal = event

    @abstractmethod
    def stream(self) -> None:
        """Send the request and `see` every event until the terminal one."""

    def run(self) -> None:
        try:
            self.stream()
        finally:
            self.started.set()


class HttpStream(InFlight):
    """One streaming POST."""

    def __init__(self, url: str, n: int) -> None:
        super().__init__()
        self.url = url
        self.body = {"model": "sim", "input": f"stream {n}", "stream": True}

    def stream(self) -> None:
        with httpx.stream(
            "POST", self.url + "/v1/responses", json=self.body, headers=AUTH, timeout=None
        ) as reply:
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    self.see(orjson.loads(line[len("data: ") :]))


class SocketStream(InFlight):
    """One WebSocket response.create."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url.replace("http://", "ws://") + "/v1/responses"

    def stream(self) -> None:
        with connect(self.url, additional_headers=AUTH) as ws:
            ws.send(
                orjson.dumps({"type": "response.create", "model": "sim", "input": "ws"}).decode()
            )
            while self.terminal is None:
                self.see(orjson.loads(ws.recv(HANG_GUARD)))


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_finishes_in_flight_responses_and_loses_nothing(
    tmp_path: Path, workers: int
) -> None:
    acknowledged: dict[str, dict[str, Any]] = {}
    with served(tmp_path, workers) as server:
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=HANG_GUARD) as http:
            for n in range(5):
                reply = http.post("/v1/responses", json={"model": "sim", "input": f"quick {n}"})
                assert reply.status_code == 200
                acknowledged[reply.json()["id"]] = reply.json()
            forgotten = http.post(
                "/v1/responses", json={"model": "sim", "input": "zdr", "store": False}
            ).json()["id"]

        # With two workers the kernel spreads the connections over both.
        in_flight: list[InFlight] = [HttpStream(server.url, n) for n in range(3)]
        in_flight += [SocketStream(server.url) for _ in range(workers)]
        for stream in in_flight:
            stream.start()
        for stream in in_flight:
            assert stream.started.wait(HANG_GUARD)
            assert stream.terminal is None, "the response finished before the signal"

        # uvicorn shuts down cleanly, then re-raises the signal it caught.
        assert server.stop() in (0, -signal.SIGTERM), "".join(server.log)
        assert "Application shutdown complete" in "".join(server.log)
        for stream in in_flight:
            stream.join(HANG_GUARD)
            assert stream.terminal is not None
            assert stream.terminal["type"] == "response.completed", stream.terminal
            response = stream.terminal["response"]
            assert response["output"][0]["content"][0]["text"] == LONG_TEXT
            acknowledged[response["id"]] = response

    with (
        served(tmp_path) as server,
        httpx.Client(base_url=server.url, headers=AUTH, timeout=HANG_GUARD) as http,
    ):
        for response_id, response in acknowledged.items():
            stored = http.get(f"/v1/responses/{response_id}")
            assert stored.status_code == 200, response_id
            assert stored.json() == response
        assert http.get(f"/v1/responses/{forgotten}").status_code == 404


def test_sigterm_closes_an_idle_websocket_at_once_and_a_busy_one_after_its_response(
    tmp_path: Path,
) -> None:
    # Behind a load balancer, an idle client must reconnect elsewhere at once: left open
    # until the other connections' responses end, it would send its next request to a
    # server that refuses it.
    with served(tmp_path) as server:
        busy = SocketStream(server.url)
        busy.start()
        assert busy.started.wait(HANG_GUARD)
        ws_url = server.url.replace("http://", "ws://") + "/v1/responses"
        with connect(ws_url, additional_headers=AUTH) as idle:
            server.process.send_signal(signal.SIGTERM)
            with pytest.raises(ConnectionClosed) as closed:
                idle.recv(HANG_GUARD)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
            assert busy.terminal is None, "the idle socket waited for the busy one"
        busy.join(HANG_GUARD)
        assert busy.terminal is not None and busy.terminal["type"] == "response.completed"
        assert server.stop() in (0, -signal.SIGTERM)


def test_sigterm_ends_a_waiting_long_running_response_stored_and_continuable(
    tmp_path: Path,
) -> None:
    """A long-running response waits for tool output when the server is told to stop:
    it could not resume on a draining server, so it ends at once (`response.incomplete`,
    reason `connection_closing`), committed, before the socket closes with 1012; after a
    restart the client continues it with the call's output."""
    args = ["--data-dir", str(tmp_path), "--api-keys", KEY, "--sim-ttft", "0", "--inject"]
    args += ["--sim-tool", "exec_command", "--sim-tool-calls", "1"]
    tools = [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]
    with served_process(args) as server:
        ws_url = server.url.replace("http://", "ws://") + "/v1/responses"
        with connect(ws_url, additional_headers=AUTH) as ws:
            stop = lambda: server.process.send_signal(signal.SIGTERM)  # noqa: E731
            target, call = stopped_while_waiting(ws, stop, tools=tools)
        assert server.stop() in (0, -signal.SIGTERM)

    with served_process(args) as server, httpx.Client(base_url=server.url, headers=AUTH) as http:
        answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "a.py"}
        body = {"model": "sim", "input": [answer], "tools": tools, "previous_response_id": target}
        reply = http.post("/v1/responses", json=body, timeout=HANG_GUARD)
        assert reply.status_code == 200, reply.text
        assert reply.json()["status"] == "completed"
