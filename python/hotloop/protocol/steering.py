"""`response.steer` (protocol.md section 8): what a steer frame may hold, the
submissions a connection has accepted, the `response.create` frames steering turns into
(the automatic successor, and the client's continuation of a response that stopped for
tool output, with the queued input prepended), and a connection's steering state
(`Steering`): steers accepted by a running response, pending for a response that waits
for tool output, failed with their input returned, and the successors they start.

Refusals are `ProtocolError`s whose `code` is one of the SDK's steer error codes, sent
as `response.steer.failed` with the input returned. Where a steered response stops (its
item boundary) is the response's own (`response.py`); this module says what follows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from hotloop._core import CoreError, CreateRequest, parse_event
from hotloop.events import ResponseEvents, new_id
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.lanes import Pending
from hotloop.protocol.state import State

if TYPE_CHECKING:
    from hotloop.protocol.connection import Connection
    from hotloop.protocol.response import Ending, Response

MAX_PENDING_STEERS = 8
"""Accepted steers one response may hold before `too_many_pending_steers`."""
STEER_FIELDS = {"type", "previous_response_id", "input"}
MESSAGE_FIELDS = {"type", "role", "content"}
# The request fields an automatic successor inherits from its target: the ones a
# Response echoes and a request accepts (`previous_response_id` is the target's id).
INHERITED = (
    "instructions",
    "max_output_tokens",
    "metadata",
    "model",
    "parallel_tool_calls",
    "reasoning",
    "store",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_p",
    "truncation",
)


@dataclass(frozen=True)
class Steer:
    """An accepted steering submission: `input` as the client sent it (returned in
    `response.steer.failed`), `items` its user messages as input items."""

    id: str
    previous_response_id: str
    input: Any
    items: tuple[dict[str, Any], ...]
    size: int = 0
    """The frame's bytes, held in the queue memory while the steer waits."""

    def wire(self) -> dict[str, str]:
        return {"id": self.id, "previous_response_id": self.previous_response_id}


def invalid(message: str) -> ProtocolError:
    return ProtocolError("invalid_input", message, "input")


def parse_steer(event: dict[str, Any], size: int = 0) -> Steer:
    """Validate a `response.steer` frame (decoded, `size` bytes) and mint its steer id.
    Raises `ProtocolError` `invalid_input`."""
    extra = sorted(set(event) - STEER_FIELDS)
    if extra:
        # `stream_id` among them: the target fixes the lane.
        raise invalid(
            f"response.steer takes only type, previous_response_id and input; got {extra}."
        )
    target = event.get("previous_response_id")
    if not isinstance(target, str) or not target:
        raise invalid("previous_response_id must be a response id.")
    raw = event.get("input")
    return Steer(new_id("steer_"), target, raw, tuple(_messages(raw)), size)


def _messages(raw: Any) -> list[dict[str, Any]]:
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise invalid("input must be a string or a non-empty list of user messages.")
    items = []
    for n, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) - MESSAGE_FIELDS:
            raise invalid(f"input[{n}] must be a message of only type, role and content.")
        if item.get("type", "message") != "message" or item.get("role") != "user":
            raise invalid(f"input[{n}]: steering takes user messages only.")
        content = item.get("content")
        texts = isinstance(content, list) and all(
            isinstance(part, dict)
            and part.get("type") == "input_text"
            and isinstance(part.get("text"), str)
            for part in content
        )
        if not isinstance(content, str) and not (texts and content):
            raise invalid(f"input[{n}].content must be a string or input_text parts.")
        items.append({"type": "message", "role": "user", "content": content})
    return items


def inherited(fields_json: str) -> dict[str, Any]:
    """The request fields of a response (`CreateRequest.response_fields_json`) that a
    request continuing it on the server's initiative carries over."""
    fields = orjson.loads(fields_json)
    return {key: fields[key] for key in INHERITED if key in fields}


def successor_frame(
    request: CreateRequest, target: str, steers: list[Steer], stream_id: str | None
) -> bytes:
    """The `response.create` of the automatic successor: the target's settings
    (`request` is the target's), the target as its parent, the steering input in
    submission order as its input, and the target's conversation: the successor
    continues it (its items are appended after the target's)."""
    frame = inherited(request.response_fields_json)
    frame.update(
        type="response.create",
        previous_response_id=target,
        input=[item for steer in steers for item in steer.items],
    )
    if request.conversation is not None:
        frame["conversation"] = request.conversation
    if stream_id is not None:
        frame["stream_id"] = stream_id
    return orjson.dumps(frame)


def with_steering(frame: str | bytes, steers: list[Steer]) -> bytes:
    """The client's `response.create` (flat or nested form) with the queued steering
    input prepended to its own, in submission order."""
    event = orjson.loads(frame)
    body = event["response"] if isinstance(event.get("response"), dict) else event
    own = body.get("input")
    if isinstance(own, str):
        own = [{"type": "message", "role": "user", "content": own}]
    # `"input": null` is no input, as the core parses it.
    body["input"] = [item for steer in steers for item in steer.items] + (own or [])
    return orjson.dumps(event)


@dataclass
class Steered:
    """Steering input carried by a turn, with the events of the response it steered
    (its steer events continue that response's `sequence_number`)."""

    target: ResponseEvents
    steers: list[Steer]
    automatic: bool


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

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.awaiting: dict[str | None, Awaiting] = {}
        """Each lane's latest response, when it stopped for client tool output."""

    def receive(self, event: dict[str, Any], size: int) -> None:
        """`response.steer` (decoded, `size` bytes): accepted for a running response (it
        stops at its next item boundary, a successor follows) or one waiting for tool
        output (queued for the client's continuation); refused with
        `response.steer.failed` otherwise."""
        connection = self.connection
        target, raw_input = event.get("previous_response_id"), event.get("input")
        try:
            steer = parse_steer(event, size)
        except ProtocolError as e:
            self._failed(None, target, raw_input, e)
            return
        running = connection.running(steer.previous_response_id)
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
            error = connection.not_running(steer.previous_response_id)
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
            connection.hold(steer.size)
        except ProtocolError as e:
            self._failed(events, target, raw_input, e)
            return
        connection.outbox.append(events.event("response.steer.accepted", steer=steer.wire()))
        if running is not None:
            running.steers.append(steer)
            if running.state is State.WAITING_FOR_TOOLS:
                # Long-running mode: it goes into the turn the injected output resumes.
                self.announce_pending(events, [steer], connection.long_running.required(running))
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
            steered = self.connection.reparse(steered_frame)
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
            successor = parse_event(frame, self.connection.limits.request)
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
        self.connection.dequeued(sum(steer.size for steer in steers))

    def _pending(self, awaiting: Awaiting, steers: list[Steer]) -> None:
        awaiting.steers.extend(steers)
        self.announce_pending(awaiting.events, steers, awaiting.required)

    def announce_pending(
        self, events: ResponseEvents, steers: list[Steer], required: list[dict[str, str]]
    ) -> None:
        """`response.steer.pending`: the steers wait for the client's tool output."""
        for steer in steers:
            self.connection.outbox.append(
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
            self.connection.outbox.append(
                orjson.dumps({"type": "response.steer.failed", **fields, "sequence_number": 0})
            )
        else:
            self.connection.outbox.append(events.event("response.steer.failed", **fields))
