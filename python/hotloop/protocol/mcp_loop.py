"""Remote MCP tools inside one response (docs/tools.md, "MCP tools"): a model turn that
ends calling them (`CALLING_MCP`) hands the calls out (`McpCall`), and their results
are appended to the conversation's cached tokens as the family's tool output, the
engine going on from its prefix cache (`McpLoop`); the calls a request approves run
once the connection accepted it (`McpLoop.answer`), before its turn renders.

How a request's MCP servers are checked, listed and offered is `mcp_tools.py`'s; the calls
themselves are `hotloop.mcp_client`'s. A failed call is an item with an `error`, never a
failed response: the model sees the error and goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from hotloop.events import MCP_APPROVAL, MCP_CALL
from hotloop.mcp_client import Approval, McpError
from hotloop.protocol.actions import McpCall, McpRequest
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.injection import LongRunning
from hotloop.protocol.lanes import Pending
from hotloop.protocol.response import Response, ResponsePort
from hotloop.protocol.tool_outputs import Injection


@dataclass
class Calling:
    """A response's MCP calls while they run: the items and their call ids, and whether
    the response ends after them (a client function call in the same turn, a bound)."""

    response: Response
    calls: list[tuple[int, dict[str, Any], str]]
    ends: bool
    outputs: list[dict[str, Any]] = field(default_factory=list)


class McpLoop:
    """A connection's responses whose MCP calls run (they count in flight as
    generating: a cancel or the client's leaving stops them)."""

    def __init__(self, port: ResponsePort, long_running: LongRunning) -> None:
        self.port = port
        self.long_running = long_running
        """Resumes a response after its calls, as injected output does."""
        self.calling: dict[int, Calling] = {}

    def start(self, response: Response) -> None:
        """The response starts: its `mcp_list_tools` items, then its model turn may
        call the listed tools."""
        turn = response.mcp
        assert turn is not None, "a response with mcp tools"
        events = response.events
        for listing in turn.listings:
            if listing.error is None:
                key = (turn.principal, events.response_id, listing.server.label)
                turn.kept.hold(key, listing)
            if listing.reused:
                continue
            error = None if listing.error is None else listing.error.message
            for frame in events.mcp_list_tools(listing.server.label, listing.tools, error):
                self.port.emit(frame)
        events.mcp_labels = {name: server.label for name, server in turn.tools.items()}
        events.mcp_gated = turn.gated
        for item in turn.approved:
            for frame in events.mcp_approved(item):
                self.port.emit(frame)

    def call(self, response: Response) -> None:
        """The model turn ended calling MCP tools (`CALLING_MCP`): they run (the
        transport's `McpCall`), each refused with an error item past `max_tool_calls` or
        the response's time."""
        port, turn, events = self.port, response.mcp, response.events
        assert turn is not None, "a response with mcp tools"
        calls, events.mcp_calls = events.mcp_calls, []
        approvals, events.mcp_approvals = events.mcp_approvals, []
        for item in approvals:
            pending = Approval(
                events.response_id, item["server_label"], item["name"], item["arguments"]
            )
            turn.approvals.hold((turn.principal, item["id"]), pending)
        # Calls of responses stopped meanwhile (a cancel, the client's leaving) never end.
        self.calling = {k: c for k, c in self.calling.items() if k in port.generating}
        left = turn.deadline - time.monotonic()
        requests = []
        # Approval requests end the response: the client's approvals continue it.
        ends = bool(response.client_calls()) or bool(approvals)
        for _, item, _ in calls:
            refusal = None
            if turn.max_calls is not None and turn.calls >= turn.max_calls:
                refusal = McpError("http_error", 429, f"max_tool_calls ({turn.max_calls}) reached.")
            elif left <= 0:
                refusal = McpError("http_error", 504, "This response's time for MCP calls is over.")
            turn.calls += 1
            ends = ends or refusal is not None
            server = turn.tools[item["name"]]
            requests.append(McpRequest(server, item["name"], item["arguments"], refusal))
        key = port.new_key()
        response.key = key
        port.generating[key] = response
        self.calling[key] = Calling(response, calls, ends)
        port.emit(McpCall(key, tuple(requests), port.settings.principal, max(left, 0.0)))

    def answer(self, pending: Pending) -> McpCall | None:
        """A request that answers approval requests is accepted (rendered; with calls to
        run, on a copy of its conversation): the approval requests are taken, and the
        calls it approved are handed out to run before its turn renders again with their
        outputs (`approved`). None when nothing runs. Raises ProtocolError when another
        request took one of them meanwhile (none is taken then)."""
        turn = pending.mcp
        if turn is None or not turn.answers:
            return None
        answers, turn.answers = turn.answers, []
        keys = [(turn.principal, answer.approval_id) for answer in answers]
        if any(
            turn.approvals.get(key) is not answer.asked
            for key, answer in zip(keys, answers, strict=True)
        ):
            raise ProtocolError(
                "mcp_approval_not_found",
                "An approval request this request answers was answered meanwhile.",
                "input",
            )
        for key in keys:
            del turn.approvals[key]
        turn.running = [answer for answer in answers if answer.approve]
        if not turn.running:
            return None
        requests = tuple(
            McpRequest(answer.server, answer.asked.name, answer.asked.arguments, None)
            for answer in turn.running
        )
        seconds = max(turn.deadline - time.monotonic(), 0.0)
        return McpCall(self.port.new_key(), requests, turn.principal, seconds)

    def approved(self, pending: Pending, results: list[str | McpError]) -> None:
        """The calls a request approved ran: their `mcp_call` items wait for its
        response's start, their outputs replace their placeholders in its frame, and it
        is parsed again when it renders."""
        turn = pending.mcp
        assert turn is not None, "a request with approved calls"
        frame = turn.frame
        for answer, result in zip(turn.running, results, strict=True):
            call_id = answer.approval_id.removeprefix(MCP_APPROVAL)
            call = {
                "id": MCP_CALL + call_id,
                "type": "mcp_call",
                "server_label": answer.server.label,
                "name": answer.asked.name,
                "arguments": answer.asked.arguments,
                "approval_request_id": answer.approval_id,
            }
            if isinstance(result, McpError):
                turn.approved.append({**call, "output": None, "error": result.as_item_error()})
                output = f"error: {result.message}"
            else:
                turn.approved.append({**call, "output": result, "error": None})
                output = result
            frame = frame.replace(orjson.dumps(answer.placeholder), orjson.dumps(output), 1)
        turn.calls += len(turn.running)
        turn.running, turn.frame = [], b""
        pending.parsed, pending.frame = None, frame

    def done(self, key: int, results: list[str | McpError]) -> None:
        """The calls of `key` ran: their items end, their outputs are appended to the
        conversation, and the model goes on (or the response ends)."""
        port = self.port
        calling = self.calling.pop(key, None)
        if calling is None or port.generating.pop(key, None) is None:
            return  # cancelled, or the client left
        response = calling.response
        outputs = []
        for (index, item, call_id), result in zip(calling.calls, results, strict=True):
            if isinstance(result, McpError):
                error, output = result.as_item_error(), f"error: {result.message}"
                frames = response.events.mcp_call_done(index, item, None, error)
            else:
                output = result
                frames = response.events.mcp_call_done(index, item, output, None)
            for frame in frames:
                port.emit(frame)
            outputs.append({"type": "function_call_output", "call_id": call_id, "output": output})
        # Appended as tool output, as a client's injected output is: data, not template text.
        response.injected.append(Injection(response.events.response_id, [], outputs, 0))
        if calling.ends:
            response.terminal(
                "response.completed",
                "completed",
                response.usage(),
                response.conversation.checkpoint(),
            )
            return
        try:
            self.long_running.resume(response)
        except ProtocolError as e:
            response.injected = []
            response.fail(f"The MCP output could not be appended: {e.message}", response.usage())
