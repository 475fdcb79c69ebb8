"""The process-wide bound on request bytes held before their turn starts.

Each connection bounds its own queue (`ConnectionLimits.max_queued_bytes`), but one key
can open many connections: `QueueMemory` bounds the bytes of every queued
`response.create` of the process, and of each API key, shared by all connections and
by HTTP bodies while they are read and parsed. A request over a bound is refused with
429 `rate_limit_error`, code `queue_memory_exceeded` and a `retry-after`, never
dropped. It knows nothing of lanes or sockets; a connection's `RequestQueue` and the
HTTP routes reserve and release.
"""

from __future__ import annotations

from collections.abc import Callable

from hotloop.protocol.errors import ProtocolError

RETRY_AFTER_SECONDS = 1


class QueueMemory:
    """Queued request bytes, in total and per principal (an API key; requests of an
    unauthenticated server count in the total only)."""

    def __init__(
        self,
        max_bytes: int,
        max_bytes_per_key: int,
        on_refusal: Callable[[], None] | None = None,
    ) -> None:
        """`on_refusal` is called once per refused request (the process's metrics)."""
        self.max_bytes = max_bytes
        self.max_bytes_per_key = max_bytes_per_key
        self.used_bytes = 0
        self._on_refusal = on_refusal
        self._by_key: dict[str, int] = {}

    def of(self, principal: str | None) -> int:
        return 0 if principal is None else self._by_key.get(principal, 0)

    def reserve(self, principal: str | None, size: int) -> None:
        """Count `size` more bytes, or raise the 429 `ProtocolError` that refuses them."""
        if self.used_bytes + size > self.max_bytes:
            self._refused()
            raise _exceeded(
                f"The server holds {self.used_bytes} bytes of queued requests (limit "
                f"{self.max_bytes}); retry once responses have finished."
            )
        if principal is not None:
            held = self._by_key.get(principal, 0)
            if held + size > self.max_bytes_per_key:
                self._refused()
                raise _exceeded(
                    f"This API key holds {held} bytes of queued requests (limit "
                    f"{self.max_bytes_per_key}); retry once its responses have finished."
                )
            self._by_key[principal] = held + size
        self.used_bytes += size

    def _refused(self) -> None:
        if self._on_refusal is not None:
            self._on_refusal()

    def release(self, principal: str | None, size: int) -> None:
        if size <= 0:
            return
        self.used_bytes -= size
        if principal is not None:
            held = self._by_key[principal] - size
            if held:
                self._by_key[principal] = held
            else:
                del self._by_key[principal]


def _exceeded(message: str) -> ProtocolError:
    return ProtocolError(
        "queue_memory_exceeded", message, status=429, retry_after=RETRY_AFTER_SECONDS
    )
