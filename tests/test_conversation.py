"""The rendered-token cache through the Python API, under the real formats (harmony over
o200k_harmony, ChatML over SmolLM2's own vocabulary): whatever the sequence of appends,
growing texts, turns, checkpoints and forks, the prompt is the tokens of rendering that
conversation from scratch; errors leave a conversation unchanged.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hotloop._core import (
    ChatFormat,
    Conversation,
    CoreError,
    Policy,
    Tokenizer,
    parse_request,
)
from hotloop.native_deps import smollm2_gguf_path
from hypothesis import given, settings
from hypothesis import strategies as st

WINDOW = 1 << 24

FORMATS: dict[str, ChatFormat] = {
    "harmony": ChatFormat.harmony(),
    "chatml": ChatFormat.chatml(
        Tokenizer.from_gguf(str(smollm2_gguf_path())),
        default_system="You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    ),
}

TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]

texts = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40
) | st.sampled_from(["", " ", "  \n", "don't", "<|end|>", "<|im_end|>", "12345", "日本語 🦀"])


@st.composite
def item_lists(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Input items in a valid order: every output answers an open call."""
    items: list[dict[str, Any]] = []
    open_calls: list[str] = []
    for n in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["user", "assistant", "developer", "call", "output"]))
        if kind == "call":
            call_id = f"call_{n}"
            open_calls.append(call_id)
            args = orjson.dumps({"cmd": draw(texts)}).decode()
            items.append(
                {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": "exec_command",
                    "arguments": args,
                }
            )
        elif kind == "output" and open_calls:
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": open_calls.pop(0),
                    "output": draw(texts),
                }
            )
        else:
            role = "user" if kind in ("call", "output") else kind
            items.append({"type": "message", "role": role, "content": draw(texts)})
    return items


def fresh(format: ChatFormat) -> Conversation:
    return Conversation(format, context_window=WINDOW)


def rendered(format: ChatFormat, items: list[dict[str, Any]], **prefix: Any) -> list[int]:
    """The reference: everything rendered at once, by a conversation that cached nothing."""
    conversation = fresh(format)
    conversation.append_items(orjson.dumps(items).decode(), **prefix)
    return conversation.prompt().tokens()


def request(items: list[dict[str, Any]] | str, **fields: Any) -> Any:
    return parse_request(orjson.dumps({"model": "m", "input": items, **fields}))


@pytest.mark.parametrize("name", list(FORMATS))
@settings(max_examples=60, deadline=None)
@given(items=item_lists(), cuts=st.lists(st.integers(0, 8), max_size=4))
def test_appending_in_steps_equals_rendering_at_once(
    name: str, items: list[dict[str, Any]], cuts: list[int]
) -> None:
    format = FORMATS[name]
    conversation = fresh(format)
    tools = orjson.dumps(TOOLS).decode()
    conversation.append_items("[]", instructions="Be brief.", tools_json=tools)
    bounds = sorted({min(c, len(items)) for c in cuts} | {len(items)})
    start = 0
    for end in bounds:
        conversation.append_items(orjson.dumps(items[start:end]).decode())
        start = end
    assert conversation.prompt().tokens() == rendered(
        format, items, instructions="Be brief.", tools_json=tools
    )
    assert conversation.stats["invalidations"] == 0


@pytest.mark.parametrize("name", list(FORMATS))
@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["user", "assistant", "output"]), chunks=st.lists(texts, max_size=8))
def test_growing_text_equals_the_whole_text(name: str, kind: str, chunks: list[str]) -> None:
    format = FORMATS[name]
    head: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "run it"}]
    if kind == "output":
        head.append(
            {"type": "function_call", "call_id": "c", "name": "exec_command", "arguments": "{}"}
        )
        last: dict[str, Any] = {"type": "function_call_output", "call_id": "c", "output": ""}
        field = "output"
    else:
        last = {"type": "message", "role": kind, "content": ""}
        field = "content"
    conversation = fresh(format)
    conversation.append_items(orjson.dumps([*head, last]).decode())
    for chunk in chunks:
        conversation.append_text(chunk)
    whole = {**last, field: "".join(chunks)}
    assert conversation.prompt().tokens() == rendered(format, [*head, whole])
    # The in-place path counts bytes over the cached ids; it must always apply unless the
    # vocabulary cannot spell the text (SmolLM2 drops such bytes, as llama.cpp does).
    joined = "".join(chunks)
    spelled = format.tokenizer.decode_bytes(format.tokenizer.encode(joined)) == joined.encode()
    assert conversation.stats["text_fallbacks"] == 0 or not spelled


@pytest.mark.parametrize("name", list(FORMATS))
def test_turns_checkpoints_and_forks(name: str) -> None:
    """An agent loop: each turn's output is kept verbatim, each checkpoint stays as it was,
    and a fork from an older checkpoint shares its prefix and continues independently."""
    format = FORMATS[name]
    conversation = fresh(format)
    checkpoints = []
    prompts = []
    call_id = ""
    for turn in range(4):
        if turn == 0:
            delta: list[dict[str, Any]] | str = "list the files"
        else:
            output = f"file_{turn}.py\n" * 20
            delta = [{"type": "function_call_output", "call_id": call_id, "output": output}]
        result = conversation.extend(request(delta, tools=TOOLS, max_output_tokens=256))
        assert result.cached_tokens + result.new_tokens == result.prompt_tokens
        # The first turn renders everything; later ones reuse the history.
        assert (result.cached_tokens > 0) == (turn > 0) and not result.invalidated
        before = conversation.prompt()
        sampled = format.completion_tokens(calls=[("exec_command", '{"cmd": "ls"}')])
        parser = conversation.parser()
        events = parser.feed(sampled)
        assert parser.stopped and parser.output_tokens == len(sampled)
        done = [e for e in events + parser.finish()[0] if e[0] == "call_done"]
        call_id = str(done[0][3])
        conversation.commit_output(parser)
        assert conversation.open_call_ids == [call_id]
        after = conversation.prompt()
        # History keeps the sampled ids (the stop token normalised by the format).
        assert after.common_prefix_len(before) == len(before)
        assert after.tokens_from(len(before))[: len(sampled) - 1] == sampled[:-1]
        checkpoints.append(conversation.checkpoint())
        prompts.append(after.tokens())

    fork = checkpoints[1].fork()
    answer = [{"type": "function_call_output", "call_id": "x", "output": "nope"}]
    with pytest.raises(CoreError) as error:
        fork.extend(request(answer))
    assert error.value.code == "unknown_call_id" and error.value.param == "input"
    assert fork.prompt().tokens() == prompts[1]
    # Each checkpoint holds its own turn's bytes only: together about the whole chain.
    own = [c.memory_bytes for c in checkpoints]
    assert max(own[1:]) < conversation.memory_bytes / 2
    assert sum(own) <= 1.5 * conversation.memory_bytes
    assert conversation.prompt().tokens()[: len(prompts[1])] == prompts[1]
    for checkpoint, prompt in zip(checkpoints, prompts, strict=True):
        assert checkpoint.token_count == len(prompt)
        assert checkpoint.fork().prompt().tokens() == prompt


def test_a_changed_prefix_rerenders_and_is_counted() -> None:
    format = FORMATS["harmony"]
    conversation = fresh(format)
    conversation.extend(request("hello", instructions="Be brief."))
    turn = conversation.extend(request("again", instructions="Be verbose."))
    assert turn.invalidated and turn.cached_tokens == 0
    assert conversation.stats["invalidations"] == 1
    reference = fresh(format)
    items = [
        {"type": "message", "role": "user", "content": "hello"},
        {"type": "message", "role": "user", "content": "again"},
    ]
    reference.extend(request(items, instructions="Be verbose."))
    assert conversation.prompt().tokens() == reference.prompt().tokens()


def test_failed_requests_leave_the_conversation_unchanged() -> None:
    format = FORMATS["harmony"]
    conversation = Conversation(format, context_window=400, policy=Policy(["forbidden"]))
    conversation.extend(request("hello"))
    before = conversation.prompt().tokens()
    cases = [
        (request("a FORBIDDEN word"), "content_policy_violation", "input"),
        (request("long " * 500), "context_length_exceeded", "input"),
        (request("fine", max_output_tokens=390), "context_length_exceeded", "input"),
        (request([{"type": "nope"}]), None, None),
    ]
    for bad, code, param in cases:
        with pytest.raises(CoreError) as error:
            conversation.extend(bad)
        if code is not None:
            assert (error.value.code, error.value.param) == (code, param)
        assert conversation.prompt().tokens() == before
    # A policy verdict is about new text only: unchanged instructions are not re-checked.
    assert conversation.extend(request("still fine")).cached_tokens > 0


def test_memory_is_under_three_bytes_per_token_plus_the_items_deflated() -> None:
    format = FORMATS["harmony"]
    conversation = fresh(format)
    items = [
        {"type": "message", "role": "user", "content": f"line {i}: " + "some text " * 150}
        for i in range(300)
    ]
    conversation.append_items(orjson.dumps(items).decode())
    text = sum(len(item["content"].encode()) for item in items)
    # Long texts are kept deflated once rendered (rust/src/prompt_chain/segments/kept.rs),
    # and full leaves of ids packed, about 2 bytes an id for ids below 65,536
    # (rust/src/chunks.rs).
    assert 2 * conversation.token_count + text / 8 <= conversation.memory_bytes
    assert conversation.memory_bytes <= 3 * conversation.token_count + text / 8


def test_parser_events_are_tuples() -> None:
    format = FORMATS["harmony"]
    conversation = fresh(format)
    conversation.extend(request("hi"))
    parser = conversation.parser()
    events = parser.feed(format.completion_tokens(text="Hello there."))
    assert events[0] == ("message_start", 0)
    assert ("message_done", 0, "Hello there.") in events
    assert parser.finish()[1] == "stopped"
    with pytest.raises(CoreError):
        fresh(format).parser()
