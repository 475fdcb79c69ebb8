"""Chat Completions' wire form of a response (`POST /v1/chat/completions`).

A chat request is parsed by the core into the `CreateRequest` it is served as
(`parse_chat_request`: messages to items in one place) and runs through the same HTTP
exchange as `POST /v1/responses` (`http.py`): the same `Connection`, key, bounds, cache
(a request that resends its whole history continues from the longest state its key's
cache holds of it) and engines. This module only writes what the client reads: the
response's events as `chat.completion.chunk` SSE frames (`ChatStream`, the one
emitter), the finished Response as a `chat.completion` (`completion`). Reasoning goes
out as `reasoning` and `reasoning_content` (vLLM's field and its older name, which
SGLang and DeepSeek use); usage as `prompt_tokens` / `completion_tokens` with
`prompt_tokens_details` the Response's `input_tokens_details` (`cached_tokens`: prompt
tokens served from the rendered-token cache).

It decides nothing about the protocol and never sees the engine.
"""

from __future__ import annotations

from typing import Any

import orjson

from hotloop.events import delta_head, delta_parts, error_object
from hotloop.transport.exchange import event_type

DONE = b"data: [DONE]\n\n"

# Why a Response stopped short, as a chat `finish_reason`.
FINISH_REASONS = {"max_output_tokens": "length", "content_filter": "content_filter"}


def completion_id(response_id: str) -> str:
    """The chat completion's id: the response's, under the chat prefix."""
    return "chatcmpl-" + response_id.removeprefix("resp_")


def usage(response: dict[str, Any]) -> dict[str, Any] | None:
    """A Response's usage in chat's names."""
    used = response.get("usage")
    if used is None:
        return None
    return {
        "prompt_tokens": used["input_tokens"],
        "completion_tokens": used["output_tokens"],
        "total_tokens": used["total_tokens"],
        "prompt_tokens_details": used["input_tokens_details"],
        "completion_tokens_details": used["output_tokens_details"],
    }


def finish_reason(response: dict[str, Any]) -> str:
    """`tool_calls` when the model called tools, `length` when it ran out of tokens."""
    if any(item.get("type") == "function_call" for item in response["output"]):
        return "tool_calls"
    incomplete = response.get("incomplete_details") or {}
    return FINISH_REASONS.get(incomplete.get("reason", ""), "stop")


def completion(response_json: bytes) -> bytes:
    """A finished Response object as a `chat.completion`."""
    response = orjson.loads(response_json)
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in response["output"]:
        kind = item.get("type")
        if kind == "message":
            texts.extend(part["text"] for part in item["content"] if "text" in part)
        elif kind == "reasoning":
            reasoning.extend(part["text"] for part in item.get("content") or ())
        elif kind == "function_call":
            function = {"name": item["name"], "arguments": item["arguments"]}
            calls.append({"id": item["call_id"], "type": "function", "function": function})
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts or not calls else None,
        "refusal": None,
    }
    if reasoning:
        message["reasoning"] = message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    body = {
        "id": completion_id(response["id"]),
        "object": "chat.completion",
        "created": response["created_at"],
        "model": response["model"],
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason(response),
            }
        ],
        "usage": usage(response),
        "service_tier": response.get("service_tier"),
        "system_fingerprint": None,
    }
    return orjson.dumps(body)


class ChatStream:
    """One streamed response's events as chat chunks (`sse`, batch by batch): a first
    chunk with the assistant's role, a chunk per delta of text, reasoning or tool-call
    arguments, a last chunk with the `finish_reason`, then (`include_usage`) a chunk
    with the usage and no choices, and `[DONE]`. A response that fails mid-stream ends
    with `data: {"error": ...}` and `[DONE]`, as vLLM ends one.

    A delta's chunk is built from the bytes of its event (`delta_parts`: the delta's
    JSON string as the emitter serialised it), never parsed; only the few events that
    start, end or fail the response or start an item are; the others make no chunk and
    are skipped by their type."""

    def __init__(self, include_usage: bool) -> None:
        self.include_usage = include_usage
        self._head = b""
        """`data: {"id":...,"choices":[{"index":0,"delta":` of every chunk."""
        self._calls: dict[bytes, bytes] = {}
        """By the delta head of each function call (`delta_head`): its chunks' delta up
        to the arguments, `{"tool_calls":[{"index":N,"function":{"arguments":`."""

    def sse(self, frames: list[bytes]) -> bytes:
        """The SSE bytes for a batch of the response's events."""
        out: list[bytes] = []
        for frame in frames:
            kind = event_type(frame)
            if kind == b"response.output_text.delta":
                out.append(self._delta(b'{"content":%b}' % delta_parts(frame)[1]))
            elif kind == b"response.reasoning_text.delta":
                text = delta_parts(frame)[1]
                out.append(self._delta(b'{"reasoning":%b,"reasoning_content":%b}' % (text, text)))
            elif kind == b"response.function_call_arguments.delta":
                head, text = delta_parts(frame)
                out.append(self._delta(b"%b%b}}]}" % (self._calls[head], text)))
            elif kind == b"response.output_item.added":
                out.extend(self._started(orjson.loads(frame)))
            elif kind == b"response.created":
                out.append(self._created(orjson.loads(frame)["response"]))
            elif kind in (b"response.completed", b"response.incomplete"):
                out.extend(self._finished(orjson.loads(frame)["response"]))
            elif kind == b"response.failed":
                error = orjson.loads(frame)["response"]["error"] or {}
                failure = error_object(
                    error.get("code", "server_error"),
                    error.get("message", "The response failed."),
                    status=500,
                )
                out.append(b"data: " + orjson.dumps({"error": failure}) + b"\n\n" + DONE)
        return b"".join(out)

    def _created(self, response: dict[str, Any]) -> bytes:
        fields = orjson.dumps(
            {
                "id": completion_id(response["id"]),
                "object": "chat.completion.chunk",
                "created": response["created_at"],
                "model": response["model"],
            }
        )
        self._head = b"data: " + fields[:-1] + b',"choices":[{"index":0,"delta":'
        return self._delta(b'{"role":"assistant","content":""}')

    def _started(self, event: dict[str, Any]) -> list[bytes]:
        item = event["item"]
        if item["type"] != "function_call":
            return []
        index = len(self._calls)
        kind = "response.function_call_arguments.delta"
        head = delta_head(kind, item["id"], event["output_index"], None)
        self._calls[head] = b'{"tool_calls":[{"index":%d,"function":{"arguments":' % index
        function = {"name": item["name"], "arguments": ""}
        call = {"index": index, "id": item["call_id"], "type": "function", "function": function}
        return [self._delta(orjson.dumps({"tool_calls": [call]}))]

    def _delta(self, delta: bytes, finish: bytes = b"null") -> bytes:
        """A chunk of one choice whose `delta` is the JSON object `delta`."""
        return b"".join(
            (self._head, delta, b',"logprobs":null,"finish_reason":', finish, b"}]}\n\n")
        )

    def _finished(self, response: dict[str, Any]) -> list[bytes]:
        reason = orjson.dumps(finish_reason(response))
        chunks = [self._delta(b"{}", reason)]
        if self.include_usage:
            head = self._head[: self._head.index(b',"choices":')]
            used = orjson.dumps(usage(response))
            chunks.append(head + b',"choices":[],"usage":' + used + b"}\n\n")
        chunks.append(DONE)
        return chunks


__all__ = ["ChatStream", "completion", "completion_id"]
