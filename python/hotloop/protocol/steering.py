"""`response.steer` (protocol.md section 8): a connection's steering state (`Steering`,
over a `SteeringPort`): steers accepted by a running response, pending for a response
that waits for tool output, failed with their input returned, and the successors they
start. What a steer frame may hold and the frames steering turns into are `steers.py`'s.

Refusals are `ProtocolError`s whose `code` is one of the SDK's steer error codes, sent
as `response.steer.failed` with the input returned. Where a steered response stops (its
item boundary) is the response's own (`response.py`); this module says what follows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from hotloop._core import CoreError, CreateRequest, parse_event
from hotloop.events import ResponseEvents
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.lanes import Pending
from hotloop.protocol.response import Ending, Response, ResponsePort
from hotloop.protocol.state import State
from hotloop.protocol.steers import (
    Steer,
    Steered,
    parse_steer,
    successor_frame,
    with_steering,
)

MAX_PENDING_STEERS = 8
"""Accepted steers one response may hold before `too_many_pending_steers`."""


class SteeringPort(ResponsePort, Protocol):
    """A connection's services, and how it parses a `response.create` frame again."""

    def reparse(self, frame: str | bytes) -> CreateRequest:
        """A `response.create` frame parsed as the connection parses one; raises what
        its parse refuses with."""
        ...


@dataclass
class Awaiting:
    """A lane's latest response, which stopped for client tool output: steers for it
    stay queued for the client's continuation."""

    events: ResponseEvents
    required: list[dict[str, str]]
    steers: list[Steer] = field(default_factory=list)


class Steering:
    """A connection's steers: accepted by a running response (a successor follows its
    terminal event), pending for a response that waits for tool output, or failed with
    their input returned. Their bytes count in the connection's queue bounds until a
    request takes them."""

    def __init__(self, port: SteeringPort) -> None:
        self.port = port
        self.awaiting: dict[str | None, Awaiting] = {}
        """Each lane's latest response, when it stopped for client tool output."""

    def receive(self, event: dict[str, Any], size: int) -> None:
        """`response.steer` (decoded, `size` bytes): accepted for a running response (it
        stops at its next item boundary, a successor follows) or one waiting for tool
        output (queued for the client's continuation); refused with
        `response.steer.failed` otherwise."""
        port = self.port
        target, raw_input = event.get("previous_response_id"), event.get("input")
        try:
            steer = parse_steer(event, size)
        except ProtocolError as e:
            self._failed(None, target, raw_input, e)
            return
        running = port.running(steer.previous_response_id)
        awaiting = next(
            (
                a
                for a in self.awaiting.values()
                if a.events.response_id == steer.previous_response_id
            ),
            None,
        )
        held = running.steers if running is not None else awaiting.steers if awaiting else None
        events = running.events if running is not None else awaiting.events if awaiting else None
        if held is None or events is None:
            error = port.not_running(steer.previous_response_id)
            self._failed(None, target, raw_input, error)
            return
        if len(held) >= MAX_PENDING_STEERS:
            error = ProtocolError(
                "too_many_pending_steers",
                f"Response '{steer.previous_response_id}' already holds "
                f"{MAX_PENDING_STEERS} steers.",
            )
            self._failed(events, target, raw_input, error)
            return
        try:
            port.hold(steer.size)
        except ProtocolError as e:
            self._failed(events, target, raw_input, e)
            return
        port.emit(events.event("response.steer.accepted", steer=steer.wire()))
        if running is not None:
            running.steers.append(steer)
            if running.state is State.WAITING_FOR_TOOLS:
                # Long-running mode: it goes into the turn the injected output resumes.
                self.announce_pending(events, [steer], running.required_input())
        elif awaiting is not None:
            self._pending(awaiting, [steer])

    def continuation(
        self, request: CreateRequest, frame: str | bytes, stream_id: str | None
    ) -> tuple[CreateRequest, bytes, Steered] | ProtocolError | None:
        """The continuation of a response that waited for tool output takes the steers
        queued for it, in submission order, before its own input: the request and frame
        it becomes, and the steering it carries (None without queued steers; the error
        that refuses it when the steered request is invalid)."""
        awaiting = self.awaiting.get(stream_id)
        if (
            awaiting is None
            or not awaiting.steers
            or request.previous_response_id != awaiting.events.response_id
        ):
            return None
        try:
            steered_frame = with_steering(frame, awaiting.steers)
            steered = self.port.reparse(steered_frame)
        except orjson.JSONDecodeError as e:
            return ProtocolError.undecodable(e)
        except CoreError as e:
            return ProtocolError.from_core(e)
        except ProtocolError as e:  # a compaction item that is not ours
            return e
        if steered.error is not None:
            # The core's limits count the steers too (over the item limit, say).
            return ProtocolError.from_core(steered.error)
        carried = Steered(awaiting.events, awaiting.steers, False)
        self.release(awaiting.steers)
        awaiting.steers = []
        return steered, steered_frame, carried

    def after_terminal(self, response: Response, ending: Ending) -> None:
        """After a terminal event: the steers its response accepted start the automatic
        successor, or stay queued while it waits for client tool output."""
        lane, events = response.lane, response.events
        # Calls answered by injected output inside the response wait for nothing.
        open_calls = set(response.conversation.open_call_ids)
        required = [
            {"type": "function_call_output", "call_id": item["call_id"], "name": item["name"]}
            for item in events.output
            if item["type"] == "function_call" and item["call_id"] in open_calls
        ]
        replaced = self.awaiting.get(lane.name)
        if replaced is not None:
            # Steers queued for the lane's previous response can no longer be taken.
            self.release(replaced.steers)
        if ending.checkpoint is not None and required and ending.finished.status == "completed":
            self.awaiting[lane.name] = Awaiting(events, required)
        else:
            self.awaiting.pop(lane.name, None)
        if not response.steers:
            return
        if ending.checkpoint is None:
            error = ProtocolError("response_not_active", "The steered response did not finish.")
            self.release(response.steers)
            self.failed(Steered(events, response.steers, True), error)
        elif lane.name in self.awaiting:
            self._pending(self.awaiting[lane.name], response.steers)
        else:
            self.release(response.steers)
            frame = successor_frame(
                response.request, events.response_id, response.steers, lane.name
            )
            successor = parse_event(frame, self.port.request_limits)
            steered = Steered(events, response.steers, True)
            if not isinstance(successor, CreateRequest) or successor.error is not None:
                self.failed(
                    steered,
                    ProtocolError(
                        "successor_creation_failed", "The successor is not a valid request."
                    ),
                )
                return
            # First on its lane: the successor runs before anything the client queued. On
            # a conversation, it starts where the target's items left it.
            start = ending.continued
            lane.queue.appendleft(Pending(successor, 0, 0, steered=steered, start=start))

    def release(self, steers: list[Steer]) -> None:
        """Steers leave the queue: started in a request, or refused."""
        self.port.dequeued(sum(steer.size for steer in steers))

    def _pending(self, awaiting: Awaiting, steers: list[Steer]) -> None:
        awaiting.steers.extend(steers)
        self.announce_pending(awaiting.events, steers, awaiting.required)

    def announce_pending(
        self, events: ResponseEvents, steers: list[Steer], required: list[dict[str, str]]
    ) -> None:
        """`response.steer.pending`: the steers wait for the client's tool output."""
        for steer in steers:
            self.port.emit(
                events.event(
                    "response.steer.pending",
                    steer=steer.wire(),
                    reason="waiting_for_required_input",
                    required_input=required,
                )
            )

    def successor_failed(self, steered: Steered, error: ProtocolError) -> None:
        """The turn carrying `steered` was refused before generation."""
        message = f"The successor failed: {error.message}"
        self.failed(steered, ProtocolError("successor_creation_failed", message))

    def failed(self, steered: Steered, error: ProtocolError) -> None:
        """The steers `steered` carries fail, their input returned."""
        for steer in steered.steers:
            self._failed(steered.target, steer.previous_response_id, steer.input, error, steer.id)

    def _failed(
        self,
        events: ResponseEvents | None,
        target: object,
        raw_input: object,
        error: ProtocolError,
        steer_id: str | None = None,
    ) -> None:
        steer: dict[str, object] = {
            "previous_response_id": target if isinstance(target, str) else "",
            "input": raw_input if isinstance(raw_input, str | list) else "",
        }
        if steer_id is not None:
            steer["id"] = steer_id
        fields: dict[str, object] = {
            "error": {
                "type": "invalid_request_error",
                "code": error.code,
                "message": error.message,
            },
            "steer": steer,
        }
        if events is None:
            # No response to number it within: it is the first event of its own.
            self.port.emit(
                orjson.dumps({"type": "response.steer.failed", **fields, "sequence_number": 0})
            )
        else:
            self.port.emit(events.event("response.steer.failed", **fields))
