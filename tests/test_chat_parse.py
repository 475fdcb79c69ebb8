"""The core's parse of Chat Completions bodies (`parse_chat_request`): a conversation
sent as chat messages is the same conversation as sent as Responses items, item for
item: the same content addresses (so a chat client resending its history finds the
states a turn left, on either API) and the same prompt ids, in every chat format."""

from __future__ import annotations

from typing import Any

import orjson
from hotloop._core import (
    Conversation,
    CreateRequest,
    Limits,
    parse_chat_request,
    parse_request,
)
from hotloop.engines.sim import SIM_FORMATS
from hypothesis import given, settings
from hypothesis import strategies as st

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
# Harmony, ChatML (SmolLM2) and a model's own Jinja template (Qwen3).
FORMATS = [build() for build in SIM_FORMATS.values()]
NAMES = st.sampled_from(["ls", "read_file", "run"])
CHAT_TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("ls", "read_file", "run")
]
RESPONSES_TOOLS = [
    {"type": "function", "name": name, "parameters": {"type": "object"}, "strict": False}
    for name in ("ls", "read_file", "run")
]


@st.composite
def turns(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A model turn as its pieces: reasoning, text, calls (with their outputs)."""
    count = draw(st.integers(0, 3))
    calls = [
        {"id": f"call_{n}", "name": draw(NAMES), "arguments": orjson.dumps({"n": n}).decode()}
        for n in range(count)
    ]
    return [
        {
            "user": draw(TEXT),
            "reasoning": draw(st.one_of(st.none(), TEXT.filter(bool))),
            "text": draw(TEXT.filter(bool)) if not calls else draw(st.one_of(st.none(), TEXT)),
            "calls": calls,
            "outputs": [draw(TEXT) for _ in calls],
        }
    ]


@st.composite
def conversations(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """One conversation as a chat body and as a Responses body."""
    system = draw(st.one_of(st.none(), TEXT))
    history = [turn for _ in range(draw(st.integers(1, 4))) for turn in draw(turns())]
    messages: list[dict[str, Any]] = (
        [] if system is None else [{"role": "system", "content": system}]
    )
    items: list[dict[str, Any]] = []
    for turn in history:
        messages.append({"role": "user", "content": [{"type": "text", "text": turn["user"]}]})
        items.append({"role": "user", "content": turn["user"]})
        assistant: dict[str, Any] = {"role": "assistant", "content": turn["text"]}
        if turn["reasoning"] is not None:
            assistant["reasoning_content"] = turn["reasoning"]
            summary = [{"type": "summary_text", "text": turn["reasoning"]}]
            items.append({"type": "reasoning", "summary": summary})
        if turn["text"]:
            items.append({"role": "assistant", "content": turn["text"]})
        if turn["calls"]:
            assistant["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {k: c[k] for k in ("name", "arguments")},
                }
                for c in turn["calls"]
            ]
        messages.append(assistant)
        for call in turn["calls"]:
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    **{k: call[k] for k in ("name", "arguments")},
                }
            )
        for call, output in zip(turn["calls"], turn["outputs"], strict=True):
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
            items.append({"type": "function_call_output", "call_id": call["id"], "output": output})
    chat = {"model": "m", "messages": messages, "tools": CHAT_TOOLS}
    responses = {"model": "m", "input": items, "tools": RESPONSES_TOOLS}
    if system is not None:
        responses["instructions"] = system
    return chat, responses


def parsed(chat: dict[str, Any], responses: dict[str, Any]) -> tuple[CreateRequest, CreateRequest]:
    as_chat = parse_chat_request(orjson.dumps(chat)).request
    as_items = parse_request(orjson.dumps(responses))
    assert as_chat.error is None and as_items.error is None, (as_chat.error, as_items.error)
    return as_chat, as_items


@settings(max_examples=60, deadline=None)
@given(conversations())
def test_chat_messages_are_the_same_items_as_responses_input(
    pair: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    as_chat, as_items = parsed(*pair)
    assert as_chat.prefix_digest == as_items.prefix_digest
    assert as_chat.history_digests() == as_items.history_digests()
    assert orjson.loads(as_chat.input_json) == [
        orjson.loads(parse_request(orjson.dumps({"input": [item]})).input_json)[0]
        for item in orjson.loads(as_chat.input_json)
    ]


@settings(max_examples=20, deadline=None)
@given(conversations())
def test_chat_messages_render_the_same_prompt(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    as_chat, as_items = parsed(*pair)
    for chat_format in FORMATS:
        prompts = []
        for request in (as_chat, as_items):
            conversation = Conversation(chat_format, context_window=1 << 20)
            conversation.extend(request)
            prompts.append(conversation.prompt().tokens())
        assert prompts[0] == prompts[1]


def test_errors_name_the_message_field_they_are_about() -> None:
    def error(messages: list[Any], **fields: Any) -> tuple[str, str | None]:
        body = orjson.dumps({"model": "m", "messages": messages, **fields})
        refused = parse_chat_request(body, Limits(max_text_bytes=8)).request.error
        assert refused is not None
        return refused.code, refused.param

    call = {"id": "c1", "type": "function", "function": {"name": "ls"}}
    assert error([{"role": "assistant", "tool_calls": [call]}]) == (
        "missing_required_parameter",
        "messages[0].tool_calls[0].function.arguments",
    )
    assert error([{"role": "tool", "content": "x"}]) == (
        "missing_required_parameter",
        "messages[0].tool_call_id",
    )
    assert error([{"role": "user", "content": "far too long"}]) == (
        "string_above_max_length",
        "messages[0].content",
    )
    assert error([{"role": "robot", "content": "x"}]) == ("invalid_value", "messages[0].role")
    assert error([{"role": "assistant"}]) == ("missing_required_parameter", "messages[0].content")
    assert error([{"role": "user", "content": "x"}], reasoning_effort="huge") == (
        "invalid_value",
        "reasoning_effort",
    )
