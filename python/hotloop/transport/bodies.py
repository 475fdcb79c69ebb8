"""Reading an HTTP request's body: within the server's size limit (413
`request_too_large` from its `Content-Length`, or as soon as it grows past it), counted
in the process's queue memory while it is read and parsed (`Reservation`), a large one
written into a pooled `Body` as it arrives."""

from __future__ import annotations

from hotloop._core import Body
from hotloop.protocol import QueueMemory
from hotloop.protocol.errors import ProtocolError
from hotloop.transport.asgi import Receive, Scope, header


class ClientGone(Exception):
    """The client disconnected before the request was read: nobody to answer."""


class Reservation:
    """One HTTP body's bytes in the process's queue memory while it is read and parsed."""

    def __init__(self, memory: QueueMemory, principal: str | None) -> None:
        self._memory = memory
        self._principal = principal
        self._size = 0

    def add(self, size: int) -> None:
        self._memory.reserve(self._principal, size)
        self._size += size

    def release(self) -> None:
        self._memory.release(self._principal, self._size)
        self._size = 0


async def read_body(
    scope: Scope, receive: Receive, limit: int, reserved: Reservation, pooled: bool
) -> bytes | Body:
    """The body, within `limit`; `pooled`: one declared at least `Body.POOLED_BYTES`
    long is written into a `Body` as it arrives instead of joined into new `bytes` (a
    history resent each turn reuses the pages the last one left)."""
    declared = header(scope, b"content-length")
    expected = 0
    # More than 18 digits is more than any limit (and `int` refuses 4,300 digits).
    if declared is not None and declared.isdigit():
        expected = int(declared) if len(declared) <= 18 else 10**18
        if expected > limit:
            raise too_large(expected, limit)
    chunks: list[bytes] = []
    into = Body(expected) if pooled and expected >= Body.POOLED_BYTES else None
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(size, limit)
        reserved.add(len(chunk))
        if into is not None:
            into.write(chunk)
        else:
            chunks.append(chunk)
        if not message.get("more_body", False):
            if into is None:
                return b"".join(chunks)
            into.seal()
            return into


def too_large(size: int, limit: int) -> ProtocolError:
    return ProtocolError(
        "request_too_large",
        f"The request body is {size} bytes; this server accepts at most {limit}.",
        status=413,
    )
