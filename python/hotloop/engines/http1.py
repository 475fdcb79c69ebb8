"""The upstream engine's HTTP/1.1 client: keep-alive connections to replicas, the request
writer, and responses decoded in Rust from each socket read.

Owns the connections (`Link`, an asyncio protocol: one `ResponseReader.feed` call per
read in `data_received`, which parses the head, the chunked body and every complete
server-sent event of the read and returns the new token ids), the pool of idle ones
per origin and the limit on open ones (`Client`), the connect, read and response timeouts,
pausing a socket whose consumer falls behind (so the replica sees a slow reader and
nothing is buffered without bound), and closing the connection of an abandoned
exchange (how vLLM and SGLang learn a request was cancelled). It knows neither
dialects nor replicas' health: `hotloop.engines.upstream` does.

Why not httpx: a streamed token crossed httpx, httpcore, h11 and anyio's async
iterators (one coroutine step per layer per read), which cost more CPU than the rest of
the server's work per token (docs/upstream-streaming.md has the measurements).
"""

from __future__ import annotations

import asyncio
import contextvars
import socket
import ssl
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

from hotloop._core import ResponseReader
from hotloop.turnclock import TurnClock

PAUSE_IDS = 256
"""Ids held for a consumer that is behind before the socket stops reading: from then on
the replica's writes back up (its own flow control), not our memory."""

HOLD_BYTES = 32 * 1024
"""While a paced consumer waits between asks (`Link.hold_reads`), the socket's receive
low-water mark (SO_RCVLOWAT): the kernel reports it readable only once this much is
queued (hundreds of events) or the connection ends, so the events of a wait wake the
loop once, when the consumer asks, not one by one."""


class LinkError(Exception):
    """The transport failed: `timeout` (no connection or no byte within the timeout), or
    the connection failed or closed before the body's end. `stale`: a connection that
    was open closed before the response's head arrived (for a pooled keep-alive
    connection, the server dropped it as we reused it: a benign race, worth one retry)."""

    def __init__(self, message: str, *, timeout: bool = False, stale: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.timeout = timeout
        self.stale = stale


@dataclass(frozen=True)
class Origin:
    """Where requests to one base URL go, and what prefixes their paths."""

    host: str
    port: int
    tls: bool
    authority: str
    """The `Host` header."""
    prefix: str
    """The base URL's path (a router mounted under a path), prefixed to every request."""

    @classmethod
    def from_url(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"an upstream URL is http:// or https:// with a host: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        return cls(parts.hostname, port, tls, parts.netloc, parts.path.rstrip("/"))


class HeaderError(ValueError):
    """A header name or value that would break the request: a line break, a NUL, a
    character outside Latin-1."""


def header_lines(headers: dict[str, str]) -> bytes:
    """`name: value` lines (see `HeaderError`)."""
    out = bytearray()
    for name, value in headers.items():
        if any(c in name for c in ":\r\n\0 ") or any(c in value for c in "\r\n\0"):
            raise HeaderError(f"header {name!r} has a character HTTP does not allow")
        try:
            out += f"{name}: {value}\r\n".encode("latin-1")
        except UnicodeEncodeError as e:
            raise HeaderError(f"header {name!r} is not Latin-1") from e
    return bytes(out)


class Link(asyncio.Protocol):
    """One keep-alive connection to a replica, and the response being read on it."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, read_timeout: float, response_timeout: float
    ) -> None:
        self._loop = loop
        self._read_timeout = read_timeout
        self._response_timeout = response_timeout
        self.transport: asyncio.Transport | None = None
        self.reader: ResponseReader | None = None
        """The response being read; None while idle in the pool."""
        self.closed = False
        self._ids: list[int] = []
        self._news = False
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._held = False
        """The socket stays unread between the consumer's asks (`hold_reads`)."""
        self._holding = False
        """The socket's low-water mark is raised to `HOLD_BYTES` now."""
        self._socket: socket.socket | None = None
        self._last_read = 0.0
        self._deadline = 0.0
        self._silence: asyncio.TimerHandle | None = None
        self._timed_out: str | None = None
        """Why the exchange timed out: silence, or the response deadline."""
        self.clock: TurnClock | None = None
        """The turn this exchange serves, stamped at the first read of each batch of
        ids (`hotloop.turnclock`); the exchange's only."""

    # ------------------------------------------------------------ asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not subclass asyncio.Transport).
        self.transport = cast("asyncio.Transport", transport)
        self._socket = transport.get_extra_info("socket")

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        if reader is None:
            # Bytes on an idle connection answer nothing we sent: do not reuse it.
            self.close()
            return
        self._last_read = self._loop.time()
        ids, news = reader.feed(data)
        if ids:
            held = self._ids
            if held:
                held += ids
            else:
                self._ids = held = ids
                if self.clock is not None:
                    self.clock.arrived()
            if len(held) >= PAUSE_IDS and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()
        elif not news:
            return  # part of an event: nothing for the consumer yet
        if news:
            self._news = True
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.reader is not None:
            ids, _ = self.reader.eof()
            self._ids += ids
        self._news = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _check_silence(self) -> None:
        """The read timeout and the response deadline, checked by one timer per
        exchange re-armed from the time of the last read (not a timer per read). A
        paused socket is waiting for us, not for the replica: the read timeout counts
        again from its resumption. The deadline holds whatever arrives (keep-alive
        comments, events without tokens, tokens past the end)."""
        if self.reader is None:
            return
        now = self._loop.time()
        waiting_for_us = self._paused or self._holding
        due = now + self._read_timeout if waiting_for_us else self._last_read + self._read_timeout
        if now >= self._deadline:
            self._timed_out = f"no end of the response within {self._response_timeout:g}s"
        elif now >= due:
            self._timed_out = f"nothing for {self._read_timeout:g}s"
        else:
            self._silence = self._loop.call_at(min(due, self._deadline), self._check_silence)
            return
        self._news = True
        self._wake()

    # ------------------------------------------------------------ the exchange's side

    def send(
        self, head: bytes, body: bytes | bytearray | memoryview, reader: ResponseReader
    ) -> None:
        """Write a request (its `head` and `body`) whose response `reader` reads. Two
        buffers, one write: a token-id body grows with the conversation, and joining it
        to the head would copy all of it once more every turn."""
        assert self.transport is not None and self.reader is None
        self.reader = reader
        self._ids = []
        self._news = False
        self._held = False
        self._timed_out = None
        self._last_read = self._loop.time()
        self._deadline = self._last_read + (self._response_timeout or float("inf"))
        self._silence = self._loop.call_at(
            min(self._last_read + self._read_timeout, self._deadline), self._check_silence
        )
        self.transport.writelines((head, body))

    async def next(self) -> list[int] | None:
        """The ids decoded since the last call, waiting for some; None when there are
        none but the response's state changed (read it from `reader`). Raises LinkError
        for silence beyond the read timeout and for a connection lost before the
        body's end, after the ids that came before."""
        while True:
            ids = self._ids
            if ids:
                self._ids = []
                if self._paused:
                    self._resume()
                if self._held and self.reader is not None and not self.reader.done:
                    self._hold(True)
                return ids
            if self._news:
                self._news = False
                self._raise_failure()
                return None
            if self._holding:
                self._hold(False)
            self._waiter = waiter = self._loop.create_future()
            await waiter

    def hold_reads(self) -> None:
        """From now on (this exchange only), leave the socket unread from each hand-over
        of ids to the consumer's next ask. For a consumer that waits between asks
        (`--stream-coalesce-ms`): one read then takes every event the replica sent
        meanwhile, one wake-up and one system call per wait instead of one per event.
        Not once the finishing event is in: the rest of the body follows at once.

        The socket's low-water mark does it (`HOLD_BYTES`), not `pause_reading`: a paused
        socket stays in the event loop's poll set until its next event, so the first
        event of every wait would still wake the loop."""
        self._held = True
        if not self._ids and self.reader is not None and not self.reader.done:
            self._hold(True)

    async def read_to_end(self) -> None:
        """Read the response's body to its end (a collected one: error or listing)."""
        reader = self.reader
        assert reader is not None
        while not reader.complete:
            await self.next()

    def _raise_failure(self) -> None:
        reader = self.reader
        assert reader is not None
        if self._timed_out is not None:
            raise LinkError(self._timed_out, timeout=True)
        if self.closed and not reader.complete:
            answered = reader.status is not None
            where = "before the end of the response" if answered else "without answering"
            raise LinkError(f"the connection closed {where}", stale=not answered)

    def _hold(self, holding: bool) -> None:
        """Raise the socket's low-water mark, or lower it back to one byte (which makes
        the kernel report what is queued at once). A socket that refuses it (gone
        meanwhile) is read event by event, as without a hold."""
        if self._socket is None or self.closed:
            return
        try:
            self._socket.setsockopt(
                socket.SOL_SOCKET, socket.SO_RCVLOWAT, HOLD_BYTES if holding else 1
            )
        except OSError:
            self._held = holding = False
        self._holding = holding
        if not holding:
            self._last_read = self._loop.time()

    def _resume(self) -> None:
        self._paused = False
        self._last_read = self._loop.time()
        if self.transport is not None:
            self.transport.resume_reading()

    def finish(self) -> bool:
        """End the exchange; True when the connection can carry the next request (the
        body was read to its end, the server keeps it open), else it is closed."""
        if self._silence is not None:
            self._silence.cancel()
            self._silence = None
        reader, self.reader = self.reader, None
        self.clock = None
        if reader is None or self.closed or self._paused or not reader.reusable:
            self.close()
            return False
        if self._holding:
            self._hold(False)  # the next exchange on it may not be paced
        return True

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()


class Client:
    """Connections to replicas: idle keep-alive ones per origin (reused newest first),
    at most `max_connections` in use at once (a request waits up to the connect timeout
    for one), and the headers every request carries. `response_timeout` bounds a whole
    exchange (0: only the read timeout does), `max_line` a streamed event line."""

    def __init__(
        self,
        *,
        headers: dict[str, str],
        connect_timeout: float,
        read_timeout: float,
        max_connections: int,
        response_timeout: float = 0.0,
        max_line: int = 16 * 1024 * 1024,
    ) -> None:
        self._headers = header_lines(headers)
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._response_timeout = response_timeout
        self._max_line = max_line
        self._max_idle = max_connections
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[Origin, list[Link]] = {}
        self._tls: ssl.SSLContext | None = None

    async def send(
        self,
        origin: Origin,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes | bytearray | memoryview = b"",
        stream: str | None = None,
    ) -> Link:
        """Send a request on a pooled or new connection; the returned link reads its
        response (`stream`: the dialect whose events a 2xx body holds). Whatever happens
        next, the caller ends the exchange with `done`."""
        head = header_lines(headers)  # before a connection is taken
        if self._slots.locked():
            try:
                await asyncio.wait_for(self._slots.acquire(), self._connect_timeout)
            except asyncio.TimeoutError as e:
                raise LinkError("every connection is in use", timeout=True) from e
        else:
            await self._slots.acquire()  # free: no timer
        try:
            link = await self._connection(origin)
        except BaseException:
            self._slots.release()
            raise
        request = b"%s %s HTTP/1.1\r\nHost: %s\r\n%b%bContent-Length: %d\r\n\r\n" % (
            method.encode(),
            (origin.prefix + path).encode(),
            origin.authority.encode(),
            self._headers,
            head,
            len(body),
        )
        link.send(request, body, ResponseReader(stream, self._max_line))
        return link

    async def fetch(self, origin: Origin, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        """GET a whole (small) response: its status and body."""
        link = await self.send(origin, "GET", path, headers)
        try:
            await link.read_to_end()
            reader = link.reader
            assert reader is not None and reader.status is not None
            return reader.status, reader.body
        finally:
            self.done(origin, link)

    def done(self, origin: Origin, link: Link) -> None:
        """End an exchange: its connection goes back to the pool, or is closed when it
        cannot be reused (abandoned mid-body, failed, or told to close)."""
        self._slots.release()
        if link.finish():
            idle = self._idle.setdefault(origin, [])
            if len(idle) < self._max_idle:
                idle.append(link)
            else:
                link.close()

    async def _connection(self, origin: Origin) -> Link:
        idle = self._idle.get(origin)
        while idle:
            link = idle.pop()
            if not link.closed:
                return link
        loop = asyncio.get_running_loop()
        context = None
        if origin.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            context = self._tls
        connecting = loop.create_connection(
            lambda: Link(loop, self._read_timeout, self._response_timeout),
            origin.host,
            origin.port,
            ssl=context,
        )
        # A transport keeps the context it was created in (its callbacks run there), and
        # a kept-alive connection outlives the turn that opened it: opened in that turn's
        # context, it would hold the turn's context variables (`SERVING`: its request,
        # a first turn's whole frame and parse) for as long as it stays in the pool.
        opening = contextvars.Context().run(asyncio.ensure_future, connecting)
        try:
            _, link = await asyncio.wait_for(opening, self._connect_timeout)
        except asyncio.TimeoutError as e:
            raise LinkError(f"no connection within {self._connect_timeout:g}s", timeout=True) from e
        except OSError as e:
            raise LinkError(f"{type(e).__name__}: {e}") from e
        return link

    def close(self) -> None:
        for idle in self._idle.values():
            for link in idle:
                link.close()
        self._idle.clear()
