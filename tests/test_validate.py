"""Request parsing and validation through hotloop._core's public API: events, items,
tools, limits, the echoed Response fields (checked with the openai SDK's own models)
and the content policy."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hotloop._core import (
    AppendEvent,
    CancelEvent,
    CoreError,
    CreateRequest,
    Limits,
    Policy,
    ProcessedEvent,
    UnknownEvent,
    parse_event,
    parse_request,
)
from openai.types.responses import Response


def create(**fields: Any) -> CreateRequest:
    event = parse_event(json.dumps({"type": "response.create", **fields}))
    assert isinstance(event, CreateRequest)
    return event


def error_of(**fields: Any) -> CoreError:
    error = create(**fields).error
    assert error is not None, fields
    return error


@pytest.mark.parametrize(
    "frame",
    ["", "{", "[]", "null", '"response.create"', "{}", '{"type": 1}', b"\xff\xfe", "\ud800"],
)
def test_malformed_frames_raise_invalid_json(frame: str | bytes) -> None:
    with pytest.raises(CoreError) as info:
        parse_event(frame)
    assert info.value.code == "invalid_json"
    assert info.value.param is None


def test_flat_and_nested_forms_are_the_same_request() -> None:
    body = {"model": "m", "input": "hi", "stream": True, "instructions": "be brief"}
    flat = create(**body)
    nested = parse_event(json.dumps({"type": "response.create", "response": body}))
    assert isinstance(nested, CreateRequest)
    assert flat.error is None and nested.error is None
    assert flat.input_json == nested.input_json
    assert flat.response_fields_json == nested.response_fields_json
    assert (flat.model, flat.instructions, flat.stream) == ("m", "be brief", True)


def test_defaults() -> None:
    request = create(input=[])
    assert request.type == "response.create"
    assert request.error is None
    assert (request.store, request.generate, request.background) == (True, True, False)
    assert request.model is None and request.previous_response_id is None
    assert request.max_output_tokens is None and request.temperature is None
    assert request.input_item_count == 0 and request.input_json == "[]"
    assert request.skipped_tools == []


def test_string_input_is_one_user_message() -> None:
    request = create(input="hello")
    assert request.input_item_count == 1
    assert json.loads(request.input_json) == [
        {"type": "message", "role": "user", "content": "hello"}
    ]


def test_unknown_fields_from_codex_are_ignored() -> None:
    request = create(
        model="gpt-5-codex",
        input=[{"type": "reasoning", "summary": [], "encrypted_content": "gAAA..."}],
        include=["reasoning.encrypted_content"],
        prompt_cache_key="k",
        client_metadata={"x": {"y": [1, 2]}},
        reasoning={"effort": "medium", "summary": "auto"},
        text={"verbosity": "low"},
        service_tier="auto",
    )
    assert request.error is None
    assert request.reasoning_effort == "medium"
    assert json.loads(request.response_fields_json)["text"] == {
        "verbosity": "low",
        "format": {"type": "text"},
    }


def test_other_events() -> None:
    cancel = parse_event('{"type": "response.cancel", "response_id": "resp_1", "stream_id": "a"}')
    assert isinstance(cancel, CancelEvent)
    assert (cancel.type, cancel.response_id, cancel.stream_id) == ("response.cancel", "resp_1", "a")
    processed = parse_event('{"type": "response.processed", "response_id": "resp_1"}')
    assert isinstance(processed, ProcessedEvent) and processed.response_id == "resp_1"
    unknown = parse_event('{"type": "session.update", "stream_id": "b"}')
    assert isinstance(unknown, UnknownEvent)
    assert (unknown.type, unknown.stream_id) == ("session.update", "b")
    output = {"type": "function_call_output", "call_id": "call_1", "output": "ok"}
    append = parse_event(
        json.dumps({"type": "response.append", "response_id": "resp_1", "input": [output]})
    )
    assert isinstance(append, AppendEvent)
    assert append.error is None and json.loads(append.input_json) == [output]
    bad = parse_event('{"type": "response.append", "input": 5}')
    assert isinstance(bad, AppendEvent) and bad.error is not None
    assert bad.error.code == "invalid_type"


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"temperature": 2.5}, "invalid_value", "temperature"),
        ({"top_p": 1.5}, "invalid_value", "top_p"),
        ({"max_output_tokens": 0}, "invalid_value", "max_output_tokens"),
        ({"max_output_tokens": 1.5}, "invalid_type", "max_output_tokens"),
        ({"store": "yes"}, "invalid_type", "store"),
        ({"metadata": {"k": 1}}, "invalid_type", "metadata.k"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "invalid_value", "metadata"),
        ({"tool_choice": "maybe"}, "invalid_value", "tool_choice"),
        (
            {"tool_choice": {"type": "function", "name": "nope"}},
            "invalid_value",
            "tool_choice.name",
        ),
        ({"input": 3}, "invalid_type", "input"),
        ({"input": [{"content": "x"}]}, "missing_required_parameter", "input[0].type"),
        ({"input": [{"role": "robot", "content": "x"}]}, "invalid_value", "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "unsupported_content",
            "input[0].content[0]",
        ),
        (
            {"input": ["ok", {"role": "user", "content": [{"type": "input_text", "text": 1}]}]},
            "invalid_type",
            "input[0]",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]},
            "invalid_type",
            "input[0].content[0].text",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
            "missing_required_parameter",
            "input[0].arguments",
        ),
        (
            {"tools": [{"type": "function", "name": "f", "parameters": {"type": "obj"}}]},
            "invalid_tool_schema",
            "tools[0].parameters.type",
        ),
        (
            {
                "tools": [
                    {"type": "web_search"},
                    {"type": "function", "name": "f", "parameters": {"$ref": "#/$defs/X"}},
                ]
            },
            "invalid_tool_schema",
            "tools[1].parameters.$ref",
        ),
    ],
)
def test_schema_errors_have_codes_and_params(fields: dict[str, Any], code: str, param: str) -> None:
    request = create(stream_id="lane-1", **fields)
    assert request.error is not None
    assert (request.error.code, request.error.param) == (code, param), request.error.message
    # The server still learns the lane, to answer on it.
    assert request.stream_id == "lane-1"


def test_limits() -> None:
    limits = Limits(max_items=2, max_text_bytes=8, max_tools=1)
    frame = json.dumps({"type": "response.create", "input": ["a", "b", "c"]})
    request = parse_event(frame, limits)
    assert isinstance(request, CreateRequest) and request.error is not None
    assert request.error.code == "array_above_max_length"
    frame = json.dumps({"type": "response.create", "input": "123456789"})
    request = parse_event(frame, limits)
    assert isinstance(request, CreateRequest) and request.error is not None
    assert (request.error.code, request.error.param) == ("string_above_max_length", "input")


def test_non_function_tools_are_accepted_and_reported() -> None:
    request = create(
        input="x",
        tools=[
            {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
            {"type": "custom", "name": "apply_patch", "format": {"type": "text"}},
            {"type": "web_search"},
        ],
    )
    assert request.error is None
    assert request.skipped_tools == [("custom", "apply_patch"), ("web_search", None)]


def test_http_body() -> None:
    request = parse_request(b'{"model": "m", "input": "hi", "stream": true}')
    assert request.stream and request.error is None
    with pytest.raises(CoreError) as info:
        parse_request(b"[1, 2]")
    assert info.value.code == "invalid_json"


def full_response(request: CreateRequest) -> dict[str, Any]:
    fields = json.loads(request.response_fields_json)
    if fields["model"] is None:
        fields["model"] = "served-model"
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": "completed",
        "output": [],
        "usage": None,
        "error": None,
        "incomplete_details": None,
        **fields,
    }


@pytest.mark.parametrize(
    "fields",
    [
        {"input": "hi"},
        {
            "model": "m",
            "instructions": "be brief",
            "max_output_tokens": 100,
            "metadata": {"a": "b"},
            "parallel_tool_calls": False,
            "previous_response_id": "resp_0",
            "reasoning": {"effort": "low", "summary": "auto"},
            "store": False,
            "temperature": 0.2,
            "top_p": 0.5,
            "text": {"format": {"type": "json_object"}, "verbosity": "low"},
            "truncation": "auto",
            "tool_choice": {"type": "function", "name": "f"},
            "tools": [
                {
                    "type": "function",
                    "name": "f",
                    "description": "d",
                    "parameters": {"type": "object", "properties": {}},
                    "strict": True,
                },
                {"type": "web_search"},
            ],
        },
        {"tool_choice": "required", "tools": [{"type": "function", "name": "g"}]},
        {
            # What Codex sends: tools the server does not run are echoed as sent.
            "model": "gpt-5-codex",
            "store": False,
            "reasoning": {"effort": "medium", "summary": "auto"},
            "text": {"verbosity": "medium", "format": {"type": "text"}},
            "tools": [
                {
                    "type": "function",
                    "name": "exec_command",
                    "description": "Runs a command.",
                    "parameters": {
                        "type": "object",
                        "properties": {"cmd": {"type": "string"}},
                        "required": ["cmd"],
                        "additionalProperties": False,
                    },
                    "strict": False,
                },
                {
                    "type": "custom",
                    "name": "apply_patch",
                    "description": "Applies a patch.",
                    "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"},
                },
                {
                    "type": "namespace",
                    "name": "mcp_docs",
                    "description": "Docs server.",
                    "tools": [{"type": "function", "name": "search", "parameters": {}}],
                },
                {"type": "tool_search"},
                {"type": "web_search"},
            ],
        },
    ],
)
def test_response_fields_validate_against_the_sdk_model(fields: dict[str, Any]) -> None:
    request = create(**fields)
    assert request.error is None
    response = Response.model_validate(full_response(request))
    for key, value in fields.items():
        if key in ("input", "tools"):
            continue
        echoed = getattr(response, key)
        dumped = echoed.model_dump(exclude_none=True) if hasattr(echoed, "model_dump") else echoed
        assert dumped == value, key
    assert len(response.tools) == len(fields.get("tools", []))


def test_policy_scans_new_text_only_and_names_the_part() -> None:
    policy = Policy(["forbidden phrase", "rm -rf /"])
    clean = create(input=[{"role": "user", "content": "hello"}])
    policy.check(clean)
    hit = create(
        instructions="fine",
        input=[
            {"role": "user", "content": "hello"},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "a "},
                    {"type": "input_text", "text": "FORBIDDEN Phrase here"},
                ],
            },
        ],
    )
    with pytest.raises(CoreError) as info:
        policy.check(hit)
    assert (info.value.code, info.value.param) == (
        "content_policy_violation",
        "input[1].content[1].text",
    )
    in_instructions = create(input=[], instructions="please rm -rf / now")
    with pytest.raises(CoreError) as info:
        policy.check(in_instructions)
    assert info.value.param == "instructions"
    exact = Policy(["Secret"], case_insensitive=False)
    exact.check(create(input="secret"))
    with pytest.raises(CoreError):
        exact.check(create(input="a Secret"))


def test_empty_policy_pattern_is_refused() -> None:
    with pytest.raises(CoreError) as info:
        Policy([""])
    assert info.value.code == "invalid_value"
