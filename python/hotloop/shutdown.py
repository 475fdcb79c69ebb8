"""Graceful shutdown: on SIGTERM/SIGINT stop accepting, let in-flight responses finish
up to a deadline, then close connections and flush the store.

Owns `Drain`: the count of in-flight responses, and the switch that refuses new ones
(`Drain.engine` wraps the engine so that every generation, over either transport, is one
in-flight response). uvicorn's own shutdown does the rest, in every process (one, or each
worker of `--workers N`), with `timeout_graceful_shutdown` set to the drain deadline:

1. stop listening (new connections are refused by the kernel);
2. ask every connection to shut down: an HTTP connection finishes the response it is
   sending and closes; a WebSocket (`hotloop.transport.frames.FrameSendingProtocol`)
   refuses new responses (`ShuttingDown`: `response.failed`, 503), ends its responses
   waiting for tool output (they could not resume: `Connection.shutting_down`), waits
   until none of its responses is in flight or the deadline passes, then closes with
   1012 (plain uvicorn would close it with 1012 at once, cutting responses in the
   middle);
3. wait for the connections to close, up to the deadline;
4. the ASGI lifespan shutdown, where the app closes its store (`Store.close` flushes
   the background writer).

Every `store=true` response whose terminal event was sent was committed before it, and a
commit in progress counts as in flight (`Drain.hold`), so step 4 only closes the store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING

from hotloop.engines.base import EngineError, WrappedEngine, close_stream

if TYPE_CHECKING:
    from hotloop._core import Prompt
    from hotloop.engines.base import Engine, EngineSession, Sampling

log = logging.getLogger("hotloop.shutdown")


class ShuttingDown(Exception):
    """A new response was refused because the server is draining: code
    `server_shutting_down`, HTTP status 503 (`server_error`); clients retry elsewhere."""

    code = "server_shutting_down"
    status = 503

    def __init__(self) -> None:
        super().__init__("The server is shutting down; retry on another connection.")
        self.message = str(self)


class Drain:
    """In-flight responses of this process: each is admitted, then released."""

    def __init__(self) -> None:
        self._in_flight = 0
        self._idle: asyncio.Event | None = None
        self._late = False
        self.draining = False

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def admit(self) -> None:
        """Count one more response in flight (raises ShuttingDown once draining)."""
        if self.draining:
            raise ShuttingDown
        self._in_flight += 1

    def hold(self) -> None:
        """Count work that must finish before shutdown even while draining (the commit
        of a response whose generation already ended)."""
        self._in_flight += 1

    def release(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._idle is not None:
            self._idle.set()

    def engine(self, engine: Engine) -> Engine:
        """`engine`, with each generation counted as an in-flight response. Once
        draining, a generation that has not started fails with EngineError
        `server_shutting_down` (the client gets `response.failed`, a terminal event)."""
        return _DrainedEngine(engine, self)

    async def wait(self, deadline: float) -> bool:
        """Refuse new responses from now on and wait up to `deadline` seconds for the
        in-flight ones. True if all finished. Every connection of the process waits
        here at shutdown: the first starts the drain, the others join it."""
        self.draining = True
        if self._in_flight == 0:
            return True
        if self._idle is None:
            log.info("draining %d in-flight responses", self._in_flight)
            self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), deadline)
        except asyncio.TimeoutError:
            if not self._late:
                self._late = True
                log.warning(
                    "%d responses still running after %.1fs; closing their connections",
                    self._in_flight,
                    deadline,
                )
            return False
        return True


class _DrainedEngine(WrappedEngine):
    def __init__(self, engine: Engine, drain: Drain) -> None:
        super().__init__(engine)
        self._drain = drain

    def session(self, cache_salt: str | None = None) -> EngineSession:
        return _DrainedSession(self.engine.session(cache_salt), self._drain)


class _DrainedSession:
    def __init__(self, session: EngineSession, drain: Drain) -> None:
        self._session = session
        self._drain = drain

    def generate(
        self, prompt: Prompt, sampling: Sampling, route_key: str | None = None
    ) -> AsyncIterator[list[int]]:
        try:
            self._drain.admit()
        except ShuttingDown as e:
            raise EngineError(e.code, e.message) from e
        try:
            return _InFlight(self._session.generate(prompt, sampling, route_key), self._drain)
        except BaseException:
            self._drain.release()
            raise

    async def close(self) -> None:
        await self._session.close()


class _InFlight:
    """One generation's ids, counted in flight until the consumer closes the stream
    (`close_stream`). Iterating goes straight to the engine's stream: this is the
    per-token path, so the count adds no step of its own per batch."""

    __slots__ = ("_closed", "_drain", "_stream")

    def __init__(self, stream: AsyncIterator[list[int]], drain: Drain) -> None:
        self._stream = stream
        self._drain = drain
        self._closed = False

    def __aiter__(self) -> _InFlight:
        return self

    def __anext__(self) -> Awaitable[list[int]]:
        return self._stream.__anext__()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await close_stream(self._stream)
        finally:
            self._drain.release()


def find_drain(app: object) -> Drain | None:
    """The `Drain` of an ASGI app as uvicorn holds it (`app.drain`, under uvicorn's
    wrappers)."""
    # Imported here: the transport package imports this module.
    from hotloop.transport.asgi import find_inner

    return find_inner(app, "drain", Drain)


__all__ = ["Drain", "ShuttingDown", "find_drain"]
