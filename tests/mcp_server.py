"""The tests' MCP server: the `mcp` package's own server over streamable HTTP on a
loopback port, with tools to call from a response (read a file from a sandbox
directory, add numbers, sleep, fail, return 1 MB, keep a note), and a hostile one."""

from __future__ import annotations

import asyncio
import functools
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from mcp.server.mcpserver import MCPServer
from servers import serving

MEGABYTE = 1024 * 1024
NOTES: list[str] = []
"""What the `note` tool was called with."""


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

    @server.tool()
    def note(text: str) -> str:
        """Keep a note (a call with an effect: the tests read `NOTES`)."""
        NOTES.append(text)
        return "noted"

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
SEEN_PATHS: list[str] = []
"""The path of every request the hostile server was sent."""

HUGE_LISTING = 64 * MEGABYTE
"""The size of the `/huge` listing answers (decoded)."""
LISTED = {
    "/bad-schema": [
        {"name": "bad", "inputSchema": {"type": "object", "properties": {"x": {"type": 12}}}}
    ],
    "/many": [{"name": f"t{n}", "inputSchema": {"type": "object"}} for n in range(600)],
}
"""The tools of the listing endpoints that offer tools no request can take."""
DISCOVERED = {
    "cacheScope": "private",
    "capabilities": {"tools": {"listChanged": False}},
    "resultType": "complete",
    "supportedVersions": ["2026-07-28"],
    "ttlMs": 0,
}
"""A `server/discover` result (the one the tests' MCP server gives)."""


def huge_listing(request_id: Any) -> Iterator[bytes]:
    """A `tools/list` answer of `HUGE_LISTING` bytes, in 64 KiB pieces: one tool whose
    description is that long (made as it is sent: the server never holds it)."""
    head = (
        b'{"jsonrpc":"2.0","id":%s,"result":{"cacheScope":"private","resultType":"complete",'
        b'"ttlMs":0,"tools":[{"name":"t","inputSchema":{"type":"object"},"description":"'
    )
    yield head % orjson.dumps(request_id)
    for _ in range(HUGE_LISTING // 65536):
        yield b" " * 65536
    yield b'"}]}}'


@functools.cache
def gzipped_listing(request_id: int) -> bytes:
    """`huge_listing` as one gzip member (64 MiB of spaces: 64 KiB), made once."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    pieces = [packer.compress(piece) for piece in huge_listing(request_id)]
    return b"".join(pieces) + packer.flush()


async def hostile(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An MCP endpoint gone wrong, by path: `/hang` never answers, `/malformed` answers
    JSON-RPC that is not JSON, `/endless` streams an SSE event that never ends,
    `/redirect` sends the client to another host (`/redirect` again on 127.0.0.2),
    `/escape` to another path of its own origin (`/admin/mcp`); the `listing` paths
    answer a listing no request can take."""
    if scope["type"] == "http":
        SEEN_HEADERS.append(dict(scope["headers"]))
        SEEN_PATHS.append(scope["path"])
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    path = scope["path"]
    if path == "/hang":
        await asyncio.Event().wait()
    if path in ("/redirect", "/escape"):
        port = scope["server"][1]
        host = "127.0.0.2" if path == "/redirect" else "127.0.0.1"
        target = "/mcp" if path == "/redirect" else "/admin/mcp"
        location = f"http://{host}:{port}{target}".encode()
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
    if path in ("/huge", "/huge-error", "/gzip", *LISTED):
        await listing(path, receive, send)
        return
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"data: ", "more_body": True})
    # One event far longer than any bound (64 MiB): endless to the client, which gives
    # up long before; bounded here, as a send after the client left does not fail.
    for _ in range(1024):
        await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
    await send({"type": "http.response.body", "body": b"\n\n"})


async def listing(path: str, receive: Any, send: Any) -> None:
    """Discovered as the tests' MCP server is, then a listing: `/huge` answers with
    `HUGE_LISTING` bytes of JSON, `/huge-error` the same as a 500, `/gzip` the same
    compressed (64 KiB), the `LISTED` paths with their tools."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    request = orjson.loads(body) if body else {}
    if "id" not in request:
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    headers = [(b"content-type", b"application/json")]
    start = {"type": "http.response.start", "status": 200, "headers": headers}
    result: dict[str, Any] = DISCOVERED
    if request.get("method") == "tools/list" and path in LISTED:
        tools = LISTED[path]
        result = {"cacheScope": "private", "resultType": "complete", "ttlMs": 0, "tools": tools}
    elif request.get("method") == "tools/list":
        if path == "/gzip":
            headers.append((b"content-encoding", b"gzip"))
            await send(start)
            await send({"type": "http.response.body", "body": gzipped_listing(request["id"])})
            return
        await send({**start, "status": 500 if path == "/huge-error" else 200})
        for piece in huge_listing(request["id"]):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    await send(start)
    answer = {"jsonrpc": "2.0", "id": request["id"], "result": result}
    await send({"type": "http.response.body", "body": orjson.dumps(answer)})


@contextmanager
def hostile_server() -> Iterator[str]:
    """The hostile endpoints running; yields the base URL."""
    with serving(hostile, ws="auto", http="auto", timeout_graceful_shutdown=0) as url:
        yield url
