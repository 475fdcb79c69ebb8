"""The wire shape of server events and Response objects (hotloop.events), checked
against the openai SDK's pydantic models."""

from __future__ import annotations

import orjson
import pytest
from hotloop._core import ChatFormat, Conversation, parse_request
from hotloop.events import ResponseEvents, Usage, error_event
from sdk_events import validate

FIELDS = orjson.dumps(
    {
        "instructions": None,
        "max_output_tokens": None,
        "metadata": {},
        "model": "sim",
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": None,
        "store": False,
        "temperature": None,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "truncation": "disabled",
    }
).decode()

TEXT_TURN = [
    ("message_start", 0),
    ("text", 0, 'Hello \u00e9"'),
    ("message_done", 0, 'Hello \u00e9"'),
]
TOOL_TURN = [
    ("reasoning_start", 0),
    ("reasoning", 0, "think"),
    ("reasoning_done", 0, "think"),
    ("call_start", 1, "exec_command", "call_1"),
    ("arguments", 1, '{"cmd":"ls"}'),
    ("call_done", 1, "exec_command", "call_1", '{"cmd":"ls"}'),
]


def run(parsed: list[tuple[object, ...]], stream_id: str | None = None) -> list[dict[str, object]]:
    events = ResponseEvents(FIELDS, stream_id=stream_id)
    frames = [events.lifecycle("response.created", "in_progress")]
    frames.append(events.lifecycle("response.in_progress", "in_progress"))
    events.feed(parsed, frames.append)
    usage = Usage(input_tokens=10, cached_tokens=4, cache_write_tokens=6, output_tokens=3)
    frames.append(events.lifecycle("response.completed", "completed", usage=usage))
    return [validate(f) for f in frames]


def test_text_answer_has_the_exact_event_sequence() -> None:
    got = run(TEXT_TURN)
    assert [e["type"] for e in got] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert all("stream_id" not in e for e in got)
    delta = got[4]
    assert delta["delta"] == 'Hello \u00e9"' and delta["logprobs"] == []
    assert delta["item_id"].startswith("msg_") and delta["content_index"] == 0
    final = got[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == 'Hello \u00e9"'
    assert final["usage"]["input_tokens_details"] == {"cached_tokens": 4, "cache_write_tokens": 6}
    assert final["usage"]["total_tokens"] == 13


def test_response_object_has_every_field_nulls_present() -> None:
    created = run(TEXT_TURN)[0]["response"]
    for name in (
        "id",
        "object",
        "created_at",
        "status",
        "model",
        "output",
        "parallel_tool_calls",
        "tool_choice",
        "tools",
        "previous_response_id",
        "instructions",
        "metadata",
        "temperature",
        "top_p",
        "max_output_tokens",
        "store",
        "text",
        "truncation",
        "usage",
        "error",
        "incomplete_details",
    ):
        assert name in created, name
    assert created["usage"] is None and created["id"].startswith("resp_")
    assert isinstance(created["created_at"], int)


def test_tool_turn_items_and_stream_id_echo() -> None:
    got = run(TOOL_TURN, stream_id="lane.1")
    assert all(e["stream_id"] == "lane.1" for e in got)
    kinds = [e["type"] for e in got]
    assert kinds[2:6] == [
        "response.output_item.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.output_item.done",
    ]
    assert kinds[6:9] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
    ]
    call = got[-1]["response"]["output"][1]
    assert call["id"].startswith("fc_") and call["call_id"] == "call_1"
    assert call["arguments"] == '{"cmd":"ls"}' and call["status"] == "completed"
    assert got[-1]["response"]["output"][0]["id"].startswith("rs_")


def test_empty_fields_object_still_makes_valid_json() -> None:
    events = ResponseEvents("{}")
    response = orjson.loads(events.response_json("completed", output=[], usage=Usage()))
    assert response["status"] == "completed" and response["usage"]["total_tokens"] == 0


@pytest.mark.parametrize("stream_id", [None, "a"])
def test_error_envelope_has_status_and_validates(stream_id: str | None) -> None:
    event = validate(error_event("invalid_json", "bad", None, stream_id=stream_id))
    assert event["status"] == 400
    assert event["error"] == {
        "type": "invalid_request_error",
        "code": "invalid_json",
        "message": "bad",
        "param": None,
    }
    assert event.get("stream_id") == stream_id


def test_failed_and_cancelled_terminals_validate() -> None:
    events = ResponseEvents(FIELDS)
    error = {"code": "server_error", "message": "boom"}
    failed = validate(events.lifecycle("response.failed", "failed", usage=Usage(), error=error))
    assert failed["response"]["error"] == error
    cancelled = validate(events.lifecycle("response.incomplete", "cancelled", usage=Usage()))
    assert cancelled["response"]["status"] == "cancelled"
    truncated = validate(
        events.lifecycle(
            "response.incomplete",
            "incomplete",
            usage=Usage(),
            incomplete_reason="max_output_tokens",
        )
    )
    assert truncated["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_batch_of_tokens_is_one_delta_event() -> None:
    """The parser hands over a batch's deltas of one item as one event, so an engine
    batch costs one frame however many tokens it holds."""
    chat_format = ChatFormat.harmony()
    conversation = Conversation(chat_format, context_window=1 << 20)
    conversation.extend(parse_request('{"model":"sim","input":"go"}'))
    parser = conversation.parser()
    text = "one two three four five six seven eight"
    ids = chat_format.completion_tokens(text=text)
    events = ResponseEvents(FIELDS)
    frames: list[bytes] = []
    half = len(ids) // 2
    events.feed(parser.feed(ids[:half]), frames.append)
    events.feed(parser.feed(ids[half:]), frames.append)
    events.feed(parser.finish()[0], frames.append)
    got = [validate(f) for f in frames]
    deltas = [e["delta"] for e in got if e["type"] == "response.output_text.delta"]
    assert len(deltas) == 2 and "".join(deltas) == text
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
