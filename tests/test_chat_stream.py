"""`ChatStream`: a response's events as `chat.completion.chunk` SSE frames. A delta's
chunk is cut from its event's bytes, not parsed: on the events the emitter writes
(`ResponseEvents`), every chunk is the one a translation of the parsed event builds, byte
for byte, and a chunk the openai SDK's `ChatCompletionChunk` takes strictly."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hotloop.events import ResponseEvents, Usage
from hotloop.transport.chat import DONE, ChatStream, completion_id, finish_reason, usage
from openai.types.chat import ChatCompletionChunk

FIELDS = '{"model":"sim","tools":[],"instructions":"Say \\"hi\\" \\u2028 twice."}'
# Deltas that JSON escapes, or that look like the frame's own keys.
AWKWARD = ('say "hi"\n', ',"sequence_number":7}', "\u00e9t\u00e9 \u2028 \U0001f600", "\\", "")


def recorded(incomplete: bool) -> list[list[bytes]]:
    """The batches of frames of one response: reasoning, a message and two function
    calls (their arguments in several deltas), as the protocol feeds its parser's events."""
    events = ResponseEvents(FIELDS)
    batches: list[list[bytes]] = [[events.lifecycle("response.created", "in_progress")]]
    batches[0].append(events.lifecycle("response.in_progress", "in_progress"))
    parsed: list[tuple[Any, ...]] = [("reasoning_start", 0)]
    parsed += [("reasoning", 0, delta) for delta in AWKWARD]
    parsed += [("reasoning_done", 0, "".join(AWKWARD)), ("message_start", 1)]
    parsed += [("text", 1, delta) for delta in AWKWARD]
    parsed += [("message_done", 1, "".join(AWKWARD))]
    for key, name in ((2, "ls"), (3, "read")):
        parsed += [("call_start", key, name, f"call_{name}")]
        parsed += [("arguments", key, part) for part in ('{"path":', '"a\\"b"', "}")]
        parsed += [("call_done", key, name, f"call_{name}", '{"path":"a\\"b"}')]
    for start in range(0, len(parsed), 5):
        batch: list[bytes] = []
        events.feed(parsed[start : start + 5], batch.append)
        batches.append(batch)
    used = Usage(input_tokens=90, cached_tokens=40, output_tokens=30, reasoning_tokens=10)
    if incomplete:
        end = events.lifecycle(
            "response.incomplete", "incomplete", usage=used, incomplete_reason="max_output_tokens"
        )
    else:
        end = events.lifecycle("response.completed", "completed", usage=used)
    batches.append([end])
    return batches


def translated(frames: list[bytes], include_usage: bool) -> list[bytes]:
    """Each event parsed and translated into whole chunk objects, as the chat stream
    first did: the reference its bytes must equal."""
    chunks: list[bytes] = []
    calls: dict[int, int] = {}
    base: dict[str, Any] = {}

    def chunk(delta: dict[str, Any], reason: str | None = None) -> None:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        chunks.append(b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n")

    for frame in frames:
        event = orjson.loads(frame)
        kind = event["type"]
        if kind == "response.created":
            response = event["response"]
            base.update(
                id=completion_id(response["id"]),
                object="chat.completion.chunk",
                created=response["created_at"],
                model=response["model"],
            )
            chunk({"role": "assistant", "content": ""})
        elif kind == "response.output_text.delta":
            chunk({"content": event["delta"]})
        elif kind == "response.reasoning_text.delta":
            chunk({"reasoning": event["delta"], "reasoning_content": event["delta"]})
        elif kind == "response.output_item.added" and event["item"]["type"] == "function_call":
            item = event["item"]
            index = calls[event["output_index"]] = len(calls)
            function = {"name": item["name"], "arguments": ""}
            call = {"index": index, "id": item["call_id"], "type": "function"}
            chunk({"tool_calls": [{**call, "function": function}]})
        elif kind == "response.function_call_arguments.delta":
            arguments = {"arguments": event["delta"]}
            chunk({"tool_calls": [{"index": calls[event["output_index"]], "function": arguments}]})
        elif kind in ("response.completed", "response.incomplete"):
            chunk({}, finish_reason(event["response"]))
            if include_usage:
                used = {**base, "choices": [], "usage": usage(event["response"])}
                chunks.append(b"data: " + orjson.dumps(used) + b"\n\n")
            chunks.append(DONE)
    return chunks


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("incomplete", [False, True])
def test_chunks_are_the_translation_of_the_parsed_events(
    include_usage: bool, incomplete: bool
) -> None:
    batches = recorded(incomplete)
    stream = ChatStream(include_usage)
    written = b"".join(stream.sse(batch) for batch in batches)
    expected = translated([frame for batch in batches for frame in batch], include_usage)
    assert written == b"".join(expected)
    assert written.endswith(DONE)
    payloads = [c.removeprefix(b"data: ") for c in expected[:-1]]
    chunks = [ChatCompletionChunk.model_validate_json(p, strict=True) for p in payloads]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "".join(AWKWARD)
    arguments = [
        call.function.arguments
        for c in chunks
        if c.choices
        for call in c.choices[0].delta.tool_calls or ()
        if call.function is not None and call.index == 1
    ]
    assert "".join(a or "" for a in arguments) == '{"path":"a\\"b"}'
    # The model called tools: that is the reason, whether or not it ran out of tokens.
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert (chunks[-1].usage is not None) == include_usage
