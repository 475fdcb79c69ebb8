"""A uvicorn server in a thread of the benchmark's own process (the server's time and the
client's on one clock), started and stopped around a `with` block."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

STARTUP_DEADLINE = 60.0


class _Server(uvicorn.Server):
    """Sets `ready` once the sockets are listening, or once `run` has ended without that
    (a failed start ends the thread: nobody should wait out the deadline for it);
    uvicorn's own `started` flag has no event."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            super().run(sockets=sockets)
        finally:
            self.ready.set()


@contextmanager
def serving(config: uvicorn.Config) -> Iterator[int]:
    """Serve `config` on a free loopback port in a daemon thread; yields the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = _Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        if not server.ready.wait(STARTUP_DEADLINE):
            raise RuntimeError(f"the server did not start within {STARTUP_DEADLINE:.0f} s")
        if not server.started:
            raise RuntimeError("the server's startup failed (its log says why)")
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join()
        sock.close()
