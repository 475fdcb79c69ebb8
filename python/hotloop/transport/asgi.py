"""The ASGI callables' types (the spec's dict messages, typed loosely on purpose:
the app reads only the keys it needs), hotloop's server extensions, and `header`."""

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

T = TypeVar("T")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SEND_FRAMES = "hotloop.websocket.send_frames"
"""hotloop's server extension (`hotloop.transport.frames`): its name in
`scope["extensions"]` and its message type, `{"type": SEND_FRAMES, "frames": [bytes]}`,
each item one text frame's UTF-8 payload, all written at once."""

WRITE_FRAMES = "write"
"""The `SEND_FRAMES` extension's entry (`scope["extensions"][SEND_FRAMES][WRITE_FRAMES]`):
a plain callable that writes a list of such payloads at once without a message to
await, returning False (nothing written) while the transport asks the app to wait; the
app then sends them as a `SEND_FRAMES` message, which waits. Raises OSError when the
client is gone."""

RECEIVE_UTF8 = "hotloop.websocket.receive_utf8"
"""hotloop's server extension for receiving: an app that sets this scope key (to True)
gets a large text message (`PARSE_OFFLOAD_BYTES` or more) as `{"type": "websocket.receive",
RECEIVE_UTF8: payload}`, its UTF-8 bytes not yet decoded, so that the app decodes them
off the event loop with the parse. A payload that is not UTF-8 is the app's to close
with 1007."""

RECEIVED_NS = "hotloop.websocket.received_ns"
"""hotloop's server stamps each `websocket.receive` message under this key with the
`time.perf_counter_ns()` at which the message was complete in its protocol: the app
measures how long it waited to be read (`hotloop.turnclock`, phase `queued`)."""

CONNECTION_DRAIN = "hotloop.websocket.connection_drain"
"""The app puts an async callable under this scope key for each accepted WebSocket:
called at shutdown, it ends the connection's responses that wait for tool output (they
could not resume on a draining server) and returns once the connection has no response
in flight and nothing left to send. hotloop's server (`hotloop.transport.frames`) awaits
it before closing the socket with 1012, so an idle connection closes at once and a busy
one right after its responses end."""


def find_inner(app: object, attribute: str, kind: type[T]) -> T | None:
    """`app.<attribute>` of type `kind` on the app as a server holds it: uvicorn (and
    tests) wrap the app, each wrapper keeping the inner app as `.app`."""
    for _ in range(8):
        value = getattr(app, attribute, None)
        if isinstance(value, kind):
            return value
        app = getattr(app, "app", None)
        if app is None:
            return None
    return None


def header(scope: Scope, name: bytes) -> bytes | None:
    """A request header's value (the first, when repeated), as the ASGI server gave it."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None
