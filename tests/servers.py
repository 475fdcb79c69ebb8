"""A real hotloop server for tests: uvicorn (hotloop's websockets-sansio protocol, as
`hotloop serve` runs it, httptools, uvloop) in a thread, on a socket the test bound
and put in listen mode first, so clients can connect at once (the kernel queues them
until the server accepts): no waiting loop."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from hotloop._core import ChatFormat
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimEngine, SimScript, SimSpeed
from hotloop.transport import App
from hotloop.transport.asgi import SEND_FRAMES, Message, Receive, Scope, Send
from hotloop.transport.frames import FrameSendingProtocol
from pydantic import ValidationError
from sdk_events import validate

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
                for frame in message["frames"]:
                    self.check(frame.decode())
            elif message["type"] == "websocket.send" and message.get("text") is not None:
                self.check(message["text"])
            await send(message)

        await self.app(scope, receive, checked)

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
    options: dict[str, Any] = {"ws": FrameSendingProtocol, **uvicorn_options}
    config = uvicorn.Config(
        app,
        http="httptools",
        loop="uvloop",
        lifespan="on",
        log_level="warning",
        **options,
    )
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
