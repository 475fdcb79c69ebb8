"""A connection's requests before their turn starts (`RequestQueue`, over a `QueuePort`):
admitted to their lane's queue or refused (a stream id, a lane past
`MAX_NAMED_LANES`, a refused request, the lifetime, the storage quota, the byte
bounds), held there within the connection's bound on queued bytes and the process's
(`QueueMemory`), and started head first on each free lane while fewer than
`MAX_IN_FLIGHT` responses run (the pump). It also takes `response.cancel`, which names a
response or a lane, and refuses a turn that cannot start.

It owns the lanes (`lanes.py`) and the bytes of waiting input (queued requests,
accepted steers, injected tool outputs); it never holds the connection: the port starts
a turn, counts what runs and finds a running response by id. How a turn runs once
started is the connection's and its units'.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import Callable
from typing import Protocol

from hotloop._core import CancelEvent, CreateRequest
from hotloop.protocol.actions import Action
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.lanes import Holder, Lane, Pending
from hotloop.protocol.mcp_tools import McpTurn
from hotloop.protocol.port import Settings
from hotloop.protocol.queue_memory import RETRY_AFTER_SECONDS, QueueMemory
from hotloop.protocol.steering import Steering

log = logging.getLogger("hotloop.protocol")

STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")
MAX_IN_FLIGHT = 16
MAX_NAMED_LANES = 32


def echoed(stream_id: str | None) -> str | None:
    """The stream id an `error` event echoes: only a well-formed one (an invalid one may
    be anything at all)."""
    return stream_id if stream_id is not None and STREAM_ID.fullmatch(stream_id) else None


class QueuePort(Protocol):
    """What the queue asks of its connection."""

    settings: Settings
    emit: Callable[[Action], None]
    closed: bool

    @property
    def in_flight(self) -> int:
        """Responses rendering, sampling, waiting for tool output or committing."""
        ...

    def start(self, lane: Lane, pending: Pending) -> None:
        """Run `pending`'s turn on `lane` (taken off its queue, its bytes released)."""
        ...

    def running(self, response_id: str) -> Holder | None:
        """The response sampling, or waiting open for tool output, with this id."""
        ...


class RequestQueue:
    """A connection's lanes, their queued requests and the bytes of waiting input."""

    def __init__(
        self,
        port: QueuePort,
        steering: Steering,
        max_queued_bytes: int,
        queue_memory: QueueMemory | None,
        background: bool,
    ) -> None:
        """`queue_memory`: the process-wide bound the queued bytes count in too.
        `background`: `background: true` requests are admitted (refused otherwise)."""
        self.port = port
        self.steering = steering
        self.max_queued_bytes = max_queued_bytes
        self.queue_memory = queue_memory
        self.background = background
        self.lanes: dict[str | None, Lane] = {None: Lane(None)}
        self.ready: deque[Lane] = deque()
        """Free lanes with a queued request, in the order they became so."""
        self.queued_bytes = 0
        self.expiring = False
        """The connection reached its lifetime: nothing more is admitted or started."""
        self._skipped_tools: set[tuple[str, str | None]] = set()

    @property
    def busy(self) -> bool:
        """Input waits: a queued request, or held bytes."""
        return self.queued_bytes > 0 or bool(self.ready)

    def admit(
        self,
        request: CreateRequest,
        size: int,
        parse_ns: int,
        frame: str | bytes | None = None,
        mcp: McpTurn | None = None,
    ) -> None:
        """A `response.create` (its `frame`, when it came as one) of `size` bytes: queued
        on its lane, with the steers queued for the response it continues, and started
        if it can be; refused with an `error` event otherwise."""
        name = request.stream_id
        if name is not None and not STREAM_ID.fullmatch(name):
            self._refuse(ProtocolError.invalid_stream_id(), None)
            return
        if request.error is not None:
            self._refuse(ProtocolError.from_core(request.error), name)
            return
        if request.model is None and self.port.settings.model_required:
            self._refuse(ProtocolError.missing_model(), name)
            return
        if request.skipped_tools:
            self._note_skipped(request.skipped_tools)
        if request.background and not self.background:
            self._refuse(ProtocolError.background(), name)
            return
        if request.conversation is not None and request.previous_response_id is not None:
            self._refuse(ProtocolError.conversation_and_previous_response(), name)
            return
        if self.expiring:
            self._refuse(ProtocolError.lifetime_reached(), name)
            return
        over_quota = self.port.settings.over_quota(request)
        if over_quota is not None:
            self._refuse(over_quota, name)
            return
        lane = self.lanes.get(name)
        if lane is None:
            if len(self.lanes) - 1 >= MAX_NAMED_LANES:
                self._refuse(ProtocolError.stream_limit(MAX_NAMED_LANES), name)
                return
            lane = self.lanes[name] = Lane(name)
        try:
            self.hold(size)
        except ProtocolError as e:
            self._refuse(e, name)
            return
        pending = Pending(request, size, parse_ns, mcp=mcp)
        if frame is not None:
            steered = self.steering.continuation(request, frame, name)
            if isinstance(steered, ProtocolError):
                # Refused with the steers (over the item limit, say): its bytes leave
                # the bounds; the steers stay queued for the next continuation.
                self.dequeued(size)
                self._refuse(steered, name)
                return
            if steered is not None:
                request, frame, carried = steered
                pending = Pending(request, size, parse_ns, steered=carried, mcp=mcp)
                if mcp is not None and mcp.checks:
                    mcp.frame = frame  # approved calls' outputs go into the steered frame
        lane.queue.append(pending)
        if lane.free and len(lane.queue) == 1:
            self.ready.append(lane)
        self.pump()
        if not pending.started and frame is not None:
            pending.parsed, pending.frame = None, frame  # it waits: keep the smaller form

    def _note_skipped(self, tools: list[tuple[str, str | None]]) -> None:
        # Codex sends tool types no local model runs (web_search, custom, ...): they are
        # accepted and left out of the prompt. Said once per connection, not per turn.
        for tool in tools:
            if tool not in self._skipped_tools:
                self._skipped_tools.add(tool)
                log.info(
                    "tool %s (type %s) is not rendered: this server cannot run it", tool[1], tool[0]
                )

    def pump(self) -> None:
        """Start queued requests while lanes are free and the in-flight cap allows."""
        port = self.port
        closing = self.expiring or port.closed
        while self.ready and port.in_flight < MAX_IN_FLIGHT and not closing:
            lane = self.ready.popleft()
            pending = lane.queue.popleft()
            pending.started = True
            self.dequeued(pending.size)
            port.start(lane, pending)
            if lane.free and lane.queue:
                self.ready.append(lane)

    def freed(self, lane: Lane) -> None:
        """What held `lane` (a response, its render or its commit) let go of it: its next
        request starts when it can."""
        if lane.free and lane.queue:
            self.ready.append(lane)
        self.pump()

    def cancel(self, event: CancelEvent) -> None:
        """`response.cancel` of a response by id, or of a lane's current one. Nothing
        running: the cancel crossed the terminal event on the wire."""
        if event.response_id is not None:
            target = self.port.running(event.response_id)
            if target is not None:
                target.cancel()
            return
        lane = self.lanes.get(event.stream_id)
        if lane is not None and lane.active is not None:
            lane.active.cancel()
        elif lane is not None and lane.rendering is not None:
            lane.rendering.cancelled = True  # `render_done` cancels it

    def hold(self, size: int) -> None:
        """Count `size` bytes of input waiting on this connection (queued requests,
        accepted steers, injected tool outputs) in its bound and the process's; raise the
        `ProtocolError` that refuses them past either."""
        if self.queued_bytes + size > self.max_queued_bytes:
            raise ProtocolError.limit(
                "websocket_queue_limit_reached",
                f"{self.queued_bytes} bytes of input are already queued on this "
                f"connection (limit {self.max_queued_bytes}); wait for responses "
                "to finish before sending more.",
                RETRY_AFTER_SECONDS,
            )
        if self.queue_memory is not None:
            self.queue_memory.reserve(self.port.settings.principal, size)
        self.queued_bytes += size

    def dequeued(self, size: int) -> None:
        """`size` held bytes leave the queue."""
        self.queued_bytes -= size
        if self.queue_memory is not None:
            self.queue_memory.release(self.port.settings.principal, size)

    def refuse_turn(self, pending: Pending, error: ProtocolError, name: str | None) -> None:
        """A turn refused before generation. An automatic successor, which no client
        request asked for, gets no `error` event; steering input it carried is returned
        (`Steering.successor_failed`)."""
        if not pending.automatic:
            self._refuse(error, name)
        if pending.steered is not None:
            self.steering.successor_failed(pending.steered, error)

    def refuse_queued(self, error: ProtocolError) -> bool:
        """Every queued request refused with `error` and every held byte released (the
        connection closes): whether a client's own request was among them."""
        refused = False
        for lane in self.lanes.values():
            while lane.queue:
                pending = lane.queue.popleft()
                self.refuse_turn(pending, error, lane.name)
                refused = refused or not pending.automatic
        self.ready.clear()
        self.dequeued(self.queued_bytes)
        return refused

    def clear(self) -> None:
        """The client went away: every lane empty and free, every held byte released."""
        for lane in self.lanes.values():
            lane.queue.clear()
            lane.active = None
            lane.rendering = None
            lane.ending = None
        self.ready.clear()
        self.dequeued(self.queued_bytes)

    def _refuse(self, error: ProtocolError, stream_id: str | None) -> None:
        self.port.emit(error.event(stream_id))
