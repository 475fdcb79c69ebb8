"""The tests' MCP server: the `mcp` package's own server over streamable HTTP on a
loopback port, with tools to call from a response (read a file from a sandbox
directory, add numbers, sleep, fail, return 1 MB)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
