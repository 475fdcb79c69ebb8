"""A request's remote MCP tools (docs/tools.md, "MCP tools"): its `mcp` tools are checked
against `--mcp-allow` and listed before the turn starts (`rewritten`, awaited by the
transport like a store read), their tools offered to the model as function tools, its
`mcp_approval_response` items turned into the outputs of the calls they approve
(`McpTurn`: what the request's turn carries); and the stored output items as the core
renders them again (`replayable`). The calls inside the response are `mcp_loop.py`'s.

The wire shape of `mcp_list_tools` and `mcp_call` items is `events.py`'s; the calls
themselves are `hotloop.mcp_client`'s. A failed listing is an item with an `error`,
never a failed response: the model sees the error and goes on.
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
from typing import Any

import orjson

from hotloop._core import Body, CoreError, CreateRequest, Limits, parse_request
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
from hotloop.protocol.actions import offloads
from hotloop.protocol.errors import ProtocolError

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


def asks(request: CreateRequest, frame: str | bytes | Body) -> bool:
    """Whether a request has `mcp` tools (the core skips them in rendering) or answers
    approval requests (the core does not know the item: its parse is refused, so only a
    refused frame is searched for one; a history resent each turn is not)."""
    if request.error is None:
        return any(kind == "mcp" for kind, _ in request.skipped_tools)
    if isinstance(frame, str):
        frame = frame.encode()
    return b'"mcp_approval_response"' in frame


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
