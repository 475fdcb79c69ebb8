"""The client, the engine and the transport played against one `Connection` with plain
function calls (no sockets, no event loop): the sans-I/O driver of the protocol tests.
Frames the connection sends are validated with the SDK's models; the renders and
generations it hands out wait until the test runs them, so ordering is the test's."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from hotloop._core import ChatFormat, CoreError
from hotloop.engines.base import EngineSession, close_stream
from hotloop.protocol import (
    Action,
    Cancel,
    Close,
    Connection,
    ConnectionCache,
    Generate,
    Later,
    Observer,
    Persist,
    Render,
    Wait,
)
from hotloop.protocol.connection_cache import ConversationStart
from sdk_events import validate

FORMAT = ChatFormat.harmony()
ANSWER = FORMAT.completion_tokens(text="Hello there, friend.")


def sim_connection(
    cache: ConnectionCache, observer: Observer, chat_format: ChatFormat = FORMAT, **options: Any
) -> Connection:
    """A Connection over harmony (or `chat_format`) with a 1M-token window, serving the
    model `sim`."""
    return Connection(
        chat_format=chat_format,
        context_window=1 << 20,
        model="sim",
        cache=cache,
        observer=observer,
        **options,
    )


class ConnectionDriver:
    """Holds what a Connection handed out: renders and generations by key, the keys it
    cancelled, and the close it asked for."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.renders: dict[int, Render] = {}
        self.generating: dict[int, Generate] = {}
        self.persisting: dict[int, Persist] = {}
        self.waits: dict[int, Wait] = {}
        self.cancelled: list[int] = []
        self.closed: Close | None = None

    def pump(self) -> list[dict[str, Any]]:
        """Take the connection's actions; return the frames it sent."""
        frames = []
        for action in self.conn.actions():
            if isinstance(action, bytes):
                frames.append(self.frame(action))
            elif isinstance(action, Render):
                self.renders[action.key] = action
            elif isinstance(action, Generate):
                self.generating[action.key] = action
            elif isinstance(action, Persist):
                self.persisting[action.key] = action
            elif isinstance(action, Cancel):
                self.cancelled.append(action.key)
                # A waiting response's key names its idle timer, not engine work.
                self.waits.pop(action.key, None) or self.generating.pop(action.key)
            elif isinstance(action, Wait):
                self.waits[action.key] = action
            elif isinstance(action, Later):
                action.run()
            else:
                self.closed = action
        return frames

    def frame(self, frame: bytes) -> dict[str, Any]:
        """One frame the connection sent, checked."""
        return validate(frame)

    def send(self, event: dict[str, Any] | str) -> list[dict[str, Any]]:
        self.conn.receive_text(event if isinstance(event, str) else orjson.dumps(event).decode())
        return self.pump()

    def create(self, input: Any = "Hi", **fields: Any) -> list[dict[str, Any]]:
        return self.send({"type": "response.create", "model": "sim", "input": input, **fields})

    def render(self, key: int | None = None) -> list[dict[str, Any]]:
        """Run one handed-out render (here, on the test's thread) and report it."""
        work = self.renders.pop(min(self.renders) if key is None else key)
        try:
            request, turn = work.run()
        except CoreError as e:
            self.conn.render_failed(work.key, e)
        else:
            self.conn.render_done(work.key, turn, request)
        return self.pump()

    def commit(
        self,
        key: int | None = None,
        error: str | None = None,
        continued: ConversationStart | None = None,
    ) -> list[dict[str, Any]]:
        """Report one handed-out commit done (or failed with `error`); `continued`:
        where its conversation stands once its items were appended."""
        work = self.persisting.pop(min(self.persisting) if key is None else key)
        if error is None:
            self.conn.persist_done(work.key, continued)
        else:
            self.conn.persist_failed(work.key, error)
        return self.pump()

    def finish(self, key: int | None = None, ids: list[int] = ANSWER) -> list[dict[str, Any]]:
        """Run one generation to its end: feed `ids`, then report the engine done."""
        work = self.generating.pop(min(self.generating) if key is None else key)
        self.conn.engine_output(work.key, ids)
        self.conn.engine_done(work.key)
        return self.pump()


async def run_on(
    conn: Connection,
    session: EngineSession,
    ended: Callable[[], Awaitable[None]] | None = None,
    taken: list[Action] | None = None,
) -> list[dict[str, Any]]:
    """Run every piece of engine work `conn` hands out on a real engine `session`, one
    at a time, until none is left; return the frames it sent (validated). `ended` is
    awaited after each generation (to read the engine's own counters); `taken` are
    actions the test took from `conn` already. Idle timers and cancels of finished work
    are left alone."""
    frames: list[dict[str, Any]] = []
    actions = deque([*(taken or []), *conn.actions()])
    while actions:
        action = actions.popleft()
        if isinstance(action, bytes):
            frames.append(validate(action))
        elif isinstance(action, Later):
            action.run()
        elif isinstance(action, Generate):
            stream = action.start(session)
            try:
                async for ids in stream:
                    if not conn.engine_output(action.key, ids):
                        break
            finally:
                await close_stream(stream)
            if ended is not None:
                await ended()
            conn.engine_done(action.key)
        actions.extend(conn.actions())
    return frames
