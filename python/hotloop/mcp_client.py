"""The client side of remote MCP servers (the `mcp` tool): which servers a client may
name (`McpSettings.refusal`, the `--mcp-allow` list), and listing and calling their
tools over MCP's streamable HTTP transport from the `mcp` package, each bounded in
time, in size and in concurrency (per key and per process).

The server makes these requests on a client's behalf, so nothing here raises into the
response: every failure is an `McpError` that becomes the `error` of an `mcp_call` (or
`mcp_list_tools`) item, and the model goes on. A server's `headers` are used for the
requests of that one server, never logged and never kept past the response.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx2
import orjson
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ListToolsResult

from hotloop.config import ServerConfig

log = logging.getLogger("hotloop.mcp")

REDACTED = "[redacted]"


@dataclass(frozen=True)
class McpServer:
    """One `mcp` tool of a request: where it is, its credentials (`headers`, with
    `authorization` as its `Authorization` header) and the tools it may offer."""

    label: str
    url: str
    headers: dict[str, str] = field(repr=False)
    allowed_tools: frozenset[str] | None
    approval: str | dict[str, Any]
    """`require_approval` as sent: `always`, `never` or per tool (see `needs_approval`)."""
    definition: str = field(default="", repr=False)
    """A digest of the tool as sent, credentials included: a listing is reused along a
    chain while it is the same."""

    def needs_approval(self, name: str) -> bool:
        """Whether a call of `name` waits for the client's `mcp_approval_response`."""
        approval = self.approval
        if isinstance(approval, str):
            return approval != "never"
        never = approval.get("never") or {}
        names = never.get("tool_names") if isinstance(never, dict) else None
        return not (isinstance(names, list) and name in names)


@dataclass(frozen=True)
class McpError(Exception):
    """Why a listing or a call failed, as the OpenAI SDK's `McpToolCallError`: an
    `http_error` (with an HTTP-like code for hotloop's own bounds), an
    `mcp_protocol_error` or an `mcp_tool_execution_error`."""

    kind: str
    code: int
    message: str
    content: Any = None

    def as_item_error(self) -> dict[str, Any]:
        if self.kind == "mcp_tool_execution_error":
            return {"type": self.kind, "content": self.content}
        return {"type": self.kind, "code": self.code, "message": self.message}

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class McpSettings:
    """The security settings of the `mcp` tool (`ServerConfig.mcp_*`)."""

    allow: tuple[str, ...] = ()
    call_timeout: float = 30.0
    response_time: float = 300.0
    max_listing_bytes: int = 1024 * 1024
    max_result_bytes: int = 256 * 1024
    max_calls: int = 64
    max_calls_per_key: int = 8

    @classmethod
    def of(cls, config: ServerConfig) -> McpSettings:
        return cls(
            allow=config.mcp_allow,
            call_timeout=config.mcp_call_timeout,
            response_time=config.mcp_response_time,
            max_listing_bytes=config.mcp_max_listing_bytes,
            max_result_bytes=config.mcp_max_result_bytes,
            max_calls=config.mcp_max_calls,
            max_calls_per_key=config.mcp_max_calls_per_key,
        )

    def refusal(self, url: str) -> str | None:
        """Why a client may not name `url` (None: it may). An entry of `allow` is a URL
        prefix (`https://mcp.example.com/v1/`) or a host (`mcp.example.com`); nothing is
        allowed without one, loopback and private addresses included."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return f"server_url must be an http or https URL, got {url!r}."
        if parts.username or parts.password:
            return "server_url must not carry credentials: send them in headers."
        for entry in self.allow:
            if "://" in entry:
                if url == entry or url.startswith(entry.rstrip("/") + "/"):
                    return None
            elif parts.hostname == entry.lower():
                return None
        hint = " (a loopback, link-local or private address)" if _private(parts.hostname) else ""
        return (
            f"server_url {url!r}{hint} is not an MCP server this server may call: "
            "its operator names them with --mcp-allow."
        )


def _private(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost" or host.endswith(".localhost")
    return address.is_loopback or address.is_link_local or address.is_private


@dataclass(frozen=True)
class Listing:
    """An MCP server's tools as `mcp_list_tools` shows them, or why they are not."""

    server: McpServer
    tools: list[dict[str, Any]]
    error: McpError | None = None
    reused: bool = False
    """Listed earlier in the chain: no `mcp_list_tools` item again."""


@dataclass(frozen=True)
class Approval:
    """A call that waits for the client's `mcp_approval_response`: the response that
    asked, the server's label, the tool and its arguments."""

    response_id: str
    label: str
    name: str
    arguments: str


K = TypeVar("K")
V = TypeVar("V")


class Held(dict[K, V]):
    """What the process keeps for the next request of a chain, the oldest dropped past
    `MAX_HELD`: approval requests waiting for an answer (by API key and request id:
    another key's id finds nothing), listings (by API key, response id and label)."""

    MAX_HELD = 4096

    def hold(self, key: K, value: V) -> None:
        if len(self) >= self.MAX_HELD:
            del self[next(iter(self))]
        self[key] = value


Approvals = Held[tuple[str | None, str], Approval]
Listings = Held[tuple[str | None, str, str], Listing]


class McpClient:
    """The process's MCP calls: each opens its own session with the server's own
    headers (nothing is shared between keys or servers), under the bounds."""

    def __init__(self, settings: McpSettings) -> None:
        self.settings = settings
        self._calls = 0
        self._calls_of: dict[str | None, int] = {}
        self.approvals = Approvals()
        self.listings = Listings()
        self._tls: ssl.SSLContext | None = None
        """One TLS context for every session: making one loads the CA certificates,
        about 0.2 s of CPU that would stall the event loop at each call."""

    async def list_tools(self, server: McpServer) -> Listing:
        """The tools `server` offers (only its `allowed_tools`), within the call
        timeout and the listing's size bound."""
        try:
            result = await asyncio.wait_for(self._list(server), self.settings.call_timeout)
        except McpError as e:
            return Listing(server, [], e)
        except TimeoutError:
            return Listing(server, [], _timed_out("Listing the tools", self.settings.call_timeout))
        except Exception as e:  # any failure of a remote server is an error item
            return Listing(server, [], _failure(e))
        tools = [
            {
                "name": tool.name,
                "input_schema": tool.input_schema,
                "description": tool.description,
                "annotations": None
                if tool.annotations is None
                else tool.annotations.model_dump(exclude_none=True),
            }
            for tool in result.tools
            if server.allowed_tools is None or tool.name in server.allowed_tools
        ]
        size = len(orjson.dumps(tools))
        if size > self.settings.max_listing_bytes:
            error = McpError(
                "http_error",
                413,
                f"The tool listing is {size} bytes, above this server's limit of "
                f"{self.settings.max_listing_bytes} (--mcp-max-listing-bytes).",
            )
            return Listing(server, [], error)
        return Listing(server, tools)

    async def call(
        self, server: McpServer, name: str, arguments: str, principal: str | None, timeout: float
    ) -> str:
        """Call tool `name` with `arguments` (JSON text); its output as text. Raises
        McpError, never anything else."""
        settings = self.settings
        if self._calls >= settings.max_calls:
            raise McpError(
                "http_error", 429, f"{settings.max_calls} MCP calls are running on this server."
            )
        if self._calls_of.get(principal, 0) >= settings.max_calls_per_key:
            raise McpError(
                "http_error",
                429,
                f"{settings.max_calls_per_key} MCP calls of this API key are running.",
            )
        try:
            decoded = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError as e:
            raise McpError("mcp_protocol_error", -32602, f"arguments are not JSON: {e}") from e
        if not isinstance(decoded, dict):
            raise McpError("mcp_protocol_error", -32602, "arguments must be a JSON object.")
        self._calls += 1
        self._calls_of[principal] = self._calls_of.get(principal, 0) + 1
        try:
            return await self._call(server, name, decoded, min(timeout, settings.call_timeout))
        finally:
            self._calls -= 1
            left = self._calls_of.pop(principal) - 1
            if left:
                self._calls_of[principal] = left

    async def _call(
        self, server: McpServer, name: str, arguments: dict[str, Any], timeout: float
    ) -> str:
        limit = self.settings.max_result_bytes
        try:
            result = await asyncio.wait_for(self._call_tool(server, name, arguments), timeout)
        except McpError:
            raise
        except TimeoutError as e:
            raise _timed_out(f"The call of {name}", timeout) from e
        except Exception as e:  # any failure of a remote server is an error item
            raise _failure(e) from e
        content = [block.model_dump(mode="json", exclude_none=True) for block in result.content]
        if result.is_error:
            raise McpError("mcp_tool_execution_error", 0, f"{name} failed", content)
        text = "".join(
            block["text"] if block.get("type") == "text" else orjson.dumps(block).decode()
            for block in content
        )
        if len(text.encode()) > limit:
            raise McpError(
                "http_error",
                413,
                f"The output of {name} is {len(text.encode())} bytes, above this server's "
                f"limit of {limit} (--mcp-max-result-bytes).",
            )
        return text

    async def _list(self, server: McpServer) -> ListToolsResult:
        async with self._session(server, self.settings.max_listing_bytes) as client:
            return await client.list_tools()

    async def _call_tool(
        self, server: McpServer, name: str, arguments: dict[str, Any]
    ) -> CallToolResult:
        async with self._session(server, self.settings.max_result_bytes) as client:
            return await client.call_tool(name, arguments)

    @asynccontextmanager
    async def _session(self, server: McpServer, max_event: int) -> AsyncIterator[Client]:
        if self._tls is None:
            self._tls = await asyncio.to_thread(ssl.create_default_context)
        # Redirects: the transport follows one only within the server's own origin.
        http = httpx2.AsyncClient(
            headers=server.headers, timeout=self.settings.call_timeout, verify=self._tls
        )
        async with http:
            transport = streamable_http_client(
                server.url, http_client=http, max_sse_event_size=max_event + 64 * 1024
            )
            async with Client(transport, cache=None) as client:
                yield client


def _timed_out(what: str, seconds: float) -> McpError:
    return McpError("http_error", 504, f"{what} took longer than {seconds:g} s.")


def _failure(error: BaseException) -> McpError:
    """A remote failure as an error item; the exception's text never holds the headers
    (they are not part of a URL or of a JSON-RPC error)."""
    # anyio's task groups wrap a single failure in an exception group.
    while len(getattr(error, "exceptions", ())) == 1:
        error = error.exceptions[0]  # type: ignore[attr-defined]
    if isinstance(error, MCPError):
        return McpError("mcp_protocol_error", error.code, error.error.message)
    if isinstance(error, httpx2.HTTPStatusError):
        return McpError("http_error", error.response.status_code, str(error))
    log.info("MCP request failed: %r", error)
    return McpError("http_error", 502, f"The MCP server could not be used: {error}")
