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
- a connection cap over every open connection of the process (HTTP and WebSocket): the
  connection over it gets 503 with a JSON error and `retry-after`, and is closed at
  once, so it costs a file descriptor for one write.

It reads its settings from the `ServerConfig` of the app it serves and leaves the
per-key WebSocket cap to the app (the key is known only once the headers are read).
`raise_open_files_limit` lifts the process's descriptor limit to its hard limit at start,
and `return_large_buffers` makes freed frame-sized buffers go back to the system.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import resource
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hotloop.config import ServerConfig
from hotloop.events import error_body
from hotloop.ledger import Ledger
from hotloop.transport.asgi import find_inner

log = logging.getLogger("hotloop.admission")

# Descriptors kept for what is not a client connection: the listening socket, the
# store's database and journal, the engine's sockets, logs, worker pipes.
FD_RESERVE = 64
# The ceiling when the hard limit is unlimited (Linux refuses more than fs.nr_open).
UNLIMITED_FILES = 1 << 20
RETRY_AFTER_SECONDS = 1

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


# glibc's mallopt parameter, and the size from which allocations are mmapped.
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1024 * 1024


def return_large_buffers() -> bool:
    """Fix glibc's mmap threshold at 1 MiB. glibc raises the threshold to the size of
    every mmapped buffer freed (up to 32 MiB), after which frame-sized buffers (a frame,
    its parse, a queued request) come from the heap and their memory stays with the
    process when freed: a full 64 MiB queue of 4 MiB frames cost 83 MiB of RSS instead
    of 64 (benches/bench_queue_memory.py). Buffers of 1 MiB and more now always go back
    to the system, at the price of faulting their pages in again: a 13.5 MB tool list
    costs about a fifth more server CPU (benches/bench_large_requests.py). At the
    default 128 KiB, every 256 KB request paid that too and slowed the other tenants
    of a busy server (bench_abuse.py full_queues). False where the C library has no
    `mallopt` (not glibc)."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


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


class AdmittingHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline and a connection cap."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = find_inner(self.app, "config", ServerConfig) or ServerConfig()
        ledger = find_inner(self.app, "ledger", Ledger)
        self._metrics = None if ledger is None else ledger.metrics
        self._header_timeout = config.header_timeout
        self._max_connections = connection_cap(config)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self._max_connections:
            self._refuse(
                503,
                "server_overloaded",
                f"This server is at its limit of {self._max_connections} open connections; "
                "retry shortly.",
                RETRY_AFTER_SECONDS,
            )
            return
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()  # a kept-alive connection's next request

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
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

    def _refuse(self, status: int, code: str, message: str, retry_after: int | None = None) -> None:
        if self._metrics is not None:
            self._metrics.refusals.labels(code).inc()
        if not self.transport.is_closing():
            self.transport.write(refusal(status, code, message, retry_after))
            self.transport.close()


__all__ = [
    "AdmittingHttpProtocol",
    "connection_cap",
    "raise_open_files_limit",
    "refusal",
    "return_large_buffers",
]
