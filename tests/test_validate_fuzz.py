"""Fuzzing the request parser through Python: random bytes, random JSON, and mutations of
valid requests always give a CoreError or a parsed event, never a panic or a crash, and
what a parsed request exposes is well formed."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hotloop._core import (
    AppendEvent,
    CancelEvent,
    CoreError,
    CreateRequest,
    Limits,
    ProcessedEvent,
    UnknownEvent,
    parse_event,
    parse_request,
)
from hypothesis import given, settings
from hypothesis import strategies as st

CODES = {
    "invalid_json",
    "invalid_type",
    "missing_required_parameter",
    "invalid_value",
    "string_above_max_length",
    "array_above_max_length",
    "invalid_tool_schema",
    "unsupported_content",
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=25,
)

VALID: dict[str, Any] = {
    "type": "response.create",
    "model": "m",
    "stream_id": "lane",
    "instructions": "be brief",
    "input": [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
    ],
    "tools": [
        {
            "type": "function",
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "string"}, "b": {"$ref": "#/$defs/B"}},
                "required": ["a"],
                "$defs": {"B": {"type": "array", "items": {"enum": [1, 2]}}},
            },
        },
        {"type": "custom", "name": "apply_patch"},
    ],
    "tool_choice": {"type": "function", "name": "f"},
    "metadata": {"k": "v"},
    "reasoning": {"effort": "low"},
    "text": {"format": {"type": "text"}},
    "temperature": 1.0,
    "top_p": 0.5,
    "max_output_tokens": 10,
}


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location in a JSON document, the root included."""
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            found += paths(child, (*prefix, i))
    return found


def replaced(doc: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(doc) if isinstance(doc, dict) else list(doc)
    copy[path[0]] = new if len(path) == 1 else replaced(doc[path[0]], path[1:], new)
    return copy


def check_outcome(frame: str | bytes, limits: Limits | None = None) -> None:
    try:
        event = parse_event(frame, limits)
    except CoreError as error:
        # invalid_value: a value a strict parser refuses, in an event without an error slot.
        assert error.code in ("invalid_json", "invalid_value")
        return
    assert isinstance(
        event, CreateRequest | CancelEvent | ProcessedEvent | AppendEvent | UnknownEvent
    )
    if isinstance(event, CreateRequest):
        if event.error is not None:
            assert event.error.code in CODES, event.error.code
            assert event.error.param is None or isinstance(event.error.param, str)
            assert event.error.message
        else:
            fields = strict_load(event.response_fields_json)
            assert isinstance(fields["tools"], list)
            assert isinstance(strict_load(event.input_json), list)
            assert event.input_item_count == len(json.loads(event.input_json))


def strict_load(text: str) -> Any:
    """The boundary invariant: what the core accepted loads in orjson (no lone
    surrogate, no number outside a double), and no integer needs more than 64 bits."""
    value = orjson.loads(text)

    def check_ints(v: Any) -> None:
        if isinstance(v, int) and not isinstance(v, bool):
            assert -(2**63) <= v < 2**64, v
        for child in v.values() if isinstance(v, dict) else v if isinstance(v, list) else ():
            check_ints(child)

    check_ints(json.loads(text))
    return value


# Values a strict parser refuses or would change, as raw JSON text.
POISON = [
    "1e999",
    "-1e999",
    "1" * 400,
    "-" + "9" * 20,
    "18446744073709551616",
    "1" * 400 + ".5",
    '"\\ud800"',
    '"\\udfff"',
    '"a\\ud800\\u0041"',
    '"\\udbffz"',
]
# Their neighbours that every strict parser accepts unchanged.
EDGE = [
    "1.7976931348623157e308",
    "1e-999",
    "-9223372036854775808",
    "18446744073709551615",
    '"\\ud83d\\ude00"',
    '"\\u0000"',
]
SENTINEL = "@@value@@"


def param_of(path: tuple[Any, ...]) -> str:
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out


@settings(max_examples=600, deadline=None)
@given(st.data())
def test_values_strict_parsers_refuse_are_refused_at_their_field(data: st.DataObject) -> None:
    """A poisoned value anywhere (a replaced value or a new unknown field, flat or
    nested, over WebSocket or HTTP) is `invalid_value` at its path; its accepted
    neighbours round-trip."""
    doc: Any = VALID
    path = data.draw(st.sampled_from([p for p in paths(doc) if p and p[0] != "type"]))
    target = doc
    for step in path:
        target = target[step]
    if isinstance(target, dict) and data.draw(st.booleans()):
        path = (*path, "zz")
    doc = replaced(doc, path, SENTINEL)
    nested = data.draw(st.booleans())
    if nested:
        doc = {"type": "response.create", "response": {k: v for k, v in doc.items() if k != "type"}}
        path = ("response", *path)
    text = json.dumps(doc)
    poison = data.draw(st.sampled_from(POISON))
    event = parse_event(text.replace(f'"{SENTINEL}"', poison))
    assert isinstance(event, CreateRequest) and event.error is not None
    assert (event.error.code, event.error.param) == ("invalid_value", param_of(path))
    if not nested:
        body = text.replace('"type": "response.create", ', "", 1)
        request = parse_request(body.replace(f'"{SENTINEL}"', poison))
        assert request.error is not None and request.error.param == param_of(path)
    check_outcome(text.replace(f'"{SENTINEL}"', data.draw(st.sampled_from(EDGE))))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes(frame: bytes) -> None:
    check_outcome(frame)


@settings(max_examples=300, deadline=None)
@given(json_values, st.sampled_from(["response.create", "response.append", "response.cancel", "x"]))
def test_random_json_events(value: Any, kind: str) -> None:
    check_outcome(json.dumps(value))
    if isinstance(value, dict):
        check_outcome(json.dumps({**value, "type": kind}))


@settings(max_examples=600, deadline=None)
@given(st.data())
def test_mutations_of_a_valid_request(data: st.DataObject) -> None:
    doc: Any = VALID
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        path = data.draw(st.sampled_from(paths(doc)))
        if path and path[0] == "type":
            continue
        doc = replaced(doc, path, data.draw(json_values))
    check_outcome(json.dumps(doc))
    check_outcome(json.dumps(doc), Limits(max_items=2, max_text_bytes=3, max_tools=1))
    if isinstance(doc, dict):
        nested = {"type": "response.create", "response": doc}
        check_outcome(json.dumps(nested))


def outcome(frame: str | bytes) -> tuple[str, str | None, str | None]:
    """What a parse came to: the event type and, for a failure, its code and param."""
    try:
        event = parse_event(frame)
    except CoreError as error:
        return ("raised", error.code, error.param)
    error = getattr(event, "error", None)
    return (event.type, error and error.code, error and error.param)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_str_and_bytes_frames_parse_alike(data: st.DataObject) -> None:
    doc: Any = VALID
    path = data.draw(st.sampled_from(paths(doc)))
    if not path or path[0] != "type":
        doc = replaced(doc, path, data.draw(json_values))
    text = json.dumps(doc, ensure_ascii=data.draw(st.booleans()))
    assert outcome(text) == outcome(text.encode())


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=100))
def test_random_http_bodies(body: str) -> None:
    try:
        request = parse_request(body)
    except CoreError as error:
        assert error.code == "invalid_json"
    else:
        assert isinstance(request, CreateRequest)


def test_the_valid_request_is_valid() -> None:
    request = parse_event(json.dumps(VALID))
    assert isinstance(request, CreateRequest)
    assert request.error is None, request.error
    assert request.input_item_count == 5


def test_deep_nesting_is_an_error_not_a_stack_overflow() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    check_outcome(f'{{"type": "response.create", "input": {deep}}}')
    schema = '{"items":' * 5_000 + "{}" + "}" * 5_000
    check_outcome(
        '{"type": "response.create", "tools": [{"type": "function", "name": "f", "parameters": '
        + schema
        + "}]}"
    )
