"""Remote MCP tools inside one response (docs/tools.md, "MCP tools"): a request's `mcp`
tools are checked against `--mcp-allow` and listed before the turn starts (`rewritten`,
awaited by the transport like a store read), their tools offered to the model as
function tools; a model turn that ends calling them hands the calls out (`McpCall`),
and their results are appended to the conversation's cached tokens as the family's
tool output, the engine going on from its prefix cache (`McpLoop`). The calls a
request approves run once the connection accepted it (`McpLoop.answer`), before its
turn renders.

The wire shape of `mcp_list_tools` and `mcp_call` items is `events.py`'s; the calls
themselves are `hotloop.mcp_client`'s. A failed listing or call is an item with an
`error`, never a failed response: the model sees the error and goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from hotloop._core import CoreError, CreateRequest, Limits, parse_request
from hotloop.events import MCP_APPROVAL, MCP_CALL
from hotloop.mcp_client import (
    REDACTED,
    Approval,
    Approvals,
    Listing,
    Listings,
    McpClient,
    McpError,
    McpServer,
    sent_headers,
)
from hotloop.protocol.actions import McpCall, McpRequest
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.injection import Injection
from hotloop.protocol.parsing import offloads
from hotloop.protocol.state import State

if TYPE_CHECKING:
    from hotloop.protocol.connection import Connection
    from hotloop.protocol.lanes import Pending
    from hotloop.protocol.response import Response

DECLINED = "The user declined this call."
LABEL = re.compile(r"[A-Za-z0-9_-]{1,64}")
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class Answer:
    """An `mcp_approval_response` of a request: the approval request it answers (by id,
    and what it asked), the server the call goes to, and whether the client approved.
    An approved call's output stands in the frame as `placeholder` until it ran."""

    approval_id: str
    asked: Approval
    server: McpServer
    approve: bool
    placeholder: str


@dataclass
class McpTurn:
    """A request's MCP servers, as listed before its turn, and the loop's bounds."""

    listings: list[Listing]
    tools: dict[str, McpServer]
    """The tools offered to the model, by name, and the server each is called on."""
    max_calls: int | None
    """The request's `max_tool_calls`."""
    deadline: float
    """`time.monotonic()` after which no call starts (`--mcp-response-time`)."""
    principal: str | None
    approvals: Approvals
    """Where the approval requests this response ends with wait (the process's)."""
    kept: Listings
    """Where its listings are kept for the next response of the chain."""
    reparse: Callable[[str | bytes], CreateRequest]
    """How the transport parses the frame (a WebSocket frame or an HTTP body)."""
    answers: list[Answer] = field(default_factory=list)
    """The approval requests it answers, taken when the request is accepted."""
    frame: bytes = b""
    """The frame as the turn runs it, with the approved calls' placeholders (kept while
    they have not run)."""
    running: list[Answer] = field(default_factory=list)
    """The approved calls running (`McpLoop.answer`)."""
    approved: list[dict[str, Any]] = field(default_factory=list)
    """`mcp_call` items of the calls the client approved, run before the turn."""
    calls: int = 0

    @property
    def gated(self) -> frozenset[str]:
        """The offered tools whose calls wait for the client's approval."""
        return frozenset(name for name, server in self.tools.items() if server.needs_approval(name))

    @property
    def checks(self) -> bool:
        """Its render only checks the request (on a copy of the conversation): the calls
        it approves run once it is accepted, and their outputs are not in yet."""
        return any(answer.approve for answer in self.answers)


def asks(request: CreateRequest, frame: str | bytes) -> bool:
    """Whether a request has `mcp` tools (the core skips them in rendering) or answers
    approval requests (the core does not know the item: its parse is refused)."""
    if isinstance(frame, str):
        frame = frame.encode()
    if b'"mcp_approval_response"' in frame:
        return True
    return request.error is None and any(kind == "mcp" for kind, _ in request.skipped_tools)


async def rewritten(
    client: McpClient,
    frame: str | bytes,
    principal: str | None,
    limits: Limits | None,
    reparse: Callable[[str | bytes], CreateRequest],
) -> tuple[bytes, McpTurn]:
    """A frame or body with `mcp` tools as the turn runs it: each server's credentials
    redacted (the Response echoes and the store keeps its tools), its listed tools added
    as function tools, each `mcp_approval_response` replaced by the output of the call
    it approved (a placeholder until the call runs: `McpLoop.answer`) or declined.
    Raises ProtocolError (nothing was connected to) for more servers than a request may
    name, a server the client may not name, a malformed `mcp` tool, or an approval that
    answers no request of this key in the previous response."""
    event = orjson.loads(frame)
    body = event["response"] if isinstance(event.get("response"), dict) else event
    tools = body.get("tools")
    if not isinstance(tools, list):
        tools = body["tools"] = []
    named = [
        n for n, tool in enumerate(tools) if isinstance(tool, dict) and tool.get("type") == "mcp"
    ]
    most = client.settings.max_servers
    if len(named) > most:
        raise ProtocolError(
            "array_above_max_length",
            f"A request may name at most {most} mcp tools (--mcp-max-servers); this one "
            f"names {len(named)}.",
            "tools",
        )
    servers = [server_of(tools[n], n, client) for n in named]
    labels = [server.label for server in servers]
    if len(set(labels)) != len(labels):
        raise ProtocolError("invalid_value", "Two mcp tools have the same server_label.", "tools")
    parent = body.get("previous_response_id")

    async def listed(server: McpServer) -> Listing:
        # Listed earlier in the chain, with the same definition: no second listing.
        kept = client.listings.get((principal, parent, server.label)) if parent else None
        if kept is not None and kept.server.definition == server.definition:
            return dataclasses.replace(kept, server=server, reused=True)
        return await client.list_tools(server, principal)

    listings, offered = await offer(
        await asyncio.gather(*(listed(server) for server in servers)), tools, limits
    )
    max_calls = body.get("max_tool_calls")
    deadline = time.monotonic() + client.settings.response_time
    turn = McpTurn(
        listings,
        offered,
        max_calls if isinstance(max_calls, int) else None,
        deadline,
        principal,
        client.approvals,
        client.listings,
        reparse,
    )
    inputs = body.get("input")
    for n, item in enumerate(inputs if isinstance(inputs, list) else []):
        if isinstance(item, dict) and item.get("type") == "mcp_approval_response":
            inputs[n] = approval_answer(client, turn, body, servers, item, n)
    rewritten_frame = orjson.dumps(event)
    if turn.checks:
        turn.frame = rewritten_frame
    return rewritten_frame, turn


async def offer(
    listings: list[Listing], tools: list[Any], limits: Limits | None
) -> tuple[list[Listing], dict[str, McpServer]]:
    """Add the listed tools to the request's `tools` as function tools: the listings as
    offered, and the tools offered by name, with their server. A listing whose tools the
    request cannot take (a schema the core refuses, more tools or bytes than a request
    holds) offers none and is an error instead; a tool named like another tool of the
    request refuses the request (ProtocolError `mcp_tool_conflict`)."""
    functions = {tool.get("name") for tool in tools if tool.get("type") == "function"}
    offers: list[tuple[Listing, list[dict[str, Any]]]] = []
    for listing in listings:
        listed = []
        for tool in listing.tools:
            name = tool["name"]
            if name in functions:
                raise ProtocolError(
                    "mcp_tool_conflict",
                    f"MCP server {listing.server.label!r} offers a tool named {name!r}, "
                    "which another tool of this request has: restrict it with allowed_tools.",
                    "tools",
                )
            if not FUNCTION_NAME.fullmatch(name):
                continue  # the model could not name it in a call
            functions.add(name)
            listed.append(
                {
                    "type": "function",
                    "name": name,
                    "description": tool["description"] or "",
                    "parameters": tool["input_schema"],
                    "strict": False,
                }
            )
        offers.append((listing, listed))
    # The core checks each listing's tools as a request would hold them; then all of
    # them with the request's own, the last listing left out while they are too many.
    checked = []
    for listing, listed in offers:
        error = await tools_refusal(listed, limits) if listed else None
        if error is not None:
            index = tool_index(error.param)
            what = "Its tools" if index is None else f"The listed tool {listed[index]['name']!r}"
            listing, listed = refused(listing, f"{what} cannot be offered: {error.message}"), []
        checked.append((listing, listed))
    while True:
        added = [tool for _, listed in checked for tool in listed]
        error = await tools_refusal(tools + added, limits) if added else None
        index = None if error is None else tool_index(error.param)
        if error is None or (index is not None and index < len(tools)):
            break  # taken, or the request's own tools are refused, with the request
        at = max(n for n, (_, listed) in enumerate(checked) if listed)
        message = f"Its tools cannot be offered with the request's other tools: {error.message}"
        checked[at] = (refused(checked[at][0], message), [])
    tools.extend(added)
    offered = {tool["name"]: listing.server for listing, listed in checked for tool in listed}
    return [listing for listing, _ in checked], offered


def refused(listing: Listing, message: str) -> Listing:
    """A listing whose tools a request cannot take: its item says why (a listing reused
    along the chain too: it offers nothing now)."""
    error = McpError("mcp_protocol_error", -32602, message)
    return dataclasses.replace(listing, tools=[], error=error, reused=False)


async def tools_refusal(tools: list[Any], limits: Limits | None) -> CoreError | None:
    """Why the core refuses a request with these `tools` (None: it takes them). The final
    parse of the frame finds the same bytes in its cache of checked tool lists."""
    body = orjson.dumps({"input": [], "tools": tools})
    if offloads(body):
        return (await asyncio.to_thread(parse_request, body, limits)).error
    return parse_request(body, limits).error


def tool_index(param: str | None) -> int | None:
    """The index of the tool a core error's `param` points at (`tools[3].parameters`)."""
    found = re.match(r"tools\[(\d+)\]", param or "")
    return int(found.group(1)) if found else None


def approval_answer(
    client: McpClient,
    turn: McpTurn,
    body: dict[str, Any],
    servers: list[McpServer],
    item: dict[str, Any],
    n: int,
) -> dict[str, Any]:
    """The `function_call_output` an `mcp_approval_response` stands for: that the client
    declined the call, or a placeholder for the approved call's output (it runs once the
    request is accepted). Nothing is taken yet: a refused request leaves the approval
    request waiting. Raises ProtocolError."""
    param = f"input[{n}].approval_request_id"
    approval_id = item.get("approval_request_id")
    if not isinstance(approval_id, str):
        approval_id = ""
    pending = client.approvals.get((turn.principal, approval_id))
    if pending is None or pending.response_id != body.get("previous_response_id"):
        raise ProtocolError(
            "mcp_approval_not_found",
            f"No approval request {approval_id!r} of this API key waits in the previous response.",
            param,
        )
    server = next((s for s in servers if s.label == pending.label), None)
    if server is None:
        raise ProtocolError(
            "missing_required_parameter",
            f"Send the mcp tool of server_label {pending.label!r} again to run its call.",
            "tools",
        )
    approve = item.get("approve") is True
    placeholder = f"hotloop-mcp-output-{secrets.token_hex(16)}"
    turn.answers.append(Answer(approval_id, pending, server, approve, placeholder))
    call_id = approval_id.removeprefix(MCP_APPROVAL)
    output = placeholder if approve else DECLINED
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def server_of(tool: dict[str, Any], n: int, client: McpClient) -> McpServer:
    """The server of `tools[n]`, its credentials redacted in `tool`; raises
    ProtocolError for one that is malformed or not allowed."""
    param = f"tools[{n}]"
    label, url = tool.get("server_label"), tool.get("server_url")
    if not isinstance(label, str) or not LABEL.fullmatch(label):
        message = "server_label must match ^[A-Za-z0-9_-]{1,64}$."
        raise ProtocolError("invalid_value", message, f"{param}.server_label")
    if not isinstance(url, str):
        raise ProtocolError(
            "missing_required_parameter",
            "An mcp tool needs server_url (connectors are not served here).",
            f"{param}.server_url",
        )
    refusal = client.settings.refusal(url)
    if refusal is not None:
        raise ProtocolError("mcp_server_not_allowed", refusal, f"{param}.server_url", status=403)
    headers = tool.get("headers") or {}
    if not isinstance(headers, dict) or not all(
        isinstance(value, str) for value in headers.values()
    ):
        raise ProtocolError(
            "invalid_type", "headers must map names to strings.", f"{param}.headers"
        )
    definition = hashlib.sha256(orjson.dumps(tool, option=orjson.OPT_SORT_KEYS)).hexdigest()
    headers = sent_headers(headers)
    authorization = tool.get("authorization")
    if isinstance(authorization, str):
        headers["Authorization"] = f"Bearer {authorization}"
        tool["authorization"] = REDACTED
    if tool.get("headers"):
        tool["headers"] = dict.fromkeys(tool["headers"], REDACTED)
    approval = tool.get("require_approval", "always")
    if approval not in ("always", "never") and not isinstance(approval, dict):
        raise ProtocolError(
            "invalid_value",
            "require_approval must be 'always', 'never' or per tool.",
            f"{param}.require_approval",
        )
    tools = allowed(tool.get("allowed_tools"))
    return McpServer(label, url, headers, tools, approval, definition)


def allowed(value: Any) -> frozenset[str] | None:
    """`allowed_tools` as sent (a list of names, or `{"tool_names": [...]}`)."""
    if isinstance(value, dict):
        value = value.get("tool_names")
    if isinstance(value, list):
        return frozenset(name for name in value if isinstance(name, str))
    return None


@dataclass
class Calling:
    """A response's MCP calls while they run: the items and their call ids, and whether
    the response ends after them (a client function call in the same turn, a bound)."""

    response: Response
    calls: list[tuple[int, dict[str, Any], str]]
    ends: bool
    outputs: list[dict[str, Any]] = field(default_factory=list)


def replayable(output: list[Any]) -> list[Any]:
    """Stored output items as the core renders them: an `mcp_call` is the function call
    the model made (its id holds the call id; its output follows as input committed
    inside the response), an `mcp_list_tools` rendered nothing."""
    items = []
    for item in output:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "mcp_list_tools" or (kind == "mcp_call" and item.get("approval_request_id")):
            continue  # renders nothing; an approved call's own turn rendered it
        if kind in ("mcp_approval_request", "mcp_call"):
            prefix = MCP_APPROVAL if kind == "mcp_approval_request" else MCP_CALL
            item = {
                "type": "function_call",
                "call_id": item["id"].removeprefix(prefix),
                "name": item["name"],
                "arguments": item["arguments"],
            }
        items.append(item)
    return items


class McpLoop:
    """A connection's responses whose MCP calls run (they count in flight as
    generating: a cancel or the client's leaving stops them)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
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
            self.connection.outbox.extend(
                events.mcp_list_tools(listing.server.label, listing.tools, error)
            )
        events.mcp_labels = {name: server.label for name, server in turn.tools.items()}
        events.mcp_gated = turn.gated
        for item in turn.approved:
            self.connection.outbox.extend(events.mcp_approved(item))

    def call(self, response: Response, client_calls: bool) -> None:
        """The model turn ended calling MCP tools: they run (the transport's `McpCall`),
        each refused with an error item past `max_tool_calls` or the response's time."""
        connection, turn, events = self.connection, response.mcp, response.events
        assert turn is not None, "a response with mcp tools"
        calls, events.mcp_calls = events.mcp_calls, []
        approvals, events.mcp_approvals = events.mcp_approvals, []
        for item in approvals:
            pending = Approval(
                events.response_id, item["server_label"], item["name"], item["arguments"]
            )
            turn.approvals.hold((turn.principal, item["id"]), pending)
        # Calls of responses stopped meanwhile (a cancel, the client's leaving) never end.
        self.calling = {k: c for k, c in self.calling.items() if k in connection.generating}
        left = turn.deadline - time.monotonic()
        requests = []
        # Approval requests end the response: the client's approvals continue it.
        ends = client_calls or bool(approvals)
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
        response.enter(State.CALLING_MCP)
        key = connection.new_key()
        response.key = key
        connection.generating[key] = response
        self.calling[key] = Calling(response, calls, ends)
        connection.outbox.append(
            McpCall(key, tuple(requests), connection.settings.principal, max(left, 0.0))
        )

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
        return McpCall(self.connection.new_key(), requests, turn.principal, seconds)

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
        connection = self.connection
        calling = self.calling.pop(key, None)
        if calling is None or connection.generating.pop(key, None) is None:
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
            connection.outbox.extend(frames)
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
            connection.long_running.resume(response)
        except ProtocolError as e:
            response.injected = []
            response.fail(f"The MCP output could not be appended: {e.message}", response.usage())
