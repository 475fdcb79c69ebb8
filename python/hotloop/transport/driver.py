"""The one action driver: executes a sans-I/O `Connection`'s actions (`Generate`,
`Render`, `Persist`, `McpCall`, `Wait`, `Cancel`, `Close`, frames) with asyncio, for every
transport. A transport gives it only its way to emit (`Outlet`: an awaited send, a
plain write tried first, a close) and its options; the WebSocket socket
(`websocket.py`), an HTTP exchange (`http.py`) and a background response
(`background.py`) each drive their connection through one `Driver`. (websockets keeps
one sans-I/O protocol and one driver per I/O framework; hotloop has one I/O framework.)

Work runs as tasks of the driver, one per response being generated (engine ids in),
rendered in a worker thread, committed to the store before its terminal event, or
waiting for MCP calls; a writer task sends frames that no task is there to send. Frames
go out in order through one outbox; the task that filled it sends them itself, so a
streamed token costs no hop through another task.

Options: backpressure (`high_water`: generation pauses while the outbox holds more
bytes, so a slow reader cannot grow server memory without bound; none: the engine
waits only for the send it made itself), coalescing (`coalesce`: a response's engine
batches merged over that many seconds, `coalesced`), a turn's phases up to its first
delta (`phases`, `hotloop.turnclock`) and the sampled CPU of streaming (`stream_cpu`).
Every protocol decision is the `Connection`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass

from hotloop._core import CoreError
from hotloop.engines.base import (
    ENGINE_CACHED,
    EngineError,
    EngineSession,
    close_stream,
    coalesced,
)
from hotloop.mcp_client import McpClient
from hotloop.metrics import StreamCpu, TurnPhases
from hotloop.protocol import (
    Cancel,
    Close,
    Connection,
    Finished,
    Generate,
    Later,
    McpCall,
    Persist,
    Render,
    Wait,
)
from hotloop.protocol.actions import Action
from hotloop.protocol.connection_cache import ConversationStart
from hotloop.store import StoreError
from hotloop.transport.mcp import run_calls
from hotloop.turnclock import TURN_CLOCK, TurnClock

log = logging.getLogger("hotloop.driver")

Commit = Callable[[Finished], Awaitable[ConversationStart | None]]
"""Starts committing a `store=true` response durably (`Ledger.persist`); what it
returns raises StoreError when the commit failed."""


@dataclass(frozen=True)
class Outlet:
    """A transport's way to emit its connection's frames."""

    send: Callable[[list[bytes]], Awaitable[None]]
    """Send frames, in order (awaited: the transport's own flow control)."""
    write: Callable[[list[bytes]], bool] | None = None
    """Write frames without an await if the transport can take them now (False: it
    could not, `send` them)."""
    close: Callable[[Close], Awaitable[None]] | None = None
    """Close the transport after the frames before it (WebSocket only)."""
    batch: bool = True
    """The frames ready together go out in one `send`; else one frame per `send`."""


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
        # Shielded: a transport that closes stops waiting, the commit goes on (the drain
        # holds shutdown for it).
        continued = await asyncio.shield(commit)
    except StoreError as e:
        connection.persist_failed(work.key, e.message)
    else:
        connection.persist_done(work.key, continued)


class Driver:
    """Executes one connection's actions until the transport closes it (see the module
    docstring)."""

    def __init__(
        self,
        connection: Connection,
        session: EngineSession,
        outlet: Outlet,
        *,
        mcp: McpClient,
        commit: Commit | None = None,
        high_water: int | None = None,
        coalesce: float = 0.0,
        phases: TurnPhases | None = None,
        transport: str = "websocket",
        stream_cpu: StreamCpu | None = None,
    ) -> None:
        """`session`: the engine's, for this driver alone (`close` closes it).
        `commit`: how `Persist` work is done (required when the connection is durable).
        `high_water`: outbox bytes past which generation pauses (none: no pause).
        `coalesce`: seconds over which a response's engine batches are merged (0: every
        batch as it comes). `phases`: where each turn's phases up to its first delta go,
        as `transport`'s (none: not timed). `stream_cpu`: where sampled streaming
        batches add their CPU time (none: not sampled)."""
        self.connection = connection
        self._session = session
        self._outlet = outlet
        self._mcp = mcp
        self._commit = commit
        self._high_water = high_water
        self._coalesce = coalesce
        self._phases = phases
        self._transport = transport
        self._stream_cpu = stream_cpu
        self.clock: TurnClock | None = None
        """The clock of the last request read, until the engine work it leads to starts
        (set by the transport; the first `Generate` after it takes it)."""
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
        """Engine work, offloaded renders and MCP calls, by key (all end with the
        driver)."""
        self._persisting: dict[int, asyncio.Task[None]] = {}
        """Commits before a terminal event, by key (a commit outlives the driver in the
        store; only the wait for it ends)."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._sending = False
        self._done = False
        """The close went out, or the client is gone: nothing more to send."""
        self._closed = False
        self._writer: asyncio.Task[None] | None = None
        """Started with the first action (a driver may be made outside the loop)."""

    @property
    def outbox_bytes(self) -> int:
        """Bytes of frames waiting for the client."""
        return self._outbox_bytes

    @property
    def working(self) -> bool:
        """Some response is rendering, generating, calling tools or being committed."""
        return bool(self._generating or self._persisting)

    async def idle(self) -> None:
        """Return once no response is rendering, generating or being committed and every
        frame it produced has been sent (or the client is gone)."""
        while not self._idle.is_set():
            await self._idle.wait()

    async def settle(self) -> None:
        """`idle`, after sending what is queued now (frames the caller dispatched
        without anything there to send them)."""
        if self._outbox and not self._done:
            self._idle.clear()
            self.wake()
        await self.idle()

    def wake(self) -> None:
        """Something outside a task of the driver queued frames: the writer sends them."""
        self._writing()
        self._has_output.set()

    def _writing(self) -> None:
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def close(self) -> None:
        """Stop: cancel every task of the driver and every timer, then close the engine
        session (a commit goes on in the store). Once; later calls return at once."""
        if self._closed:
            return
        self._closed = True
        for wait in self._waits.values():
            wait.cancel()
        tasks = [*self._generating.values(), *self._persisting.values()]
        for task in tasks:
            task.cancel()
        writer = self._writer
        if writer is not None:
            if self._sending:
                writer.cancel()  # it may be the one waiting for the transport
            else:
                # Waiting for output: woken, it returns. Not cancelled, whose traceback
                # would hold the driver in a cycle with the task (one per HTTP request).
                self._has_output.set()
            tasks.append(writer)
        await asyncio.gather(*tasks, return_exceptions=True)
        self._idle.set()
        await self._session.close()

    def dispatch(self, actions: Iterable[Action] | None = None) -> None:
        """Start `actions` (by default the connection's pending ones); their `Later`
        bookkeeping runs after the tasks they started have taken their first step (the
        loop runs callbacks in the order they were scheduled), which writes an
        upstream's request."""
        self._writing()
        later: list[Callable[[], None]] = []
        for action in self.connection.actions() if actions is None else actions:
            if isinstance(action, bytes):
                self._outbox.append(action)
                self._outbox_bytes += len(action)
            elif isinstance(action, Generate):
                # The first engine work after a request is that request's turn.
                clock, self.clock = self.clock, None
                self._start(action.key, self._generate(action, clock))
            elif isinstance(action, Render):
                self._start(action.key, self._render(action))
            elif isinstance(action, Persist):
                assert self._commit is not None, "a durable connection needs a commit function"
                # Started here, synchronously: it is in flight for the drain before the
                # generation that produced it ends.
                commit = self._commit(action.finished)
                self._persisting[action.key] = asyncio.create_task(self._persist(action, commit))
                self._idle.clear()
            elif isinstance(action, McpCall):
                self._start(action.key, self._mcp_calls(action))
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
            elif isinstance(action, Later):
                later.append(action.run)
            else:
                self._outbox.append(action)
        if later:
            loop = asyncio.get_running_loop()
            for run in later:
                loop.call_soon(run)
        high_water = self._high_water
        if high_water is not None and self._outbox_bytes > high_water and self._has_room.is_set():
            self._has_room.clear()
            self.paused.set()
            self.stalls += 1

    async def room(self) -> None:
        """Return once the outbox is below its high-water mark (backpressure)."""
        if not self._has_room.is_set():
            await self._has_room.wait()

    def _start(self, key: int, work: Awaitable[None]) -> None:
        self._generating[key] = asyncio.ensure_future(work)
        self._idle.clear()

    def _wait_expired(self, key: int) -> None:
        del self._waits[key]
        self.connection.wait_expired(key)
        self.dispatch()
        self._has_output.set()

    # ---------------------------------------------------------------- the actions

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
                if stream_cpu is not None and phase == 0:
                    start = time.thread_time()
                if clock is not None:
                    clock.handed()
                more = connection.engine_output(key, ids)
                self.dispatch()
                await self.flush()
                if clock is not None and connection.streaming(key):
                    if self._phases is not None:
                        self._phases.record(self._transport, work.serving.response_id, clock)
                    clock = None
                    TURN_CLOCK.set(None)
                if stream_cpu is not None:
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
            # The terminal frames from this task, as every delta's: handed to the
            # writer task they waited a loop iteration for it (about 0.16 ms a turn).
            self.dispatch()
            await self.flush()
        except EngineError as e:
            connection.engine_failed(key, e)
        except Exception as e:
            # A bug in an engine must still end the response with a terminal event.
            log.exception("engine failed on response %d", key)
            connection.engine_failed(key, EngineError("engine_crashed", repr(e)))
        finally:
            # Before the stream closes: a commit it hands out holds the drain first.
            self.dispatch()
            try:
                if ids_stream is not None:
                    await close_stream(ids_stream)
            finally:
                if self._generating.get(key) is asyncio.current_task():
                    del self._generating[key]
                # The terminal frames: this task may be cancelled, so the writer sends them.
                self._has_output.set()

    async def _render(self, work: Render) -> None:
        try:
            await render_off_loop(self.connection, work)
        finally:
            self._generating.pop(work.key, None)
        self.dispatch()
        await self.flush()

    async def _mcp_calls(self, work: McpCall) -> None:
        try:
            await run_calls(self._mcp, self.connection, work)
        finally:
            # Before the connection hands out more work (a `Cancel` of this key would
            # cancel this very task).
            self._generating.pop(work.key, None)
        self.dispatch()
        await self.flush()

    async def _persist(self, work: Persist, commit: Awaitable[ConversationStart | None]) -> None:
        try:
            await persist(self.connection, work, commit)
        finally:
            self._persisting.pop(work.key, None)
        self.dispatch()
        await self.flush()

    # ---------------------------------------------------------------- writing

    async def _write(self) -> None:
        """Send what was queued where no task could send it (timer callbacks, the end
        of a generation, a sender cancelled mid-frame)."""
        while not self._done:
            await self._has_output.wait()
            if self._closed:
                return
            self._has_output.clear()
            await self.flush()

    async def flush(self) -> None:
        """Send the outbox in order. One task sends at a time: another caller returns
        at once, and the sender in progress also sends what it queued."""
        if self._sending or self._done:
            return
        self._sending = True
        outlet = self._outlet
        outbox = self._outbox
        try:
            while outbox:
                item = outbox[0]
                if isinstance(item, Close):
                    if outlet.close is not None:
                        await outlet.close(item)
                    self._finish()
                    return
                frames = self._ready_frames() if outlet.batch else [item]
                write = outlet.write
                if write is None or not write(frames):
                    await outlet.send(frames)
                # Dequeued only once sent: a sender cancelled while the server waited
                # for the transport leaves the frames to the next one.
                for frame in frames:
                    outbox.popleft()
                    self._outbox_bytes -= len(frame)
                # Resume at half the mark, so a reader at the limit does not make
                # generation stop and start on every frame.
                if (
                    self.paused.is_set()
                    and self._high_water is not None
                    and self._outbox_bytes <= self._high_water // 2
                ):
                    self._resume()
            if self.paused.is_set():
                self._resume()
        except OSError:
            # The client is gone (uvicorn's ClientDisconnected); the transport sees the
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


__all__ = ["Commit", "Driver", "Outlet", "persist", "render_off_loop"]
