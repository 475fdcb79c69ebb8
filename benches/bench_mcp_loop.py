"""An agent loop of 20 tool calls (issue 26): run as MCP tools by the server inside one
response, against the same loop with client-run function tools over WebSocket
(`previous_response_id` on one socket) and over HTTP (one `POST /v1/responses` per
turn, JSON).

Against `hotloop serve --engine sim` in its own process, the sim scripted to call `add`
20 times, then answer. The tool lives on an MCP server (the `mcp` package's, over
streamable HTTP on loopback, in this process); in the client loops the client calls it
with the same client code the server uses (`hotloop.mcp_client`: one session per call),
so the tool's own cost is the same on every side. Reported per loop, median of
`--loops` runs (the three kinds in turn): the time from the first request to the
answer, and the bytes the client sent and received (WebSocket frame payloads, HTTP
bodies; headers not counted).

    .venv/bin/python benches/bench_mcp_loop.py [--loops 5] [--calls 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import uvicorn
from hotloop.lab.proc import ServerProcess
from hotloop.lab.threaded import serving
from hotloop.mcp_client import McpClient, McpServer, McpSettings
from mcp.server.mcpserver import MCPServer
from websockets.sync.client import ClientConnection, connect

TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}
ARGUMENTS = '{"a": 1, "b": 2}'
ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two numbers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    },
}


@contextmanager
def mcp_server() -> Iterator[str]:
    """An MCP server with an `add` tool on a loopback port; yields its endpoint."""
    server = MCPServer("bench")

    @server.tool()
    def add(a: float, b: float) -> str:
        """Add two numbers."""
        return repr(a + b)

    app = server.streamable_http_app(json_response=True, stateless_http=True)
    with serving(uvicorn.Config(app, log_level="warning", lifespan="on")) as port:
        yield f"http://127.0.0.1:{port}/mcp"


class Wire:
    """Bytes the client sent and received."""

    def __init__(self) -> None:
        self.sent = self.received = 0


def ws_turn(ws: ClientConnection, frame: dict[str, Any], wire: Wire) -> dict[str, Any]:
    text = orjson.dumps({"type": "response.create", "model": "sim", **frame})
    ws.send(text.decode())
    wire.sent += len(text)
    while True:
        raw = ws.recv(timeout=120)
        wire.received += len(raw)
        event = orjson.loads(raw)
        if event["type"] in TERMINAL:
            assert event["type"] == "response.completed", event
            response: dict[str, Any] = event["response"]
            return response


def mcp_loop(ws_url: str, endpoint: str, calls: int) -> tuple[float, Wire]:
    wire = Wire()
    tool = {
        "type": "mcp",
        "server_label": "bench",
        "server_url": endpoint,
        "require_approval": "never",
    }
    with connect(ws_url, max_size=None) as ws:
        start = time.perf_counter()
        response = ws_turn(ws, {"input": "go", "tools": [tool], "store": False}, wire)
        elapsed = time.perf_counter() - start
    made = [item for item in response["output"] if item["type"] == "mcp_call"]
    assert len(made) == calls and all(item["error"] is None for item in made), response
    return elapsed, wire


def tool_client(endpoint: str) -> tuple[McpClient, McpServer]:
    """How the client calls the tool: the server's own MCP client code."""
    return McpClient(McpSettings(allow=(endpoint,))), McpServer("b", endpoint, {}, None, "never")


def client_outputs(
    client: McpClient, server: McpServer, response: dict[str, Any]
) -> list[dict[str, Any]]:
    """The client runs the response's calls on the MCP server."""
    outputs = []
    for item in response["output"]:
        if item["type"] == "function_call":
            output = asyncio.run(client.call(server, item["name"], item["arguments"], None, 30))
            outputs.append(
                {"type": "function_call_output", "call_id": item["call_id"], "output": output}
            )
    return outputs


def ws_loop(ws_url: str, endpoint: str, calls: int) -> tuple[float, Wire]:
    wire = Wire()
    client, server = (
        McpClient(McpSettings(allow=(endpoint,))),
        McpServer("b", endpoint, {}, None, "never"),
    )
    with connect(ws_url, max_size=None) as ws:
        start = time.perf_counter()
        frame: dict[str, Any] = {"input": "go", "tools": [ADD], "store": False}
        for _ in range(calls + 1):
            response = ws_turn(ws, frame, wire)
            outputs = client_outputs(client, server, response)
            if not outputs:
                break
            frame = {"input": outputs, "tools": [ADD], "store": False}
            frame["previous_response_id"] = response["id"]
        return time.perf_counter() - start, wire


def http_loop(base_url: str, endpoint: str, calls: int) -> tuple[float, Wire]:
    wire = Wire()
    client, server = (
        McpClient(McpSettings(allow=(endpoint,))),
        McpServer("b", endpoint, {}, None, "never"),
    )
    with httpx.Client(base_url=base_url, timeout=120) as http:
        start = time.perf_counter()
        body: dict[str, Any] = {"model": "sim", "input": "go", "tools": [ADD], "store": True}
        for _ in range(calls + 1):
            content = orjson.dumps(body)
            reply = http.post("/responses", content=content)
            wire.sent += len(content)
            wire.received += len(reply.content)
            response = reply.json()
            assert response["status"] == "completed", response
            outputs = client_outputs(client, server, response)
            if not outputs:
                break
            body = {"model": "sim", "input": outputs, "tools": [ADD], "store": True}
            body["previous_response_id"] = response["id"]
        return time.perf_counter() - start, wire


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    with mcp_server() as endpoint:
        flags = [
            "--engine=sim",
            "--sim-tool=add",
            f"--sim-tool-calls={args.calls}",
            f"--sim-tool-arguments={ARGUMENTS}",
            f"--mcp-allow={endpoint}",
        ]
        server = ServerProcess.start(flags)
        try:
            loops = {
                "MCP, server-side, one response (WebSocket)": mcp_loop,
                "client function tools over WebSocket": ws_loop,
                "client function tools over HTTP (JSON)": http_loop,
            }
            print(f"{args.calls} tool calls per loop, median of {args.loops} loops")
            print("| loop | time per loop | per call | bytes sent | bytes received |")
            print("|---|---|---|---|---|")
            runs: dict[str, list[tuple[float, Wire]]] = {name: [] for name in loops}
            # Round robin, after one warm loop each: a machine's load drifts, and it
            # drifts over every kind of loop alike.
            for round_ in range(args.loops + 1):
                for name, loop in loops.items():
                    url = server.base_url if loop is http_loop else server.ws_url
                    run = loop(url, endpoint, args.calls)
                    if round_:
                        runs[name].append(run)
            for name, done in runs.items():
                seconds = statistics.median(run[0] for run in done)
                wire = done[-1][1]
                print(
                    f"| {name} | {seconds * 1000:.0f} ms | {seconds * 1000 / args.calls:.1f} ms "
                    f"| {wire.sent:,} | {wire.received:,} |"
                )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
