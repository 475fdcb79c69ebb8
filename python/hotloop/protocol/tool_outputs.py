"""Tool outputs a client injects into a waiting response (protocol.md section 8): what a
`response.inject` (or `response.append`) frame may hold (`Injection`), which calls it
answers, and the `response.create` frame that appends outputs to a response's
conversation. Plain data and functions: the waiting responses and their transitions
are `injection.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from hotloop._core import AppendEvent
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.steers import inherited

INJECT_FIELDS = {"type", "response_id", "input"}


@dataclass(frozen=True)
class Injection:
    """A well-formed injection: `input` as the client sent it (returned in
    `response.inject.failed`), `items` its `function_call_output` items, `size` the
    frame's bytes (held in the queue memory until the response resumes)."""

    response_id: str | None
    input: Any
    items: list[dict[str, Any]]
    size: int


def returned_input(raw: Any) -> list[Any]:
    """The input as `response.inject.failed` returns it: the list sent, or none."""
    return raw if isinstance(raw, list) else []


def invalid(message: str) -> ProtocolError:
    return ProtocolError("invalid_input", message, "input")


def as_append(event: dict[str, Any]) -> bytes:
    """A `response.inject` frame (decoded) as the core's `response.append`, which parses
    and checks tool outputs the same way."""
    return orjson.dumps({**event, "type": "response.append"})


def parse_injection(append: AppendEvent, event: dict[str, Any], size: int) -> Injection:
    """Check an injection frame (`event` decoded, `append` the core's parse of it).
    Raises `ProtocolError` `invalid_input`."""
    extra = sorted(set(event) - INJECT_FIELDS)
    if extra:
        raise invalid(f"{event.get('type')} takes only type, response_id and input; got {extra}.")
    if append.error is not None:
        raise invalid(append.error.message)
    raw = event.get("input")
    if not isinstance(raw, list) or not raw:
        raise invalid("input must be a non-empty list of function_call_output items.")
    items = orjson.loads(append.input_json)
    for n, item in enumerate(items):
        if item.get("type") != "function_call_output":
            raise invalid(f"input[{n}]: only function_call_output items can be injected.")
    return Injection(append.response_id, raw, items, size)


def answer(waiting: dict[str, str], injection: Injection) -> list[str]:
    """The call ids `injection` answers, each a call the response waits for, none
    twice. Raises `ProtocolError` `invalid_input` otherwise."""
    answered: list[str] = []
    for n, item in enumerate(injection.items):
        call_id = item.get("call_id")
        if call_id not in waiting or call_id in answered:
            raise invalid(
                f"input[{n}].call_id {call_id!r} answers no call this response waits for "
                f"(waiting: {sorted(set(waiting) - set(answered))})."
            )
        answered.append(call_id)
    return answered


def resume_frame(
    fields_json: str, items: list[dict[str, Any]], max_output_tokens: int | None
) -> bytes:
    """The `response.create` whose `extend` appends the injected outputs to the waiting
    response's conversation and opens its next model turn: the response's own settings
    (unchanged instructions and tools render nothing again), the output budget it has
    left, the outputs as input."""
    frame = inherited(fields_json)
    frame.update(type="response.create", input=items, max_output_tokens=max_output_tokens)
    return orjson.dumps(frame)
