"""A real hotloop server for tests: uvicorn (hotloop's websockets-sansio protocol, as
`hotloop serve` runs it, httptools, uvloop) in a thread, on a socket the test bound
and put in listen mode first, so clients can connect at once (the kernel queues them
until the server accepts): no waiting loop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import uvicorn
from hotloop._core import ChatFormat
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimEngine, SimScript, SimSpeed
from hotloop.transport import App
from hotloop.transport.admission import AdmittingHttpProtocol
from hotloop.transport.asgi import SEND_FRAMES, WRITE_FRAMES, Message, Receive, Scope, Send
from hotloop.transport.frames import FrameSendingProtocol
from pydantic import ValidationError
from sdk_events import validate

READY = "Application startup complete"
BOUND = "Uvicorn running on"
HANG_GUARD = 120.0  # seconds; only bounds a broken run, never part of what is checked
FAST = SimSpeed(tokens_per_second=20000.0, ttft=0.0, prefill_tokens_per_second=1e9)


def sim_engine(script: SimScript | None = None, speed: SimSpeed = FAST) -> SimEngine:
    return SimEngine(ChatFormat.harmony(), model="sim", speed=speed, script=script)


class Validating:
    """Wraps an ASGI app: every WebSocket frame it sends is validated with the SDK's
    models, and failures are kept for the test to assert on."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.invalid: list[str] = []
        self.frames = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return

        async def checked(message: Message) -> None:
            if message["type"] == SEND_FRAMES:
                self.check_all(message["frames"])
            elif message["type"] == "websocket.send" and message.get("text") is not None:
                self.check(message["text"])
            await send(message)

        extension = scope.get("extensions", {}).get(SEND_FRAMES)
        if extension is not None and WRITE_FRAMES in extension:
            # The server's plain writer carries most frames: check those too.
            write = extension[WRITE_FRAMES]

            def write_checked(frames: list[bytes]) -> bool:
                written: bool = write(frames)
                if written:
                    self.check_all(frames)
                return written

            scope["extensions"][SEND_FRAMES] = {**extension, WRITE_FRAMES: write_checked}
        await self.app(scope, receive, checked)

    def check_all(self, frames: list[bytes]) -> None:
        for frame in frames:
            self.check(frame.decode())

    def check(self, text: str) -> None:
        self.frames += 1
        try:
            validate(text)
        except ValidationError as e:
            self.invalid.append(f"{text[:300]}: {e}")


@contextmanager
def serving(app: Any, **uvicorn_options: Any) -> Iterator[str]:
    """Run `app` and yield its base URL, `http://127.0.0.1:PORT`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    # The protocols `hotloop serve` runs: its admission control and its frame batching.
    options: dict[str, Any] = {
        "ws": FrameSendingProtocol,
        "http": AdmittingHttpProtocol,
        "log_level": "warning",
        **uvicorn_options,
    }
    config = uvicorn.Config(app, loop="uvloop", lifespan="on", **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


@contextmanager
def hotloop_server(
    script: SimScript | None = None, speed: SimSpeed = FAST, **config: Any
) -> Iterator[str]:
    """A hotloop App over the sim engine, served for real; on exit, asserts that every
    frame it sent was valid for the SDK."""
    app = App(sim_engine(script, speed), ServerConfig(engine="sim", **config))
    checked = Validating(app)
    options = {
        "ws_max_size": 2 * app.config.max_frame_bytes,
        "ws_per_message_deflate": app.config.websocket_deflate,
    }
    with serving(checked, **options) as url:
        yield url
    assert checked.invalid == []


@contextmanager
def stored_server(data_dir: str, script: SimScript | None = None, **config: Any) -> Iterator[str]:
    """`hotloop serve` as built by the CLI (`App.from_config`: the store in `data_dir`) over
    the sim engine, served for real; on exit, asserts every frame it sent was valid."""
    settings = ServerConfig(engine="sim", data_dir=data_dir, **config)
    checked = Validating(App.from_config(settings, sim_engine()))
    with serving(checked) as url:
        yield url
    assert checked.invalid == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServedProcess:
    """`hotloop serve --engine=sim` in a subprocess on 127.0.0.1, with `args` added;
    its log is drained by a thread (a full pipe would block the server) and `ready` is
    set once uvicorn reports startup complete in every worker and its socket bound."""

    def __init__(self, args: Sequence[str], workers: int = 1) -> None:
        self.workers = workers
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log: list[str] = []
        self.ready = threading.Event()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "hotloop.cli", "serve", "--engine=sim"]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--log-level", "info"]
        self.process = subprocess.Popen(
            [*command, *args], stderr=subprocess.PIPE, text=True, env=env
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        # Ready: every worker started its application and the socket is bound (one
        # process binds after its startup, a supervisor before it forks).
        started, bound = 0, False
        for line in self.process.stderr:
            self.log.append(line)
            started += READY in line
            bound = bound or BOUND in line
            if bound and started == self.workers:
                self.ready.set()
        self.ready.set()  # exited: let the waiter see it

    def wait_ready(self) -> None:
        assert self.ready.wait(HANG_GUARD)
        assert self.process.poll() is None, "".join(self.log)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(HANG_GUARD)
        self._reader.join(HANG_GUARD)
        return code


@contextmanager
def served_process(args: Sequence[str], workers: int = 1) -> Iterator[ServedProcess]:
    server = ServedProcess(args, workers)
    try:
        server.wait_ready()
        yield server
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
