"""Admission control below the ASGI app: who gets a connection, and for how long it may
take to say what it wants.

uvicorn bounds an idle kept-alive connection (`timeout_keep_alive`) but not one that
never finishes its request headers, and it has no connection cap that answers before
the headers: a thousand sockets that trickle a header each would hold every file
descriptor of the process. `AdmittingHttpProtocol` (uvicorn's httptools protocol, which
`hotloop serve` runs) adds both at the protocol level, where the bytes arrive:

- a header deadline: from the connection's first byte (and from the first byte of each
  later request on a kept-alive connection) to the end of that request's headers; a
  connection past it gets 408 and is closed;
- a body deadline: from the end of a request's headers, its body gets `body_timeout`
  seconds plus one second per `min_body_rate` bytes received (Apache's `mod_reqtimeout`
  rule: a body of any size is fine at that rate, one byte a minute is not); past it, 408
  and the connection is closed;
- a lingering close after a response whose request body was not read (a 401, a 413 or
  a 429 answered from the headers): the connection says nothing more (a half-close, so
  the client still reads the response instead of a reset), drops what the client sends
  and closes at the client's end of input or after `LINGER_SECONDS`. Before, one byte
  at a time held such a connection open with no timer at all;
- a connection cap over every open connection of the process (HTTP and WebSocket): a
  connection over it first takes the place of the oldest lingering one (closed at
  once), else gets 503 with a JSON error and `retry-after` and is closed at once, so
  it costs a file descriptor for one write.

It reads its settings from the `ServerConfig` of the app it serves and leaves the
per-key cap (WebSockets and HTTP requests in progress) to the app (the key is known
only once the headers are read).
`raise_open_files_limit` lifts the process's descriptor limit to its hard limit at start.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import weakref
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hotloop.config import ServerConfig
from hotloop.events import error_body
from hotloop.ledger import Ledger
from hotloop.metrics import Metrics
from hotloop.transport.asgi import find_inner

log = logging.getLogger("hotloop.admission")

# Descriptors kept for what is not a client connection: the listening socket, the
# store's database and journal, the engine's sockets, logs, worker pipes.
FD_RESERVE = 64
# The ceiling when the hard limit is unlimited (Linux refuses more than fs.nr_open).
UNLIMITED_FILES = 1 << 20
RETRY_AFTER_SECONDS = 1
# How long a connection whose request body was left unread may still send before it
# is closed: enough for a client to read the response it was given.
LINGER_SECONDS = 2.0

STATUS_LINES = {
    408: b"HTTP/1.1 408 Request Timeout\r\n",
    503: b"HTTP/1.1 503 Service Unavailable\r\n",
}


def raise_open_files_limit() -> tuple[int, int]:
    """Lift the soft `RLIMIT_NOFILE` to the hard limit; returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_FILES if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, target, e)
            return soft, soft
        return soft, target
    return soft, soft


def connection_cap(config: ServerConfig) -> int:
    """`--max-connections`, or by default what the descriptor limit allows."""
    if config.max_connections > 0:
        return config.max_connections
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = UNLIMITED_FILES
    return max(1, soft - FD_RESERVE)


def refusal(status: int, code: str, message: str, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, with a JSON error body."""
    body = error_body(code, message, None, status)
    head = [
        STATUS_LINES[status],
        b"content-type: application/json\r\n",
        b"content-length: " + str(len(body)).encode() + b"\r\n",
        b"connection: close\r\n",
    ]
    if retry_after is not None:
        head.append(b"retry-after: " + str(retry_after).encode() + b"\r\n")
    return b"".join(head) + b"\r\n" + body


# The lingering connections of each server, oldest first: the first to give up their
# places to new connections when the server is at its cap.
_LINGERING: weakref.WeakKeyDictionary[Any, dict[AdmittingHttpProtocol, None]] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class _Settings:
    """What every connection of an app reads from its config and ledger: looked up
    once per app (a connection per request is common), not per connection."""

    metrics: Metrics | None
    header_timeout: float
    body_timeout: float
    min_body_rate: float
    max_connections: int


_SETTINGS: weakref.WeakKeyDictionary[Any, _Settings] = weakref.WeakKeyDictionary()


def _settings_of(app: Any) -> _Settings:
    settings = _SETTINGS.get(app)
    if settings is None:
        config = find_inner(app, "config", ServerConfig) or ServerConfig()
        ledger = find_inner(app, "ledger", Ledger)
        settings = _Settings(
            None if ledger is None else ledger.metrics,
            config.header_timeout,
            config.body_timeout,
            config.min_body_rate,
            connection_cap(config),
        )
        _SETTINGS[app] = settings
    return settings


class _Corked:
    """A response's transport while its head is written: the head uvicorn writes is
    kept until the first piece of its body, and both go out in one write (one syscall
    and one packet, not two); a close, or `uncork`, writes a head still kept."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._head is None:
            self._head = data
            return
        head, self._head = self._head, b""
        if head:
            self.transport.writelines((head, data))
        else:
            self.transport.write(data)

    def uncork(self) -> None:
        if self._head:
            self.transport.write(self._head)
        self._head = b""

    def close(self) -> None:
        self.uncork()
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class BodyPieces:
    """A request body's pieces as they arrive, in uvicorn's cycle in place of its
    `bytearray` (`cycle.body += piece`, `len`, `bytes(...)`): the pieces are joined once
    when the app reads them, not copied into a growing array and out of it again. A
    piece read alone is not copied at all. Each copy of a large body costs its size in
    fresh pages (blocks of 128 KiB and more are mapped anew, `heap.py`): four copies of a
    1 MB history resent every turn were about 2 ms a request."""

    __slots__ = ("_pieces", "_size")

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self._size = 0

    def __iadd__(self, piece: bytes) -> BodyPieces:
        self._pieces.append(piece)
        self._size += len(piece)
        return self

    def __len__(self) -> int:
        return self._size

    def __bytes__(self) -> bytes:
        return b"".join(self._pieces)


class AdmittingHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline, a body deadline, a lingering
    close after an unread body, a connection cap, and a body kept as its pieces
    (`BodyPieces`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = _settings_of(self.app)
        self._metrics = settings.metrics
        self._header_timeout = settings.header_timeout
        self._body_timeout = settings.body_timeout
        self._min_body_rate = settings.min_body_rate
        self._max_connections = settings.max_connections
        self._deadline: asyncio.TimerHandle | None = None
        self._body_deadline: asyncio.TimerHandle | None = None
        self._body_started = 0.0
        self._body_bytes = 0
        self._reading_body = False
        self._lingering = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self._max_connections and not self._take_lingering_place():
            self._refuse(
                503,
                "server_overloaded",
                f"This server is at its limit of {self._max_connections} open connections; "
                "retry shortly.",
                RETRY_AFTER_SECONDS,
            )
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the rest of a body nobody reads, or requests nobody will answer
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()  # a kept-alive connection's next request

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        if self.parser.should_upgrade() and self._should_upgrade():
            return  # a WebSocket: its own protocol takes the connection over
        self._take_send()
        self._reading_body = True
        self._body_started = self.loop.time()
        self._body_bytes = 0
        if self._body_timeout > 0:
            self._body_deadline = self.loop.call_at(
                self._body_started + self._body_timeout, self._check_body
            )

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        # uvicorn gives the cycle a new bytearray after each read of the body.
        if not isinstance(self.cycle.body, BodyPieces):
            self.cycle.body = BodyPieces()  # type: ignore[assignment]
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._reading_body = False
        self._disarm_body()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        # The latest request answered before its body was read (an earlier pipelined
        # one completing leaves `self.cycle`, the latest, unanswered).
        unread = self._reading_body and self.cycle.response_complete
        if unread and not self.transport.is_closing():
            self._linger()
            return
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_body()
        lingering = _LINGERING.get(self.server_state)
        if lingering is not None:
            lingering.pop(self, None)
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is None and self._header_timeout > 0:
            self._deadline = self.loop.call_later(self._header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined request is late while the previous response still streams:
            # a 408 now would land inside that response. It ends the connection instead.
            self.cycle.keep_alive = False
            return
        self._refuse(
            408,
            "header_timeout",
            f"The request headers did not arrive within {self._header_timeout:g} seconds.",
        )

    def _disarm_body(self) -> None:
        if self._body_deadline is not None:
            self._body_deadline.cancel()
            self._body_deadline = None

    def _check_body(self) -> None:
        """One timer per body, re-armed to the deadline the bytes so far have earned
        (not a timer per read)."""
        earned = self._body_bytes / self._min_body_rate if self._min_body_rate > 0 else 0.0
        due = self._body_started + self._body_timeout + earned
        if self.loop.time() < due:
            self._body_deadline = self.loop.call_at(due, self._check_body)
            return
        self._body_deadline = None
        if self._lingering or self.cycle is None or self.cycle.response_started:
            self.transport.close()
            return
        self._refuse(
            408,
            "body_timeout",
            f"The request body did not arrive within {self._body_timeout:g} seconds "
            f"at {self._min_body_rate:g} bytes per second.",
        )

    def _take_send(self) -> None:
        """The request's `send` (the ASGI task has not started yet, so it takes this
        one): a response's head goes out with the first piece of its body (`_Corked`);
        a response that starts while its request's body is unread (401, 413, 429 from
        the headers) ends the connection (`_linger`): it carries `connection: close`, so
        that a client does not send its next request on it."""
        transport = self.cycle.transport
        corked: list[_Corked] = []
        # A HEAD's response writes no body: its head goes out on its own.
        head = self.cycle.scope["method"] != "HEAD"
        # The cycle holds this `send`, which reaches the cycle weakly (its own task, alive
        # while it runs, is what calls it) and not the protocol at all: else every request
        # would be a reference cycle that only the garbage collector frees.
        this = weakref.ref(self.cycle)
        answer = type(self.cycle).send

        async def send(message: Any) -> None:
            cycle = this()
            assert cycle is not None, "called by the cycle's own task"
            start = message["type"] == "http.response.start"
            # Its body unread: an earlier pipelined request's answer is not early.
            early = start and cycle.more_body
            if early:
                cycle.keep_alive = False  # uvicorn writes `connection: close`
            if (start and head) or corked:
                # The head waits for the first piece of the body (`_Corked`).
                if not corked:
                    corked.append(_Corked(transport))
                cycle.transport = corked[0]  # type: ignore[assignment]
                try:
                    await answer(cycle, message)
                finally:
                    cycle.transport = transport
                if not start:
                    corked.pop().uncork()
            else:
                await answer(cycle, message)
            if early:
                # ... and would close the socket once the response is written, the body
                # unread: a reset, which can cost the client the response. `_linger`
                # ends the connection instead (`on_response_complete`).
                cycle.keep_alive = True

        self.cycle.send = send  # type: ignore[method-assign]

    def _linger(self) -> None:
        """Half-close, drop what comes, close at the client's end or after
        `LINGER_SECONDS` (a close with unread bytes resets the connection, and the
        client may lose the response it was sent)."""
        self._lingering = True
        self._disarm_body()
        _LINGERING.setdefault(self.server_state, {})[self] = None
        transport = self.transport
        if transport.can_write_eof():
            transport.write_eof()
        self.flow.resume_reading()
        self.loop.call_later(LINGER_SECONDS, transport.close)

    def _take_lingering_place(self) -> bool:
        """Close the oldest lingering connection so this one can have its place."""
        lingering = _LINGERING.get(self.server_state)
        if not lingering:
            return False
        oldest = next(iter(lingering))
        del lingering[oldest]
        oldest.transport.close()
        return True

    def _refuse(self, status: int, code: str, message: str, retry_after: int | None = None) -> None:
        if self._metrics is not None:
            self._metrics.refusals.labels(code).inc()
        if not self.transport.is_closing():
            self.transport.write(refusal(status, code, message, retry_after))
            self.transport.close()


__all__ = [
    "LINGER_SECONDS",
    "AdmittingHttpProtocol",
    "connection_cap",
    "raise_open_files_limit",
    "refusal",
]
