"""Server events and Response objects as JSON bytes, shared by WebSocket frames and SSE.

This module owns the wire shape of everything a response emits: ids (`resp_`, `msg_`,
`fc_`, `rs_`), the per-response `sequence_number`, the `stream_id` echo, the Response
object (the request's echoed fields are spliced in as the core serialised them, never
rebuilt as dicts), output items, usage and error envelopes. It does not decide *when*
an event is sent; the protocol state machine does.

Per streamed token the cost is one `orjson.dumps` of the delta string and a bytes join:
the fixed parts of each delta event are built once per output item.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

MCP_CALL = "mcp_"
"""The id prefix of an `mcp_call` item; the rest is the model's call id."""
DELTA = b',"delta":'
"""What ends a delta event's head (`delta_head`): its `delta` string follows."""
MCP_APPROVAL = "mcpr_"
"""The id prefix of an `mcp_approval_request` item; the rest is the model's call id."""


def new_id(prefix: str) -> str:
    """A fresh object id such as `resp_8f...`: 24 random bytes, hex."""
    return prefix + os.urandom(24).hex()


@dataclass(frozen=True)
class Usage:
    """Token counts of one response. `cached_tokens` are prompt tokens served from the
    rendered-token cache; `cache_write_tokens` are the prompt tokens rendered and added
    to it by this turn; `engine_cached_tokens` the prompt tokens the engine said it
    served from its own KV cache (None: it did not say)."""

    input_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    engine_cached_tokens: int | None = None

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            engine_cached_tokens=_add_known(self.engine_cached_tokens, other.engine_cached_tokens),
        )

    def as_dict(self) -> dict[str, Any]:
        details: dict[str, int] = {
            "cached_tokens": self.cached_tokens,
            "cache_write_tokens": self.cache_write_tokens,
        }
        if self.engine_cached_tokens is not None:
            # Only where the engine said it: absent is "unknown", never 0.
            details["engine_cached_tokens"] = self.engine_cached_tokens
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": details,
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


def _add_known(a: int | None, b: int | None) -> int | None:
    """The sum of the figures that are known; None when neither is."""
    if a is None:
        return b
    return a if b is None else a + b


ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    426: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


def error_object(
    code: str,
    message: str,
    param: str | None = None,
    status: int = 400,
    retry_after: int | None = None,
) -> dict[str, Any]:
    """The `error` member shared by the HTTP body and the WebSocket envelope. A
    refusal the client should retry carries `headers: {"retry-after": seconds}`, as
    OpenAI's rate-limit errors do (a WebSocket frame has no HTTP headers of its own)."""
    error: dict[str, Any] = {
        "type": ERROR_TYPES.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        ),
        "code": code,
        "message": message,
        "param": param,
    }
    if retry_after is not None:
        error["headers"] = {"retry-after": str(retry_after)}
    return error


def error_event(
    code: str,
    message: str,
    param: str | None = None,
    *,
    status: int = 400,
    stream_id: str | None = None,
    retry_after: int | None = None,
) -> bytes:
    """The WebSocket error envelope (protocol.md section 7). `status` is always present:
    a client that gets an error without it cannot tell a bad request from an outage."""
    event: dict[str, Any] = {
        "type": "error",
        "status": status,
        "error": error_object(code, message, param, status, retry_after),
    }
    if stream_id is not None:
        event["stream_id"] = stream_id
    return orjson.dumps(event)


def error_body(
    code: str,
    message: str,
    param: str | None = None,
    status: int = 400,
    retry_after: int | None = None,
) -> bytes:
    """The HTTP error body: `{"error": {...}}`."""
    return orjson.dumps({"error": error_object(code, message, param, status, retry_after)})


class ResponseEvents:
    """The event stream of one response: it numbers events, echoes `stream_id`, and
    serialises the Response object around the request's echoed fields.

    `fields_json` is `CreateRequest.response_fields_json`: a JSON object that already
    holds model, tools, tool_choice, instructions, previous_response_id and the other
    echoed request fields, nulls filled in.
    """

    __slots__ = (
        "_fields",
        "_heads",
        "_ids",
        "_seq",
        "_tail",
        "background",
        "created_at",
        "index_offset",
        "mcp_approvals",
        "mcp_calls",
        "mcp_gated",
        "mcp_labels",
        "output",
        "request_id",
        "response_id",
        "stream_id",
        "streaming",
    )

    def __init__(
        self,
        fields_json: str,
        *,
        stream_id: str | None = None,
        response_id: str | None = None,
        created_at: int | None = None,
        request_id: str | None = None,
        background: bool = False,
    ) -> None:
        self.response_id = response_id or new_id("resp_")
        self.background = background
        # A WebSocket response's request id (HTTP has its `x-request-id` header): on
        # `response.created` and the terminal event, for clients to quote in reports.
        self.request_id = request_id
        self.stream_id = stream_id
        self.created_at = int(time.time()) if created_at is None else created_at
        self.output: list[dict[str, Any]] = []
        self.index_offset = 0
        """Output items emitted before the parser's (a compaction item)."""
        self.mcp_labels: dict[str, str] = {}
        """Function names the server runs as MCP tools, and their server's label: their
        calls are `mcp_call` items (`hotloop.protocol.mcp_tools`)."""
        self.mcp_calls: list[tuple[int, dict[str, Any], str]] = []
        """MCP calls whose arguments are done, not yet run: output index, item, call id."""
        self.mcp_gated: frozenset[str] = frozenset()
        """MCP tools whose calls wait for the client's approval."""
        self.mcp_approvals: list[dict[str, Any]] = []
        """`mcp_approval_request` items of the current model turn."""
        self.streaming = False
        """A delta event has been emitted (text, reasoning or arguments)."""
        self._seq = 0
        # Per output index: the item id and the pre-serialised head of its delta events.
        self._ids: dict[int, str] = {}
        self._heads: dict[int, bytes] = {}
        # An agent's tool list can make these megabytes: each copy of them counts.
        raw = fields_json.encode()
        inner = raw[raw.index(b"{") + 1 : raw.rindex(b"}")].strip()
        self._fields = b"".join((b",", inner, b"}")) if inner else b"}"
        self._tail = (
            b"}" if stream_id is None else b',"stream_id":' + orjson.dumps(stream_id) + b"}"
        )

    def next_turn(self) -> None:
        """The response samples another model turn (resumed after injected tool
        output): its parser numbers items from 0 again, their `output_index` goes on
        after every item started so far (all of them completed)."""
        self.index_offset += len(self._ids)
        self._ids.clear()
        self._heads.clear()

    @property
    def sequence_number(self) -> int:
        """The number the next event will carry."""
        return self._seq

    def _frame(self, *head: bytes | memoryview) -> bytes:
        # `head`, joined, is an open JSON object without its closing brace. One join: a
        # Response holding a large tool list is copied once per frame.
        seq = self._seq
        self._seq = seq + 1
        return b"".join((*head, b',"sequence_number":%d' % seq, self._tail))

    def event(self, kind: str, **fields: Any) -> bytes:
        """A response event of type `kind` with these fields."""
        body = orjson.dumps({"type": kind, **fields})
        return self._frame(body[:-1])

    def response_json(self, status: str, **response: Any) -> bytes:
        """The full Response object (`_response_parts` joined)."""
        return b"".join(self._response_parts(status, **response))

    def _response_parts(
        self,
        status: str,
        *,
        output: list[dict[str, Any]] | None = None,
        usage: Usage | None = None,
        error: dict[str, Any] | None = None,
        incomplete_reason: str | None = None,
    ) -> tuple[memoryview, bytes]:
        """The Response object in two pieces, to join without a copy between; `usage` is
        null until the response is terminal, `completed_at` until it completed."""
        head = orjson.dumps(
            {
                "id": self.response_id,
                "object": "response",
                "created_at": self.created_at,
                "completed_at": int(time.time()) if status == "completed" else None,
                "status": status,
                "output": self.output if output is None else output,
                "usage": None if usage is None else usage.as_dict(),
                "error": error,
                "incomplete_details": (
                    None if incomplete_reason is None else {"reason": incomplete_reason}
                ),
                "background": self.background,
            }
        )
        return memoryview(head)[:-1], self._fields

    def lifecycle(self, kind: str, status: str, **response: Any) -> bytes:
        """`response.created` / `in_progress` / `completed` / `failed` / `incomplete`."""
        return self._lifecycle(kind, *self._response_parts(status, **response))

    def wrap(self, kind: str, response: bytes) -> bytes:
        """A lifecycle event of type `kind` around a Response object from `response_json`."""
        return self._lifecycle(kind, response)

    def _lifecycle(self, kind: str, *response: bytes | memoryview) -> bytes:
        request_id = b""
        if self.request_id is not None and kind != "response.in_progress":
            request_id = b',"request_id":"' + self.request_id.encode() + b'"'
        return self._frame(b'{"type":"', kind.encode(), b'","response":', *response, request_id)

    # ---------------------------------------------------------------- output items

    def item_added(self, index: int, item: dict[str, Any]) -> bytes:
        return self.event("response.output_item.added", output_index=index, item=item)

    def open_items(self, completed: set[str]) -> list[tuple[int, str]]:
        """`(output_index, item_id)` of the model turn's items started but not in
        `completed`."""
        return [
            (key + self.index_offset, item_id)
            for key, item_id in self._ids.items()
            if item_id not in completed
        ]

    def item_done(self, index: int, item: dict[str, Any]) -> bytes:
        self.output.append(item)
        return self.event("response.output_item.done", output_index=index, item=item)

    # ---------------------------------------------------------------- parser events

    def feed(self, parsed: list[tuple[Any, ...]], emit: Callable[[bytes], object]) -> None:
        """Emit the frames for the output parser's events (see `OutputParser` in
        `_core.pyi`); the event's index is the item's `output_index`. The parser hands
        over an engine batch's deltas of one item as one event, so a batch of tokens
        costs one frame, not one per token."""
        for ev in parsed:
            kind = ev[0]
            if kind == "text" or kind == "reasoning" or kind == "arguments":
                # The per-token path: one dumps and one bytes format, nothing else.
                head = self._heads[ev[1]]
                if not head:
                    continue  # an approval request streams no arguments
                seq = self._seq
                self._seq = seq + 1
                self.streaming = True
                emit(b'%b%b,"sequence_number":%d%b' % (head, orjson.dumps(ev[2]), seq, self._tail))
            else:
                self._structural(ev, emit)

    def _structural(self, ev: tuple[Any, ...], emit: Callable[[bytes], object]) -> None:
        # The parser numbers its items from 0; a compacted turn's start at 1 (`index_offset`).
        kind, key = ev[0], ev[1]
        index = key + self.index_offset
        item: dict[str, Any]
        if kind == "message_start":
            item_id = new_id("msg_")
            self._ids[key] = item_id
            self._heads[key] = delta_head("response.output_text.delta", item_id, index, 0)
            item = {"id": item_id, "type": "message", "role": "assistant"}
            emit(self.item_added(index, {**item, "status": "in_progress", "content": []}))
            emit(
                self.event(
                    "response.content_part.added",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    part=_text_part(""),
                )
            )
        elif kind == "message_done":
            item_id, text = self._ids[key], ev[2]
            ids = {"item_id": item_id, "output_index": index, "content_index": 0}
            emit(self.event("response.output_text.done", **ids, text=text, logprobs=[]))
            emit(self.event("response.content_part.done", **ids, part=_text_part(text)))
            item = {"id": item_id, "type": "message", "role": "assistant", "status": "completed"}
            emit(self.item_done(index, {**item, "content": [_text_part(text)]}))
        elif kind == "reasoning_start":
            item_id = new_id("rs_")
            self._ids[key] = item_id
            self._heads[key] = delta_head("response.reasoning_text.delta", item_id, index, 0)
            item = {"id": item_id, "type": "reasoning", "summary": [], "content": []}
            emit(self.item_added(index, {**item, "status": "in_progress"}))
        elif kind == "reasoning_done":
            item_id, text = self._ids[key], ev[2]
            emit(
                self.event(
                    "response.reasoning_text.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    text=text,
                )
            )
            content = [{"type": "reasoning_text", "text": text}]
            item = {"id": item_id, "type": "reasoning", "summary": [], "content": content}
            emit(self.item_done(index, {**item, "status": "completed"}))
        elif kind == "call_start" and ev[2] in self.mcp_gated:
            item_id = MCP_APPROVAL + ev[3]
            self._ids[key] = item_id
            self._heads[key] = b""
            item = {**self._mcp_call(item_id, ev[2]), "type": "mcp_approval_request"}
            emit(self.item_added(index, {**item, "arguments": ""}))
        elif kind == "call_done" and ev[2] in self.mcp_gated:
            item = {**self._mcp_call(self._ids[key], ev[2]), "type": "mcp_approval_request"}
            item["arguments"] = ev[4]
            self.mcp_approvals.append(item)
            emit(self.item_done(index, item))
        elif kind == "call_start" and ev[2] in self.mcp_labels:
            # The call id in the item's id: a chain rebuilt from the store renders the
            # call as the model made it (`hotloop.protocol.mcp_tools.replayable`).
            item_id = MCP_CALL + ev[3]
            self._ids[key] = item_id
            head = delta_head("response.mcp_call_arguments.delta", item_id, index, None)
            self._heads[key] = head
            item = self._mcp_call(item_id, ev[2])
            emit(self.item_added(index, {**item, "arguments": "", "status": "in_progress"}))
            emit(self.event("response.mcp_call.in_progress", item_id=item_id, output_index=index))
        elif kind == "call_done" and ev[2] in self.mcp_labels:
            item_id, arguments = self._ids[key], ev[4]
            ids = {"item_id": item_id, "output_index": index}
            emit(self.event("response.mcp_call_arguments.done", **ids, arguments=arguments))
            # Done once it ran (`mcp_call_done`); in `output` now, at its index.
            item = {**self._mcp_call(item_id, ev[2]), "arguments": arguments, "status": "calling"}
            self.output.append(item)
            self.mcp_calls.append((index, item, ev[3]))
        elif kind == "call_start":
            item_id = new_id("fc_")
            self._ids[key] = item_id
            head = delta_head("response.function_call_arguments.delta", item_id, index, None)
            self._heads[key] = head
            item = {"id": item_id, "type": "function_call", "call_id": ev[3], **call_name(ev[2])}
            emit(self.item_added(index, {**item, "arguments": "", "status": "in_progress"}))
        elif kind == "call_done":
            item_id, name, call_id, arguments = self._ids[key], ev[2], ev[3], ev[4]
            emit(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item_id,
                    output_index=index,
                    name=call_name(name)["name"],
                    arguments=arguments,
                )
            )
            item = {"id": item_id, "type": "function_call", "call_id": call_id, **call_name(name)}
            emit(self.item_done(index, {**item, "arguments": arguments, "status": "completed"}))
        else:
            raise ValueError(f"unknown output parser event {kind!r}")

    # ---------------------------------------------------------------- MCP items

    def _mcp_call(self, item_id: str, name: str) -> dict[str, Any]:
        label = self.mcp_labels[name]
        return {"id": item_id, "type": "mcp_call", "server_label": label, "name": name}

    def mcp_call_done(
        self, index: int, item: dict[str, Any], output: str | None, error: dict[str, Any] | None
    ) -> list[bytes]:
        """An MCP call ran: its item (already in `output`) gets its output or error."""
        item.update(output=output, error=error, status="failed" if error else "completed")
        kind = "response.mcp_call.failed" if error else "response.mcp_call.completed"
        return [
            self.event(kind, item_id=item["id"], output_index=index),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def mcp_approved(self, item: dict[str, Any]) -> list[bytes]:
        """A call the client approved, run before the model's items (`index_offset`)."""
        index = self.index_offset
        self.index_offset += 1
        ids = {"item_id": item["id"], "output_index": index}
        added = {**item, "output": None, "error": None, "status": "in_progress"}
        frames = [
            self.item_added(index, added),
            self.event("response.mcp_call.in_progress", **ids),
            self.event("response.mcp_call_arguments.done", **ids, arguments=item["arguments"]),
        ]
        self.output.append(item)
        return frames + self.mcp_call_done(index, item, item.pop("output"), item.pop("error"))

    def mcp_list_tools(
        self, label: str, tools: list[dict[str, Any]], error: str | None
    ) -> list[bytes]:
        """An `mcp_list_tools` item before the model's items (`index_offset`)."""
        index = self.index_offset
        self.index_offset += 1
        item: dict[str, Any] = {
            "id": new_id("mcpl_"),
            "type": "mcp_list_tools",
            "server_label": label,
            "tools": [],
        }
        ids = {"item_id": item["id"], "output_index": index}
        frames = [
            self.item_added(index, item),
            self.event("response.mcp_list_tools.in_progress", **ids),
        ]
        item = {**item, "tools": tools, "error": error}
        kind = "response.mcp_list_tools.failed" if error else "response.mcp_list_tools.completed"
        frames.append(self.event(kind, **ids))
        frames.append(self.item_done(index, item))
        return frames


def delta_head(kind: str, item_id: str, index: int, content: int | None) -> bytes:
    """The fixed part of a delta event of one item, built once (`ResponseEvents.feed`): per
    token only the delta string is serialised."""
    fields: dict[str, Any] = {"type": kind, "item_id": item_id, "output_index": index}
    if content is not None:
        fields["content_index"] = content
    if kind == "response.output_text.delta":
        fields["logprobs"] = []
    return orjson.dumps(fields)[:-1] + DELTA


def delta_parts(frame: bytes) -> tuple[bytes, bytes]:
    """A delta event as `ResponseEvents.feed` wrote it, cut and not parsed: its head
    (`delta_head`, the same bytes for every delta of one item) and its `delta`, a JSON
    string (escaped: the `,"sequence_number":` after it is the first from the end)."""
    start = frame.index(DELTA) + len(DELTA)
    return frame[:start], frame[start : frame.rindex(b',"sequence_number":')]


def call_name(qualified: str) -> dict[str, str]:
    """A call's `name` (and `namespace`, for a function of a `namespace` tool) from the
    qualified name the core parses and renders (`NAMESPACE.NAME`; plain names have no dot)."""
    namespace, dot, name = qualified.partition(".")
    return {"name": name, "namespace": namespace} if dot else {"name": qualified}


def qualified_name(call: dict[str, Any]) -> str:
    """The name the core renders a `function_call` item under (`call_name` reversed)."""
    namespace = call.get("namespace")
    return f"{namespace}.{call['name']}" if namespace else str(call["name"])


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
