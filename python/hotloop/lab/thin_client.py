"""Thin clients for many concurrent agents: one raw socket each, HTTP/1.1 with
server-sent events or a WebSocket, read by an asyncio protocol that looks at each event
only for what a turn's measurement needs (its first delta, its terminal event).

Why not `hotloop.lab.agent`'s transports (httpx, `websockets`): with hundreds of tokens a
turn and dozens of agents, those spend tens of microseconds of the client's one core on
each event, and a capacity run must not measure its own client. Here an event costs a
search for a few bytes; only the terminal event is parsed as JSON.

The WebSocket side is the client half of RFC 6455 for text frames: the handshake, masked
frames out (a zero masking key: a server must unmask whatever the key), unmasked frames
in, pings answered. The HTTP side is a keep-alive HTTP/1.1 connection with `Content-Length`
requests and chunked or sized responses.

This module owns only the wire; the agents and their measurement are `capacity`'s.
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

TERMINAL = (
    b'"response.completed"',
    b'"response.failed"',
    b'"response.incomplete"',
    b'"type":"error"',
)
HEAD_LIMIT = 64 * 1024


class WireError(Exception):
    """The server broke the exchange: an error status, a closed connection, a frame or
    a response we cannot read."""


@dataclass
class Turn:
    """One request's answer as the client saw it (times from `time.perf_counter`)."""

    sent_at: float
    first_delta_at: float = 0.0
    done_at: float = 0.0
    terminal: str = ""
    response: dict[str, Any] = field(default_factory=dict)


def _classify(event: bytes, turn: Turn) -> bool:
    """Fold one event (a JSON object's bytes) into `turn`; True once it is terminal. The
    type is near the start of every event the gateways send; deltas are most events."""
    head = event[:80]
    if b'.delta"' in head:
        if not turn.first_delta_at:
            turn.first_delta_at = time.perf_counter()
        return False
    for kind in TERMINAL:
        if kind in head:
            turn.done_at = time.perf_counter()
            data = orjson.loads(event)
            turn.terminal = data.get("type", "")
            turn.response = data.get("response") or {"error": data.get("error")}
            return True
    return False


class _Exchange(asyncio.Protocol):
    """The connection's half that waits: one turn at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.turn: Turn | None = None
        self.done: asyncio.Future[Turn] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(WireError(f"the server closed the connection ({exc or 'eof'})"))

    def _fail(self, error: Exception) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(error)

    def _finish(self) -> None:
        if self.done is not None and self.turn is not None and not self.done.done():
            self.done.set_result(self.turn)

    def _start(self, payload: bytes | list[bytes]) -> asyncio.Future[Turn]:
        if self.closed or self.transport is None:
            raise WireError("the connection is closed")
        self.done = asyncio.get_running_loop().create_future()
        self.turn = Turn(sent_at=time.perf_counter())
        if isinstance(payload, list):
            self.transport.writelines(payload)
        else:
            self.transport.write(payload)
        return self.done

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()


class SseConnection(_Exchange):
    """`POST path` with a JSON body, a streamed response of server-sent events."""

    def __init__(self, host: str, path: str, headers: bytes) -> None:
        super().__init__()
        self._head_lines = b"POST %s HTTP/1.1\r\nHost: %s\r\n%s" % (
            path.encode(),
            host.encode(),
            headers,
        )
        self._buffer = bytearray()
        self._in_head = True
        self._chunked = False
        self._left = 0  # bytes of the current chunk (or sized body) still to come
        self._events = bytearray()

    async def post(self, body: bytes) -> Turn:
        head = self._head_lines + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        return await self._start([head % len(body), body])

    def data_received(self, data: bytes) -> None:
        if self.turn is None:
            return
        self._buffer += data
        try:
            self._read()
        except WireError as e:
            self._fail(e)
            self.close()

    def _read(self) -> None:
        buffer = self._buffer
        if self._in_head:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > HEAD_LIMIT:
                    raise WireError("a response head over 64 KiB")
                return
            head = bytes(buffer[:end]).decode("latin-1")
            del buffer[: end + 4]
            status = head.split(" ", 2)[1]
            lower = head.lower()
            if status != "200":
                raise WireError(f"HTTP {status}: {head[:300]}")
            self._in_head = False
            self._chunked = "transfer-encoding: chunked" in lower
            if not self._chunked:
                length = [
                    line.split(":", 1)[1]
                    for line in lower.split("\r\n")
                    if "content-length" in line
                ]
                self._left = int(length[0]) if length else 1 << 62
        while buffer:
            if self._chunked and self._left == 0:
                line_end = buffer.find(b"\r\n")
                if line_end < 0:
                    return
                size = int(bytes(buffer[:line_end]).split(b";")[0], 16)
                if size == 0:
                    del buffer[:]
                    self._end()
                    return
                if len(buffer) < line_end + 2 + size + 2:
                    return  # the whole chunk and its CRLF, then one pass
                self._events += buffer[line_end + 2 : line_end + 2 + size]
                del buffer[: line_end + 2 + size + 2]
            elif not self._chunked:
                take = min(len(buffer), self._left)
                self._events += buffer[:take]
                del buffer[:take]
                self._left -= take
                if self._left == 0:
                    self._end()
                    return
            self._scan()

    def _scan(self) -> None:
        events = self._events
        start = 0
        while True:
            end = events.find(b"\n\n", start)
            if end < 0:
                break
            data = events.find(b"data: ", start, end)
            if data >= 0 and self.turn is not None:
                _classify(bytes(events[data + 6 : end]), self.turn)
            start = end + 2
        del events[:start]

    def _end(self) -> None:
        self._scan()
        self._in_head = True
        self._chunked = False
        self._left = 0
        self._events.clear()
        if self.turn is not None and not self.turn.terminal:
            self._fail(WireError("the stream ended without a terminal event"))
        self._finish()


class WebSocketConnection(_Exchange):
    """Text frames both ways after an upgrade; a request is one frame."""

    def __init__(self) -> None:
        super().__init__()
        self._buffer = bytearray()
        self._upgraded: asyncio.Future[None] | None = None
        self._fragments = bytearray()

    async def upgrade(self, host: str, path: str, headers: bytes) -> None:
        assert self.transport is not None
        self._upgraded = asyncio.get_running_loop().create_future()
        key = base64.b64encode(os.urandom(16))
        self.transport.write(
            b"GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n%s\r\n"
            % (path.encode(), host.encode(), key, headers)
        )
        await self._upgraded

    async def send(self, text: bytes) -> Turn:
        return await self._start(_frame(0x1, text))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._upgraded is not None and not self._upgraded.done():
            self._upgraded.set_exception(WireError("closed during the upgrade"))
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        try:
            if self._upgraded is not None and not self._upgraded.done():
                end = self._buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(self._buffer[:end]).decode("latin-1")
                del self._buffer[: end + 4]
                if " 101 " not in head.split("\r\n", 1)[0] + " ":
                    raise WireError(f"upgrade refused: {head[:300]}")
                self._upgraded.set_result(None)
            self._read()
        except WireError as e:
            if self._upgraded is not None and not self._upgraded.done():
                self._upgraded.set_exception(e)
            self._fail(e)
            self.close()

    def _read(self) -> None:
        buffer = self._buffer
        start = 0
        size = len(buffer)
        while size - start >= 2:
            first, second = buffer[start], buffer[start + 1]
            length = second & 0x7F
            offset = start + 2
            if length == 126:
                if size - offset < 2:
                    break
                (length,) = struct.unpack_from("!H", buffer, offset)
                offset += 2
            elif length == 127:
                if size - offset < 8:
                    break
                (length,) = struct.unpack_from("!Q", buffer, offset)
                offset += 8
            if second & 0x80:
                raise WireError("a server frame is masked")
            if size - offset < length:
                break
            payload = bytes(buffer[offset : offset + length])
            start = offset + length
            self._frame(first & 0x0F, bool(first & 0x80), payload)
        del buffer[:start]

    def _frame(self, opcode: int, final: bool, payload: bytes) -> None:
        if opcode == 0x9:  # ping
            assert self.transport is not None
            self.transport.write(_frame(0xA, payload))
            return
        if opcode == 0x8:
            raise WireError(f"the server closed the socket: {payload[2:200]!r}")
        if opcode in (0x1, 0x0):
            if not final or self._fragments:
                self._fragments += payload
                if not final:
                    return
                payload = bytes(self._fragments)
                self._fragments.clear()
            if self.turn is not None and _classify(payload, self.turn):
                self._finish()


def _frame(opcode: int, payload: bytes) -> bytes:
    """A final client frame: masked with the zero key, so the payload goes as it is."""
    length = len(payload)
    if length < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | length)
    elif length < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
    return head + b"\0\0\0\0" + payload


def _headers(api_key: str | None) -> bytes:
    return b"Authorization: Bearer %s\r\n" % api_key.encode() if api_key else b""


async def open_sse(base_url: str, api_key: str | None) -> SseConnection:
    """A keep-alive connection posting to `base_url` + `/responses`."""
    parts = urlsplit(base_url)
    assert parts.hostname is not None, base_url
    loop = asyncio.get_running_loop()
    headers = _headers(api_key) + b"Accept: text/event-stream\r\n"
    path = parts.path.rstrip("/") + "/responses"
    _, connection = await loop.create_connection(
        lambda: SseConnection(parts.netloc, path, headers), parts.hostname, parts.port or 80
    )
    return connection


async def open_websocket(ws_url: str, api_key: str | None) -> WebSocketConnection:
    parts = urlsplit(ws_url)
    assert parts.hostname is not None, ws_url
    loop = asyncio.get_running_loop()
    _, connection = await loop.create_connection(
        WebSocketConnection, parts.hostname, parts.port or 80
    )
    await connection.upgrade(parts.netloc, parts.path, _headers(api_key))
    return connection
