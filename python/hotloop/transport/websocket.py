"""One WebSocket connection's I/O: the upgrade (auth, mode off), then a reader (client
frames in) around one sans-I/O `Connection`, whose actions the one `Driver`
(`driver.py`) executes with this socket's way to emit (frames in one send, written
without an await while the client keeps up, the close).

It owns only WebSocket concerns: the driver's options (backpressure at the send
buffer's high-water mark, coalescing, the turn clock from uvicorn's receipt of a
frame), the lifetime timer, parsing large frames in worker threads, awaiting the store
for a continuation the cache misses, and ending the connection's work when the client
disconnects. Every protocol decision is the `Connection`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from hotloop.engines.base import EngineSession
from hotloop.events import error_body
from hotloop.mcp_client import McpClient, McpSettings
from hotloop.metrics import StreamCpu, TurnPhases
from hotloop.protocol import Close, Connection, Parsed, ProtocolError, offloads
from hotloop.store import StoreError
from hotloop.transport.asgi import RECEIVE_UTF8, RECEIVED_NS, SEND_FRAMES, Receive, Scope, Send
from hotloop.transport.driver import Commit, Driver, Outlet
from hotloop.transport.mcp import listed
from hotloop.turnclock import TurnClock

log = logging.getLogger("hotloop.websocket")

WriteFrames = Callable[[list[bytes]], bool]
"""The server's plain frame writer (`hotloop.transport.asgi.WRITE_FRAMES`)."""


async def deny(
    scope: Scope,
    send: Send,
    status: int,
    code: str,
    message: str,
    retry_after: int | None = None,
    extra_headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Refuse the upgrade with an HTTP status and a JSON error body (when the server
    supports the ASGI denial-response extension; otherwise a plain close, 403)."""
    if "websocket.http.response" in scope.get("extensions", {}):
        body = error_body(code, message, None, status, retry_after)
        headers = [(b"content-type", b"application/json"), *extra_headers]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        if retry_after is not None:
            headers.append((b"retry-after", str(retry_after).encode()))
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})


class Socket:
    """Drives one accepted connection until either side closes it."""

    def __init__(
        self,
        connection: Connection,
        session: EngineSession,
        send: Send,
        *,
        high_water: int,
        lifetime: float,
        send_frames: bool = False,
        write_frames: WriteFrames | None = None,
        stream_cpu: StreamCpu | None = None,
        phases: TurnPhases | None = None,
        commit: Commit | None = None,
        warm: Callable[[Parsed], Awaitable[None]] | None = None,
        coalesce: float = 0.0,
        mcp: McpClient | None = None,
    ) -> None:
        """`send_frames`: the server offers `hotloop.websocket.send_frames` (see
        `hotloop.transport.frames`); the frames ready together then go out in one send.
        `write_frames`: its plain writer (`WRITE_FRAMES`), used before the send: while
        the client keeps up, a streamed token's frame costs no message and no await.
        `stream_cpu`: where sampled streaming batches add their CPU time (the process's
        metrics; a socket of its own otherwise). `phases`: where each turn's phases up to
        its first delta are recorded (`hotloop.turnclock`; none: not timed). `commit`: how
        `Persist` work is done (required when the connection is durable). `warm`: awaited
        with a request that names a `previous_response_id` or a `conversation` before the
        request reaches the
        connection, to rebuild it from the store when the cache misses it (`Ledger.warm`,
        `Ledger.warm_conversation`). `coalesce`: seconds
        over which a response's engine batches are merged into one (see `coalesced`;
        0: every batch as it comes). `mcp`: how `mcp` tools are listed and called (none
        allowed without it)."""
        self.connection = connection
        self._mcp = mcp or McpClient(McpSettings())
        self._warm = warm
        self._phases = phases
        self._send = send
        self._lifetime = lifetime
        batch = send_frames or write_frames is not None
        self.driver = Driver(
            connection,
            session,
            Outlet(
                self._send_frames if batch else self._send_texts, write_frames, self._close, batch
            ),
            mcp=self._mcp,
            commit=commit,
            high_water=high_water,
            coalesce=coalesce,
            phases=phases,
            transport="websocket",
            stream_cpu=stream_cpu or StreamCpu(),
        )

    @property
    def stalls(self) -> int:
        """How often generation paused because the client read too slowly."""
        return self.driver.stalls

    @property
    def paused(self) -> asyncio.Event:
        """Set while generation is paused until the client reads (health and tests)."""
        return self.driver.paused

    @property
    def outbox_bytes(self) -> int:
        """Bytes of frames waiting for the client."""
        return self.driver.outbox_bytes

    async def idle(self) -> None:
        """Return once no response of this connection is rendering, generating or
        being committed and every frame it produced has been sent (a draining server
        closes the socket then, so the client reconnects elsewhere without losing a
        response)."""
        await self.driver.idle()

    async def drain(self) -> None:
        """The server shuts down: a response waiting for tool output ends now (see
        `Connection.shutting_down`), then return once the connection is idle (`idle`)."""
        self.connection.shutting_down()
        self.driver.dispatch()
        # Its terminal frames may not be sent yet.
        await self.driver.settle()

    async def run(self, receive: Receive) -> None:
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self._lifetime, self._expire)
        try:
            await self._read(receive)
        finally:
            timer.cancel()
            # Also after a lifetime close: the cache must leave the global budget.
            self.connection.connection_lost()
            self.driver.dispatch()
            await self.driver.close()

    # ---------------------------------------------------------------- the outlet

    async def _send_frames(self, frames: list[bytes]) -> None:
        await self._send({"type": SEND_FRAMES, "frames": frames})

    async def _send_texts(self, frames: list[bytes]) -> None:
        for frame in frames:
            await self._send({"type": "websocket.send", "text": frame.decode()})

    async def _close(self, close: Close) -> None:
        await self._send({"type": "websocket.close", "code": close.code, "reason": close.reason})

    # ---------------------------------------------------------------- reading

    async def _read(self, receive: Receive) -> None:
        connection = self.connection
        while True:
            message = await receive()
            kind = message["type"]
            if kind == "websocket.receive":
                if self._phases is not None:
                    read = time.perf_counter_ns()
                    self.driver.clock = TurnClock(message.get(RECEIVED_NS, read), read)
                text = message.get("text")
                if text is None:
                    text = message.get(RECEIVE_UTF8)
                if text is not None:
                    parsed = await self._parse(text)
                    if parsed is None:
                        log.debug("closing a WebSocket (1007): a text message is not valid UTF-8")
                        await self._send({"type": "websocket.close", "code": 1007})
                        return
                    connection.receive_parsed(parsed)
                else:
                    connection.receive_bytes(message.get("bytes") or b"")
                driver = self.driver
                driver.dispatch()
                await driver.flush()
                # A client that writes without reading is paused here too.
                await driver.room()
            elif kind == "websocket.disconnect":
                return

    async def _parse(self, text: str | bytes) -> Parsed | None:
        """Parse a frame, a large one in a worker thread; then warm its continuation.
        The reader awaits both, so frames still reach the connection in arrival order
        (and the order of requests within a lane holds). `bytes`: a large text message's
        UTF-8 payload (`RECEIVE_UTF8`), decoded in the worker thread too; None when it is
        not UTF-8."""
        connection = self.connection
        if isinstance(text, bytes):
            parsed = await asyncio.to_thread(self._decode_and_parse, text)
            if parsed is None:
                return None
        elif offloads(text):
            parsed = await asyncio.to_thread(connection.parse, text)
        else:
            parsed = connection.parse(text)
        parsed = await listed(self._mcp, connection, parsed)
        parent = parsed.previous_response_id or parsed.conversation
        if parent is not None and self._warm is not None:
            try:
                await self._warm(parsed)
            except StoreError as e:
                # Another node may have committed it: the connection refuses the request
                # as `store_unavailable` (retryable), not as an unknown id.
                connection.store_unavailable(parent, e.message)
            except ProtocolError as e:
                connection.cannot_continue(parent, e)
        return parsed

    def _decode_and_parse(self, payload: bytes) -> Parsed | None:
        try:
            text = payload.decode()
        except UnicodeDecodeError:
            return None
        return self.connection.parse(text)

    def _expire(self) -> None:
        self.connection.lifetime_reached()
        self.driver.dispatch()
        self.driver.wake()
