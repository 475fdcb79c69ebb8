"""A WebSocket connection's client text frames parsed: the core's event or the refusal,
and the decoding of the events the core passes through (`decode_passed_through`).
Which frames leave the event loop to be parsed or rendered (`offloads`, `OFFLOAD_BYTES`)
is decided with the work they become (`actions.py`), and read here too.

A `FrameParser` reads no state that changes, so the transport may run it in a worker
thread (the core releases the GIL for a large frame); `Connection` dispatches what it
returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from hotloop._core import AppendEvent, CoreError, CreateRequest, Limits, UnknownEvent, parse_event
from hotloop.protocol.actions import OFFLOAD_BYTES, PARSE_OFFLOAD_BYTES, offloads
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.tool_outputs import as_append

if TYPE_CHECKING:
    from hotloop._core import ClientEvent
    from hotloop.protocol.compaction import Compactor
    from hotloop.protocol.mcp_tools import McpTurn

INJECTS = frozenset(("response.inject", "response.append"))
"""The long-running response's events (refused on a connection without it)."""
PASSED_THROUGH = frozenset(("response.interrupt", "response.steer", *INJECTS))
"""Events the connection decodes itself (`decode_passed_through`)."""
__all__ = [
    "INJECTS",
    "OFFLOAD_BYTES",
    "PARSE_OFFLOAD_BYTES",
    "PASSED_THROUGH",
    "FrameParser",
    "Parsed",
    "offloads",
]


@dataclass(frozen=True)
class Parsed:
    """A client text frame after `Connection.parse`: its event or its refusal."""

    event: ClientEvent | ProtocolError
    """The event, or why the frame is refused."""
    size: int
    parse_ns: int
    frame: str | bytes
    """The frame's text: kept by a request that has to wait (`Pending.frame`), read
    by the events the core passes through (`response.steer`, `response.interrupt`)."""
    mcp: McpTurn | None = None
    """A request's MCP servers, listed by the transport (`hotloop.protocol.mcp_tools`)."""

    @property
    def previous_response_id(self) -> str | None:
        """The response a valid `response.create` continues, as the core parsed it."""
        event = self.event
        if isinstance(event, CreateRequest) and event.error is None:
            return event.previous_response_id
        return None

    @property
    def conversation(self) -> str | None:
        """The conversation a valid `response.create` continues, as the core parsed it."""
        event = self.event
        if isinstance(event, CreateRequest) and event.error is None:
            return event.conversation
        return None


class FrameParser:
    """One connection's frames parsed, with its compaction key and bounds."""

    def __init__(
        self,
        compactor: Compactor,
        max_frame_bytes: int,
        limits: Limits | None,
        clock: Callable[[], int],
    ) -> None:
        self._compactor = compactor
        self._max_frame_bytes = max_frame_bytes
        self._limits = limits
        self._clock = clock

    def parse(self, frame: str | bytes) -> Parsed:
        """Parse one text frame (see `Connection.parse`)."""
        # `isascii` is O(1) on str: only non-ASCII text pays for measuring its bytes.
        size = len(frame) if isinstance(frame, bytes) or frame.isascii() else len(frame.encode())
        if size > self._max_frame_bytes:
            error = ProtocolError.frame_too_large(size, self._max_frame_bytes)
            return Parsed(error, size, 0, frame)
        start = self._clock()
        try:
            event = parse_event(self._compactor.expand(frame), self._limits)
        except CoreError as e:
            return Parsed(ProtocolError.from_core(e), size, self._clock() - start, frame)
        except ProtocolError as e:  # a compaction item that is not ours, or tampered with
            return Parsed(e, size, self._clock() - start, frame)
        return Parsed(event, size, self._clock() - start, frame)

    def reparse(self, frame: str | bytes) -> CreateRequest:
        """A `response.create` frame parsed again (see `Connection.reparse`)."""
        event = parse_event(self._compactor.expand(frame), self._limits)
        assert isinstance(event, CreateRequest), "a response.create frame"
        return event

    def decode_passed_through(
        self, event: UnknownEvent | AppendEvent, parsed: Parsed
    ) -> tuple[AppendEvent | None, Any]:
        """An event the core passes through (steer, interrupt, inject) or parses only in
        part (append), decoded: the append it is (None for steer and interrupt) and its
        JSON. Raises `ProtocolError.undecodable` when the decoder cannot decode it."""
        try:
            decoded = orjson.loads(parsed.frame)
        except orjson.JSONDecodeError as e:
            raise ProtocolError.undecodable(e) from e
        if isinstance(event, AppendEvent):
            return event, decoded
        if event.type not in INJECTS:
            return None, decoded
        append = parse_event(as_append(decoded), self._limits)
        assert isinstance(append, AppendEvent), "an inject parses as an append"
        return append, decoded
