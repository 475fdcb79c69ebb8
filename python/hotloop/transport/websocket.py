"""One WebSocket connection's I/O: the upgrade (auth, mode off), then four kinds of
task around one sans-I/O `Connection`: the reader (client frames in), one task per
response being generated (engine ids in), one per response being committed to the store
before its terminal event, and a writer for frames that no task is there to send.
Frames go out in order through one bounded outbox; the task that filled it sends them
itself, so a streamed token costs no hop through another task.

It owns only I/O concerns: backpressure (generation pauses while the outbox is above
its high-water mark, so a slow reader cannot grow server memory without bound), the
lifetime timer, parsing and rendering large frames in worker threads, awaiting the
store for a continuation the cache misses, and cancelling generation when the client
disconnects. Every protocol decision is the `Connection`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from hotloop._core import CoreError
from hotloop.engines.base import (
    ENGINE_CACHED,
    EngineError,
    EngineSession,
    close_stream,
    coalesced,
)
from hotloop.events import error_body
from hotloop.mcp_client import McpClient, McpSettings
from hotloop.metrics import StreamCpu, TurnPhases
from hotloop.protocol import (
    Cancel,
    Close,
    Connection,
    Finished,
    Generate,
    McpCall,
    Parsed,
    Persist,
    ProtocolError,
    Render,
    Wait,
    offloads,
)
from hotloop.protocol.cache import ConversationStart
from hotloop.store import StoreError
from hotloop.transport.asgi import RECEIVE_UTF8, RECEIVED_NS, SEND_FRAMES, Receive, Scope, Send
from hotloop.transport.mcp import listed, run_calls
from hotloop.turnclock import TURN_CLOCK, TurnClock

log = logging.getLogger("hotloop.websocket")

WriteFrames = Callable[[list[bytes]], bool]
"""The server's plain frame writer (`hotloop.transport.asgi.WRITE_FRAMES`)."""

Commit = Callable[[Finished], Awaitable[ConversationStart | None]]
"""Starts committing a `store=true` response durably (`Ledger.persist`); what it
returns raises StoreError when the commit failed."""


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


async def render_off_loop(connection: Connection, work: Render) -> None:
    """Run a large render in a worker thread (the core releases the GIL for it) and
    hand its result back to the connection; the event loop serves everyone meanwhile.
    Cancelling the caller abandons the result: the thread finishes on its own, on a
    conversation nothing else holds."""
    try:
        request, turn = await asyncio.to_thread(work.run)
    except CoreError as e:
        connection.render_failed(work.key, e)
    else:
        connection.render_done(work.key, turn, request)


async def persist(
    connection: Connection, work: Persist, commit: Awaitable[ConversationStart | None]
) -> None:
    """Wait for a finished response's commit, then let the connection send its terminal
    event (or fail it when the store could not commit it)."""
    try:
        # Shielded: a socket that closes stops waiting, the commit goes on (the drain
        # holds shutdown for it).
        continued = await asyncio.shield(commit)
    except StoreError as e:
        connection.persist_failed(work.key, e.message)
    else:
        connection.persist_done(work.key, continued)


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
        self._commit = commit
        self._warm = warm
        self._send_frames = send_frames or write_frames is not None
        self._write_frames = write_frames
        self._stream_cpu = stream_cpu or StreamCpu()
        self._phases = phases
        self._clock: TurnClock | None = None
        """The clock of the last frame read, until the engine work it leads to starts."""
        self._session = session
        self._send = send
        self._high_water = high_water
        self._lifetime = lifetime
        self._coalesce = coalesce
        self._outbox: deque[bytes | Close] = deque()
        self._outbox_bytes = 0
        self._has_output = asyncio.Event()
        self._has_room = asyncio.Event()
        self._has_room.set()
        self.stalls = 0
        """How often generation paused because the client read too slowly."""
        self.paused = asyncio.Event()
        """Set while generation is paused until the client reads (health and tests)."""
        self._waits: dict[int, asyncio.TimerHandle] = {}
        """Idle timeouts of responses waiting for injected tool output, by key."""
        self._generating: dict[int, asyncio.Task[None]] = {}
        """Engine work and offloaded renders, by key (both end with the socket)."""
        self._persisting: dict[int, asyncio.Task[None]] = {}
        """Commits before a terminal event, by key (a commit outlives the socket in the
        store; only the wait for it ends)."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._sending = False
        self._done = False
        """The close frame went out, or the client is gone: nothing more to send."""

    @property
    def outbox_bytes(self) -> int:
        """Bytes of frames waiting for the client."""
        return self._outbox_bytes

    async def idle(self) -> None:
        """Return once no response of this connection is rendering, generating or
        being committed and every frame it produced has been sent (a draining server
        closes the socket then, so the client reconnects elsewhere without losing a
        response)."""
        while not self._idle.is_set():
            await self._idle.wait()

    async def drain(self) -> None:
        """The server shuts down: a response waiting for tool output ends now (see
        `Connection.shutting_down`), then return once the connection is idle (`idle`)."""
        self.connection.shutting_down()
        self._dispatch()
        if self._outbox and not self._done:
            # Its terminal frames are not sent yet.
            self._idle.clear()
            self._has_output.set()
        await self.idle()

    async def run(self, receive: Receive) -> None:
        loop = asyncio.get_running_loop()
        writer = asyncio.create_task(self._write())
        timer = loop.call_later(self._lifetime, self._expire)
        try:
            await self._read(receive)
        finally:
            timer.cancel()
            for wait in self._waits.values():
                wait.cancel()
            # Also after a lifetime close: the cache must leave the global budget.
            self.connection.connection_lost()
            self._dispatch()
            tasks = [*self._generating.values(), *self._persisting.values()]
            for task in tasks:
                task.cancel()
            writer.cancel()
            await asyncio.gather(writer, *tasks, return_exceptions=True)
            self._idle.set()
            await self._session.close()

    # ---------------------------------------------------------------- reading

    async def _read(self, receive: Receive) -> None:
        connection = self.connection
        while True:
            message = await receive()
            kind = message["type"]
            if kind == "websocket.receive":
                if self._phases is not None:
                    read = time.perf_counter_ns()
                    self._clock = TurnClock(message.get(RECEIVED_NS, read), read)
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
                self._dispatch()
                await self._flush()
                # A client that writes without reading is paused here too.
                if not self._has_room.is_set():
                    await self._has_room.wait()
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

    def _wait_expired(self, key: int) -> None:
        del self._waits[key]
        self.connection.wait_expired(key)
        self._dispatch()
        self._has_output.set()

    def _expire(self) -> None:
        self.connection.lifetime_reached()
        self._dispatch()
        self._has_output.set()

    # ---------------------------------------------------------------- the state machine's actions

    def _dispatch(self) -> None:
        for action in self.connection.actions():
            if isinstance(action, bytes):
                self._outbox.append(action)
                self._outbox_bytes += len(action)
            elif isinstance(action, Generate):
                # The first engine work after a frame is that frame's turn.
                clock, self._clock = self._clock, None
                task = asyncio.create_task(self._generate(action, clock))
                self._generating[action.key] = task
                self._idle.clear()
            elif isinstance(action, Render):
                self._generating[action.key] = asyncio.create_task(self._render(action))
                self._idle.clear()
            elif isinstance(action, Persist):
                assert self._commit is not None, "a durable connection needs a commit function"
                # Started here, synchronously: it is in flight for the drain before the
                # generation that produced it ends.
                commit = self._commit(action.finished)
                self._persisting[action.key] = asyncio.create_task(self._persist(action, commit))
                self._idle.clear()
            elif isinstance(action, McpCall):
                self._generating[action.key] = asyncio.create_task(self._mcp_calls(action))
                self._idle.clear()
            elif isinstance(action, Wait):
                self._waits[action.key] = asyncio.get_running_loop().call_later(
                    action.seconds, self._wait_expired, action.key
                )
            elif isinstance(action, Cancel):
                wait = self._waits.pop(action.key, None)
                if wait is not None:
                    wait.cancel()
                stopped = self._generating.pop(action.key, None)
                if stopped is not None:
                    stopped.cancel()
            else:
                self._outbox.append(action)
        if self._outbox:
            if self._outbox_bytes > self._high_water and self._has_room.is_set():
                self._has_room.clear()
                self.paused.set()
                self.stalls += 1

    async def _generate(self, work: Generate, clock: TurnClock | None = None) -> None:
        connection = self.connection
        key = work.key
        stream_cpu = self._stream_cpu
        batches = 0
        start = written = 0.0  # thread CPU clock: the sampled batch, the batch before it
        ids_stream: AsyncIterator[list[int]] | None = None
        try:
            if clock is not None:
                clock.start()
                TURN_CLOCK.set(clock)
            ids_stream = work.start(self._session)
            if self._coalesce > 0:
                ids_stream = coalesced(
                    ids_stream, self._coalesce, lambda: connection.streaming(key)
                )
            async for ids in ids_stream:
                batches += 1
                phase = batches % StreamCpu.EVERY
                if phase == 0:
                    start = time.thread_time()
                if clock is not None:
                    clock.handed()
                more = connection.engine_output(key, ids)
                self._dispatch()
                await self._flush()
                if clock is not None and connection.streaming(key):
                    assert self._phases is not None  # a clock is started only then
                    self._phases.record("websocket", work.serving.response_id, clock)
                    clock = None
                    TURN_CLOCK.set(None)
                if phase == 0:
                    stream_cpu.add(time.thread_time() - start, start - written, len(ids))
                elif phase == StreamCpu.EVERY - 1:
                    written = time.thread_time()
                if not more:
                    break
                # Backpressure: the engine waits while the client is behind.
                if not self._has_room.is_set():
                    await self._has_room.wait()
            connection.engine_done(key, ENGINE_CACHED.get())
        except EngineError as e:
            connection.engine_failed(key, e)
        except Exception as e:
            # A bug in an engine must still end the response with a terminal event.
            log.exception("engine failed on response %d", key)
            connection.engine_failed(key, EngineError("engine_crashed", repr(e)))
        finally:
            # Before the stream closes: a commit it hands out holds the drain first.
            self._dispatch()
            if ids_stream is not None:
                await close_stream(ids_stream)
            self._generating.pop(key, None)
            # The terminal frames: this task may be cancelled, so the writer sends them.
            self._has_output.set()

    async def _render(self, work: Render) -> None:
        try:
            await render_off_loop(self.connection, work)
        finally:
            self._generating.pop(work.key, None)
        self._dispatch()
        await self._flush()

    async def _mcp_calls(self, work: McpCall) -> None:
        try:
            await run_calls(self._mcp, self.connection, work)
        finally:
            # Before the connection hands out more work (a `Cancel` of this key would
            # cancel this very task).
            self._generating.pop(work.key, None)
        self._dispatch()
        await self._flush()

    async def _persist(self, work: Persist, commit: Awaitable[ConversationStart | None]) -> None:
        try:
            await persist(self.connection, work, commit)
        finally:
            self._persisting.pop(work.key, None)
        self._dispatch()
        await self._flush()

    # ---------------------------------------------------------------- writing

    async def _write(self) -> None:
        """Send what was queued where no task could send it (timer callbacks, the end
        of a generation, a sender cancelled mid-frame)."""
        while not self._done:
            await self._has_output.wait()
            self._has_output.clear()
            await self._flush()

    async def _flush(self) -> None:
        """Send the outbox in order. One task sends at a time: another caller returns
        at once, and the sender in progress also sends what it queued."""
        if self._sending or self._done:
            return
        self._sending = True
        send = self._send
        outbox = self._outbox
        try:
            while outbox:
                item = outbox[0]
                if isinstance(item, Close):
                    await send(
                        {"type": "websocket.close", "code": item.code, "reason": item.reason}
                    )
                    self._finish()
                    return
                if self._send_frames:
                    frames = self._ready_frames()
                    write = self._write_frames
                    if write is None or not write(frames):
                        await send({"type": SEND_FRAMES, "frames": frames})
                else:
                    frames = [item]
                    await send({"type": "websocket.send", "text": item.decode()})
                # Dequeued only once sent: a sender cancelled while uvicorn waited for
                # the transport leaves the frames to the next one.
                for frame in frames:
                    outbox.popleft()
                    self._outbox_bytes -= len(frame)
                # Resume at half the mark, so a reader at the limit does not make
                # generation stop and start on every frame.
                if self.paused.is_set() and self._outbox_bytes <= self._high_water // 2:
                    self._resume()
            if self.paused.is_set():
                self._resume()
        except OSError:
            # The client is gone (uvicorn's ClientDisconnected); the reader sees the
            # disconnect and cleans up.
            self._finish()
        finally:
            self._sending = False
            if outbox and not self._done:
                self._has_output.set()
            elif not self._generating and not self._persisting:
                self._idle.set()

    def _ready_frames(self) -> list[bytes]:
        """The frames at the head of the outbox, up to a close."""
        frames: list[bytes] = []
        for item in self._outbox:
            if isinstance(item, Close):
                break
            frames.append(item)
        return frames

    def _finish(self) -> None:
        self._done = True
        self._outbox.clear()
        self._outbox_bytes = 0
        self._resume()

    def _resume(self) -> None:
        self._has_room.set()
        self.paused.clear()
