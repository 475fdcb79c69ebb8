"""The protocol layer's one error type and its mapping from the layers below.

A `ProtocolError` is a request the protocol refuses: it becomes one `error` event
(WebSocket) or one HTTP error body, with a stable `code`, a `param` pointing into the
request, an HTTP `status` and, for a refusal to retry, `retry_after` seconds. Core
(`CoreError`) and engine (`EngineError`) failures are mapped here once; nothing else
formats wire errors.
"""

from __future__ import annotations

from hotloop._core import CoreError


class ProtocolError(Exception):
    """A refused request: `status` (HTTP semantics), stable `code`, `message`, `param`,
    and `retry_after` when a limit refused work that can be retried (sent as
    `error.headers["retry-after"]` on every transport, and as an HTTP header)."""

    def __init__(
        self,
        code: str,
        message: str,
        param: str | None = None,
        *,
        status: int = 400,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.status = status
        self.retry_after = retry_after
        """Seconds after which a retry may succeed (429 and 503 refusals)."""

    @classmethod
    def limit(cls, code: str, message: str, retry_after: int) -> ProtocolError:
        """A limit refused work the client may send again in `retry_after` seconds:
        429 `rate_limit_error` with `retry-after`, as OpenAI's limits answer."""
        return cls(code, message, status=429, retry_after=retry_after)

    @classmethod
    def from_core(cls, error: CoreError) -> ProtocolError:
        """Every core failure is the client's: a 400 with the core's code and param."""
        return cls(error.code, error.message, error.param)

    @classmethod
    def not_found(cls, response_id: str) -> ProtocolError:
        return cls(
            "previous_response_not_found",
            f"Previous response with id '{response_id}' not found.",
            "previous_response_id",
        )

    @classmethod
    def store_unavailable(cls, message: str) -> ProtocolError:
        """The store could not be read: the request may succeed when it is retried."""
        return cls(
            "store_unavailable",
            f"The stored conversation cannot be read right now ({message}); retry.",
            "previous_response_id",
            status=503,
        )
