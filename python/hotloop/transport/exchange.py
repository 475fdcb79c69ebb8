"""One HTTP exchange of the Responses API, as the routes of `http.py` and the background
responses' routes (`background.py`) both run it: the observer of its `Connection`, the
connection's first actions, and the reply (a JSON body, in pieces; a refusal the
protocol built; SSE frames), until the client goes away."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson

from hotloop.ledger import Books
from hotloop.mcp_client import McpClient
from hotloop.protocol import Connection, ConnectionCache, Finished, McpCall, Render
from hotloop.protocol.errors import ProtocolError
from hotloop.transport.asgi import Receive, Send
from hotloop.transport.driver import render_off_loop
from hotloop.transport.mcp import run_calls

Emit = Callable[[list[bytes]], Awaitable[None]]
"""Where an exchange's frames go: each batch of the connection's actions, in order (an
SSE reply writes a batch as one piece: one write per engine batch, not per event)."""

ENDINGS = frozenset((b"response.completed", b"response.failed", b"response.incomplete"))
"""The events that end a response (`event_type`): nothing of it streams after them."""
JSON = b"application/json"
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class Exchange:
    """The observer of one HTTP request's `Connection`: keeps the finished response
    for the reply, unnames `store=false` state in the process cache (nothing continues
    such a response by id; a client that resends its history finds its state by
    content, `history.py`), and books the response."""

    def __init__(self, books: Books, cache: ConnectionCache) -> None:
        self._books = books
        self._cache = cache
        self.result: Finished | None = None

    def finished(self, response: Finished) -> None:
        self.result = response
        if not response.request.store:
            self._cache.unname(response.response_id)
        self._books.ledger.record(response, "http")


async def rendered(connection: Connection, mcp: McpClient) -> list[Any]:
    """The connection's actions once its request rendered: a large one off the event
    loop, one that approved MCP calls after they ran (the turn goes on after them)."""
    actions = connection.actions()
    while (work := next((a for a in actions if isinstance(a, Render | McpCall)), None)) is not None:
        if isinstance(work, Render):
            await render_off_loop(connection, work)
        else:
            await run_calls(mcp, connection, work)
        actions = [a for a in actions if a is not work] + connection.actions()
    return actions


async def reply(
    send: Send,
    status: int,
    body: bytes | list[bytes],
    content_type: bytes = JSON,
    retry_after: int | None = None,
) -> None:
    """Reply `body`, or a body given in pieces, written one piece at a time: the
    server waits for the socket to drain between them, so that a large body neither
    holds the event loop for its whole write nor is queued whole in its buffers."""
    pieces = [body] if isinstance(body, bytes) else body
    length = sum(map(len, pieces))
    headers = [(b"content-type", content_type), (b"content-length", str(length).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    for piece in pieces[:-1]:
        await send({"type": "http.response.body", "body": piece, "more_body": True})
    await send({"type": "http.response.body", "body": pieces[-1] if pieces else b""})


async def reply_refusal(send: Send, frame: bytes) -> None:
    """A request the protocol refused: the WebSocket envelope becomes status + body
    (and its `error.headers["retry-after"]`, the HTTP header)."""
    event = orjson.loads(frame)
    error = event["error"]
    retry_after = error.get("headers", {}).get("retry-after")
    await reply(
        send,
        event["status"],
        orjson.dumps({"error": error}),
        retry_after=None if retry_after is None else int(retry_after),
    )


def not_found(response_id: str) -> ProtocolError:
    return ProtocolError(
        "response_not_found", f"No response found with id '{response_id}'.", status=404
    )


def sse_frame(frame: bytes) -> bytes:
    """One server event as an SSE frame: `event: <type>`, `data: <payload>`."""
    return sse_frames((frame,))


def sse_frames(frames: Iterable[bytes]) -> bytes:
    """Server events as SSE frames (`sse_frame`), joined in one copy of each event."""
    parts: list[bytes] = []
    for frame in frames:
        kind = event_type(frame) or str(orjson.loads(frame).get("type", "message")).encode()
        parts += (b"event: ", kind, b"\ndata: ", frame, b"\n\n")
    return b"".join(parts)


def event_type(frame: bytes) -> bytes:
    """The `type` of an event serialised with it first (`events.py`), else empty."""
    if frame.startswith(b'{"type":"'):
        end = frame.find(b'"', 9)
        if end > 9:
            return frame[9:end]
    return b""


async def disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


__all__ = [
    "ENDINGS",
    "JSON",
    "SSE_HEADERS",
    "Emit",
    "Exchange",
    "disconnected",
    "event_type",
    "not_found",
    "rendered",
    "reply",
    "reply_refusal",
    "sse_frame",
    "sse_frames",
]
