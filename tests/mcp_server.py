"""The tests' MCP server: the `mcp` package's own server over streamable HTTP on a
loopback port, with tools to call from a response (read a file from a sandbox
directory, add numbers, sleep, fail, return 1 MB)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from servers import serving

MEGABYTE = 1024 * 1024


def mcp_app(sandbox: Path) -> MCPServer:
    server = MCPServer("hotloop-tests")

    @server.tool()
    def read_file(path: str) -> str:
        """Read a text file of the sandbox directory."""
        target = (sandbox / path).resolve()
        if sandbox.resolve() not in target.parents:
            raise ValueError(f"{path} is outside the sandbox")
        return target.read_text()

    @server.tool()
    def add(a: float, b: float) -> str:
        """Add two numbers."""
        return repr(a + b)

    @server.tool()
    async def sleep(seconds: float) -> str:
        """Wait, then answer (a slow tool: its caller's timeout ends it)."""
        await asyncio.sleep(seconds)
        return "slept"

    @server.tool()
    def fail() -> str:
        """Always fails."""
        raise RuntimeError("this tool always fails")

    @server.tool()
    def megabyte() -> str:
        """One megabyte of text."""
        return "x" * MEGABYTE

    return server


@contextmanager
def mcp_server(sandbox: Path) -> Iterator[str]:
    """The server running; yields its endpoint URL."""
    app = mcp_app(sandbox).streamable_http_app(json_response=True, stateless_http=True)
    # A call of `sleep` the client gave up on must not hold the shutdown for its length.
    with serving(app, ws="auto", http="auto", timeout_graceful_shutdown=0) as url:
        yield url + "/mcp"


SEEN_HEADERS: list[dict[bytes, bytes]] = []
"""The headers of every request the hostile server was sent."""


async def hostile(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An MCP endpoint gone wrong, by path: `/hang` never answers, `/malformed` answers
    JSON-RPC that is not JSON, `/endless` streams an SSE event that never ends,
    `/redirect` sends the client to another host (`/redirect` again on 127.0.0.2)."""
    if scope["type"] == "http":
        SEEN_HEADERS.append(dict(scope["headers"]))
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    path = scope["path"]
    if path == "/hang":
        await asyncio.Event().wait()
    if path == "/redirect":
        port = scope["server"][1]
        location = f"http://127.0.0.2:{port}/mcp".encode()
        await send(
            {"type": "http.response.start", "status": 307, "headers": [(b"location", location)]}
        )
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/malformed":
        start = {"type": "http.response.start", "status": 200}
        await send({**start, "headers": [(b"content-type", b"application/json")]})
        await send(
            {"type": "http.response.body", "body": b'{"jsonrpc": "2.0", "id": 0, "result": '}
        )
        return
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"data: ", "more_body": True})
    # One event far longer than any bound (64 MiB): endless to the client, which gives
    # up long before; bounded here, as a send after the client left does not fail.
    for _ in range(1024):
        await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
    await send({"type": "http.response.body", "body": b"\n\n"})


@contextmanager
def hostile_server() -> Iterator[str]:
    """The hostile endpoints running; yields the base URL."""
    with serving(hostile, ws="auto", http="auto", timeout_graceful_shutdown=0) as url:
        yield url
