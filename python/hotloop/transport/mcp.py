"""The I/O of the `mcp` tool for both transports: a request's MCP servers listed before
it reaches its connection (awaited by the reader like a store read, so frames keep
their order), and the `McpCall` work a response hands out, run as a task of its own
(the event loop serves every other connection meanwhile)."""

from __future__ import annotations

import asyncio
import dataclasses

from hotloop._core import CreateRequest
from hotloop.mcp_client import McpClient, McpError
from hotloop.protocol.actions import McpCall, McpRequest
from hotloop.protocol.connection import Connection
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.mcp_tools import asks, rewritten
from hotloop.protocol.parsing import Parsed


async def listed(client: McpClient, connection: Connection, parsed: Parsed) -> Parsed:
    """A `response.create` frame with its MCP servers listed (the frame as the turn
    runs it, see `rewritten`), or its refusal; any other frame as it is."""
    event = parsed.event
    if not isinstance(event, CreateRequest) or not asks(event, parsed.frame):
        return parsed
    try:
        frame, turn = await rewritten(
            client,
            parsed.frame,
            connection.settings.principal,
            connection.limits.request,
            connection.reparse,
        )
    except ProtocolError as e:
        return dataclasses.replace(parsed, event=e)
    return dataclasses.replace(connection.parse(frame), mcp=turn)


async def run_calls(client: McpClient, connection: Connection, work: McpCall) -> None:
    """Run a response's MCP calls together and hand their results to the connection."""

    async def one(request: McpRequest) -> str | McpError:
        if request.refusal is not None:
            return request.refusal
        try:
            return await client.call(
                request.server, request.name, request.arguments, work.principal, work.seconds
            )
        except McpError as e:
            return e

    results = await asyncio.gather(*(one(request) for request in work.calls))
    connection.mcp_done(work.key, list(results))
