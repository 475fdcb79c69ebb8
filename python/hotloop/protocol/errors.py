"""The protocol layer's one error type and its mapping from the layers below.

A `ProtocolError` is a request the protocol refuses: it becomes one `error` event
(WebSocket) or one HTTP error body, with a stable `code`, a `param` pointing into the
request, an HTTP `status` and, for a refusal to retry, `retry_after` seconds. Core
(`CoreError`) and engine (`EngineError`) failures are mapped here once; nothing else
formats wire errors.
"""

from __future__ import annotations

from hotloop._core import CoreError
from hotloop.events import error_event


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
    def conversation_and_previous_response(cls) -> ProtocolError:
        return cls(
            "mutually_exclusive_parameters",
            "Mutually exclusive parameters: Ensure you are only providing one of: "
            "'previous_response_id' or 'conversation'.",
            "conversation",
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

    def event(self, stream_id: str | None = None) -> bytes:
        """The WebSocket `error` event that refuses it, echoing `stream_id`."""
        return error_event(
            self.code,
            self.message,
            self.param,
            status=self.status,
            stream_id=stream_id,
            retry_after=self.retry_after,
        )

    # The connection's own refusals (frames, lanes, lifetime).

    @classmethod
    def frame_too_large(cls, size: int, limit: int) -> ProtocolError:
        return cls(
            "frame_too_large",
            f"The frame is {size} bytes; this server accepts at most {limit} bytes per frame.",
        )

    @classmethod
    def undecodable(cls, error: Exception) -> ProtocolError:
        """A frame the core parsed (it skips unknown fields at any depth) that the decoder
        refuses (it stops at 1,024 levels): refused, never a dropped socket."""
        return cls("invalid_json", f"The event cannot be decoded: {error}.")

    @classmethod
    def binary_frame(cls) -> ProtocolError:
        return cls(
            "binary_frame_not_supported",
            "Binary frames are not supported: send each event as a JSON text frame.",
        )

    @classmethod
    def unknown_event(cls, event_type: str, *, needs_long_running: bool = False) -> ProtocolError:
        """An event type this connection does not take; `needs_long_running`: one it takes
        with the long-running response only (`response.inject`, `response.append`)."""
        if needs_long_running:
            message = (
                f"'{event_type}' needs the long-running response: send the header "
                "'OpenAI-Beta: responses_multi_agent=v1' on the upgrade."
            )
        else:
            message = (
                f"Unknown event type '{event_type}'. Supported: response.create, "
                "response.cancel, response.processed, response.interrupt, response.steer."
            )
        return cls("unknown_event_type", message, "type")

    @classmethod
    def invalid_stream_id(cls) -> ProtocolError:
        return cls(
            "invalid_stream_id",
            "stream_id must be 1-256 characters of letters, digits, '_', '.' or '-'.",
            "stream_id",
        )

    @classmethod
    def stream_limit(cls, lanes: int) -> ProtocolError:
        return cls(
            "websocket_stream_limit_reached",
            f"This connection already uses {lanes} stream_ids; "
            "open a new connection for more lanes.",
            "stream_id",
        )

    @classmethod
    def missing_model(cls) -> ProtocolError:
        """A request without `model` on a server with no `--default-model`."""
        return cls("missing_required_parameter", "Missing required parameter: 'model'.", "model")

    @classmethod
    def background(cls) -> ProtocolError:
        return cls(
            "invalid_value",
            "background responses are not supported over WebSocket mode.",
            "background",
        )

    @classmethod
    def lifetime_reached(cls) -> ProtocolError:
        return cls(
            "websocket_connection_limit_reached",
            "This connection reached its lifetime limit; open a new connection to continue.",
        )
