"""One agent replaying a rollout against a live server, in one of five client modes.

- `http_full`: stateless HTTP; every request carries the whole history (what most agent
  frameworks send to a Chat-Completions-style endpoint, and what Codex falls back to).
- `chat`: the same on `POST /v1/chat/completions`: the whole history as chat messages
  every turn (earlier reasoning as `reasoning_content`, calls as `tool_calls`, outputs
  as `tool` messages), streamed with `stream_options.include_usage`.
- `http_previous`: HTTP with `previous_response_id` and `store: true`.
- `websocket`: one socket for the whole task, each turn a `response.create` carrying only
  the new tool output and `previous_response_id` (`store: false`, as Codex does).
- `long_running`: one socket (`OpenAI-Beta: responses_multi_agent=v1`) and one response
  for the whole task: each tool output goes into it with `response.inject`, and sampling
  resumes in it; a turn runs from the request (or injection) to the next call item.

Each turn records the time to the first streamed token, the time to the terminal event,
the server's CPU time and the usage the server reported. The tool's run time is simulated
by the agent waiting `tool_time` seconds before it answers (a tool runs on the client;
the server is idle meanwhile), so end-to-end time is comparable to the ideal of
inference plus tool time. The client is kept thin (orjson, one raw socket or one
keep-alive HTTP connection) and its CPU time is recorded separately.

This module owns the client side of one agent; it knows nothing about the server's
internals, and talks only the wire protocol of docs/protocol.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect

from hotloop.lab import MODES
from hotloop.lab.rollout import Rollout

TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})
WAITING = "waiting"
"""A long-running response's turn that ended calling a tool: it waits, open."""
MULTI_AGENT = {"OpenAI-Beta": "responses_multi_agent=v1"}
WHOLE_HISTORY = frozenset({"http_full", "chat"})
"""The modes whose every request carries the whole history."""


class BenchError(Exception):
    """The server answered a turn with something other than a completed response."""


@dataclass
class Reply:
    """What the client saw of one response."""

    first_token_at: float | None = None
    last_token_at: float | None = None
    done_at: float = 0.0
    events: int = 0
    response: dict[str, Any] = field(default_factory=dict)
    terminal: str = ""


class Transport(Protocol):
    async def create(self, body: dict[str, Any]) -> Reply: ...

    async def close(self) -> None: ...


def _observe(reply: Reply, event: dict[str, Any]) -> bool:
    """Fold one server event into `reply`; True once the response is over."""
    reply.events += 1
    kind = event.get("type", "")
    if kind.endswith(".delta"):
        reply.last_token_at = time.perf_counter()
        if reply.first_token_at is None:
            reply.first_token_at = reply.last_token_at
    if kind in TERMINAL:
        reply.done_at = time.perf_counter()
        reply.terminal = kind
        reply.response = event.get("response") or {"error": event.get("error")}
        return True
    return False


SocketT = TypeVar("SocketT", bound="WebSocketTransport")


class WebSocketTransport:
    """One socket for the whole task (raw `websockets`, no compression)."""

    def __init__(self, socket: ClientConnection) -> None:
        self._socket = socket

    @classmethod
    async def open(
        cls: type[SocketT], url: str, api_key: str, headers: dict[str, str] | None = None
    ) -> SocketT:
        socket = await connect(
            url,
            max_size=None,
            compression=None,
            additional_headers={"Authorization": f"Bearer {api_key}", **(headers or {})},
        )
        return cls(socket)

    async def create(self, body: dict[str, Any]) -> Reply:
        return await self._send({"type": "response.create", **body})

    async def _send(self, event: dict[str, Any]) -> Reply:
        reply = Reply()
        await self._socket.send(orjson.dumps(event).decode())
        async for frame in self._socket:
            if self._observe(reply, orjson.loads(frame)):
                return reply
        raise BenchError("the server closed the socket in the middle of a response")

    def _observe(self, reply: Reply, event: dict[str, Any]) -> bool:
        return _observe(reply, event)

    async def close(self) -> None:
        await self._socket.close()


class LongRunningTransport(WebSocketTransport):
    """One response for the whole task: a call item ends a turn (the response waits
    for its output), `inject` sends the output into the same response."""

    def __init__(self, socket: ClientConnection) -> None:
        super().__init__(socket)
        self._response: dict[str, Any] = {}

    async def inject(self, response_id: str, items: list[dict[str, Any]]) -> Reply:
        return await self._send(
            {"type": "response.inject", "response_id": response_id, "input": items}
        )

    def _observe(self, reply: Reply, event: dict[str, Any]) -> bool:
        kind = event.get("type")
        if kind == "response.created":
            self._response = event["response"]
        elif kind == "response.inject.failed":
            raise BenchError(f"the injection was refused: {event['error']}")
        elif kind == "response.output_item.done" and event["item"]["type"] == "function_call":
            # The response now waits for this call's output: the turn is over.
            reply.events += 1
            reply.done_at = time.perf_counter()
            reply.terminal = WAITING
            reply.response = {**self._response, "output": [event["item"]], "usage": None}
            return True
        return _observe(reply, event)


class HttpTransport:
    """`POST /v1/responses` with `stream: true` over one keep-alive connection."""

    path = "/responses"

    def __init__(self, base_url: str, api_key: str) -> None:
        self._client = httpx.AsyncClient(
            base_url=base_url,
            timeout=httpx.Timeout(600.0),
            headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
            limits=httpx.Limits(max_connections=1),
        )

    def _request(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "stream": True}

    def _reader(self) -> Callable[[Reply, str], bool]:
        """Folds one SSE `data:` line into a reply; True once the response is over."""
        return lambda reply, data: _observe(reply, orjson.loads(data))

    async def create(self, body: dict[str, Any]) -> Reply:
        reply = Reply()
        observe = self._reader()
        payload = orjson.dumps(self._request(body))
        async with self._client.stream("POST", self.path, content=payload) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")
                raise BenchError(f"HTTP {response.status_code}: {detail[:500]}")
            async for line in response.aiter_lines():
                if line.startswith("data: ") and observe(reply, line[6:]):
                    return reply
        raise BenchError("the server ended the SSE stream without a terminal event")

    async def close(self) -> None:
        await self._client.aclose()


class ChatTransport(HttpTransport):
    """`POST /v1/chat/completions`, streamed with usage, over one keep-alive connection:
    a Responses body (instructions, tools, the whole history as items) is sent as chat
    messages, and the streamed chunks read back as the Responses output they stand for
    (reasoning and function-call items, usage in Responses' names), so the agent keeps
    one history whatever the endpoint."""

    path = "/chat/completions"

    def _request(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = [{"role": "system", "content": body["instructions"]}]
        messages += chat_messages(body["input"])
        tools = [
            {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
            for t in body["tools"]
        ]
        return {
            "model": body["model"],
            "messages": messages,
            "tools": tools,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def _reader(self) -> Callable[[Reply, str], bool]:
        return ChatReading().observe


def chat_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses items as the chat messages a Chat Completions client sends: a reasoning
    item goes into the next assistant message (`reasoning_content`), consecutive calls
    into one message's `tool_calls`, each output into a `tool` message."""
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None
    for item in items:
        kind = item.get("type", "message")
        if kind == "reasoning":
            reasoning = "".join(part["text"] for part in item.get("content") or ())
            continue
        if kind == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
            continue
        if kind == "function_call":
            call = {"name": item["name"], "arguments": item["arguments"]}
            calls = [{"id": item["call_id"], "type": "function", "function": call}]
            last = messages[-1] if messages else {}
            if reasoning is None and last.get("tool_calls"):
                last["tool_calls"] += calls
                continue
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": calls}
        else:
            content = item["content"]
            if not isinstance(content, str):
                content = "".join(part["text"] for part in content)
            message = {"role": item["role"], "content": content}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
            reasoning = None
        messages.append(message)
    return messages


class ChatReading:
    """One streamed chat completion read as a Response: its deltas (content, reasoning,
    tool-call arguments) time the tokens, `[DONE]` ends it, and what was said becomes
    the Response's output items and usage (`Reply.response`)."""

    def __init__(self) -> None:
        self.id = ""
        self.reasoning: list[str] = []
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        self.usage: dict[str, Any] = {}

    def observe(self, reply: Reply, data: str) -> bool:
        reply.events += 1
        if data == "[DONE]":
            reply.done_at = time.perf_counter()
            reply.terminal = "response.completed" if self.finish else "error"
            reply.response = self.response()
            return True
        chunk = orjson.loads(data)
        if "error" in chunk:
            raise BenchError(f"the chat stream failed: {chunk['error']}")
        self.id = chunk.get("id", self.id)
        self.usage = chunk.get("usage") or self.usage
        for choice in chunk.get("choices") or ():
            self.finish = choice.get("finish_reason") or self.finish
            if self._said(choice.get("delta") or {}):
                reply.last_token_at = time.perf_counter()
                if reply.first_token_at is None:
                    reply.first_token_at = reply.last_token_at
        return False

    def _said(self, delta: dict[str, Any]) -> bool:
        """Fold a delta in; True if it carried a sampled token."""
        said = False
        # hotloop sends both names with the same text; vLLM and smg one of them.
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            self.reasoning.append(reasoning)
            said = True
        if delta.get("content"):
            self.text.append(delta["content"])
            said = True
        for part in delta.get("tool_calls") or ():
            call = self.calls.setdefault(part["index"], {"arguments": []})
            call.setdefault("id", part.get("id"))
            function = part.get("function") or {}
            call.setdefault("name", function.get("name"))
            if function.get("arguments"):
                call["arguments"].append(function["arguments"])
                said = True
        return said

    def response(self) -> dict[str, Any]:
        """The Responses object the chat completion stands for."""
        output: list[dict[str, Any]] = []
        if self.reasoning:
            text = "".join(self.reasoning)
            output.append(
                {"type": "reasoning", "content": [{"type": "reasoning_text", "text": text}]}
            )
        if self.text:
            content = [{"type": "output_text", "text": "".join(self.text)}]
            output.append({"type": "message", "role": "assistant", "content": content})
        for call in self.calls.values():
            output.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": call["name"],
                    "arguments": "".join(call["arguments"]),
                }
            )
        usage = {
            "input_tokens": self.usage.get("prompt_tokens", 0),
            "input_tokens_details": self.usage.get("prompt_tokens_details") or {},
            "output_tokens": self.usage.get("completion_tokens", 0),
        }
        return {"id": self.id, "output": output, "usage": usage}


@dataclass
class TurnRecord:
    """One turn as measured by the client. Times in seconds, CPU in nanoseconds."""

    index: int
    ttft: float
    latency: float
    server_cpu_ns: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    request_bytes: int
    events: int
    replayed: bool
    """The server's call was the rollout's call for this step (the sim replayed it)."""
    tail: float = 0.0
    """From the last token to the terminal event (the commit before it, if any); runs
    recorded before it was measured read 0."""


@dataclass
class AgentRun:
    """One rollout replayed in one mode."""

    mode: str
    turns: list[TurnRecord]
    wall: float
    tool_time: float
    client_cpu_ns: int
    server_cpu_ns: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _usage(response: dict[str, Any]) -> tuple[int, int, int]:
    usage = response.get("usage") or {}
    details = usage.get("input_tokens_details") or {}
    return (
        int(usage.get("input_tokens", 0)),
        int(details.get("cached_tokens", 0)),
        int(usage.get("output_tokens", 0)),
    )


class Agent:
    """Replays `rollout` in `mode`; the first turn sends the task, each later turn the
    tool output answering the call the server made."""

    def __init__(
        self,
        rollout: Rollout,
        mode: str,
        transport: Transport,
        *,
        model: str,
        tool_time: float = 0.0,
        server_cpu_ns: Callable[[], int] = lambda: 0,
        on_turn: Callable[[TurnRecord], None] = lambda turn: None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        self.rollout = rollout
        self.mode = mode
        self.transport = transport
        self.model = model
        self.tool_time = tool_time
        self.server_cpu_ns = server_cpu_ns
        self.on_turn = on_turn
        self.history: list[dict[str, Any]] = []

    def _body(self, new_items: list[dict[str, Any]], previous: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "instructions": self.rollout.instructions,
            "tools": self.rollout.tools,
            "store": self.mode == "http_previous",
        }
        if self.mode in WHOLE_HISTORY:
            self.history.extend(new_items)
            body["input"] = self.history
        else:
            body["input"] = new_items
            if previous is not None:
                body["previous_response_id"] = previous
        return body

    async def run(self) -> AgentRun:
        rollout = self.rollout
        turns: list[TurnRecord] = []
        new_items = rollout.opening()
        previous: str | None = None
        client_start = time.process_time_ns()
        wall_start = time.perf_counter()
        cpu_mark = self.server_cpu_ns()
        for index in range(len(rollout.steps) + 1):
            body = self._body(new_items, previous)
            request_bytes = len(orjson.dumps(body))
            sent = time.perf_counter()
            if isinstance(self.transport, LongRunningTransport) and previous is not None:
                request_bytes = len(orjson.dumps(new_items))
                reply = await self.transport.inject(previous, new_items)
            else:
                reply = await self.transport.create(body)
            if reply.terminal not in ("response.completed", WAITING):
                raise BenchError(f"turn {index}: {reply.terminal}: {reply.response}")
            response = reply.response
            output = response.get("output") or []
            calls = [item for item in output if item.get("type") == "function_call"]
            if reply.terminal != WAITING and self.mode == "long_running":
                calls = []  # the response ended: its calls were all answered inside it
            replayed = False
            if index < len(rollout.steps) and calls:
                step = rollout.steps[index]
                replayed = (calls[0]["name"], calls[0]["arguments"]) == (
                    step.call.name,
                    step.call.arguments,
                )
            input_tokens, cached_tokens, output_tokens = _usage(response)
            record = TurnRecord(
                index=index,
                ttft=(reply.first_token_at or reply.done_at) - sent,
                latency=reply.done_at - sent,
                tail=reply.done_at - (reply.last_token_at or reply.done_at),
                server_cpu_ns=0,
                input_tokens=input_tokens,
                cached_tokens=cached_tokens,
                output_tokens=output_tokens,
                request_bytes=request_bytes,
                events=reply.events,
                replayed=replayed,
            )
            turns.append(record)
            if index == len(rollout.steps) or not calls:
                break
            if self.mode in WHOLE_HISTORY:
                # A stateless client replays the model's output items verbatim.
                self.history.extend(output)
            previous = response["id"]
            new_items = [rollout.tool_result(index, call_id=calls[0]["call_id"])]
            if self.tool_time:
                # The tool runs on the client: simulated run time, not synchronisation.
                await asyncio.sleep(self.tool_time)
            # Server CPU of a turn runs from its request to the next one, so work the
            # server defers past the terminal event (usage, persistence) is counted.
            now = self.server_cpu_ns()
            record.server_cpu_ns, cpu_mark = now - cpu_mark, now
            self.on_turn(record)
        now = self.server_cpu_ns()
        turns[-1].server_cpu_ns = now - cpu_mark
        self.on_turn(turns[-1])
        return AgentRun(
            mode=self.mode,
            turns=turns,
            wall=time.perf_counter() - wall_start,
            tool_time=self.tool_time,
            client_cpu_ns=time.process_time_ns() - client_start,
            server_cpu_ns=sum(t.server_cpu_ns for t in turns),
        )


async def open_transport(mode: str, base_url: str, ws_url: str, api_key: str) -> Transport:
    if mode == "websocket":
        return await WebSocketTransport.open(ws_url, api_key)
    if mode == "long_running":
        return await LongRunningTransport.open(ws_url, api_key, MULTI_AGENT)
    if mode == "chat":
        return ChatTransport(base_url, api_key)
    return HttpTransport(base_url, api_key)
