"""What a steer is (protocol.md section 8): a `response.steer` frame checked (`Steer`),
the steering input a turn carries (`Steered`), and the `response.create` frames steering
turns into (the automatic successor, and a continuation with the queued input
prepended). Plain data and functions: a connection's steers and their transitions are
`steering.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from hotloop._core import CreateRequest
from hotloop.events import ResponseEvents, new_id
from hotloop.protocol.errors import ProtocolError

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
