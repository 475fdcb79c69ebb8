"""The client side of remote MCP servers (the `mcp` tool): which servers a client may
name (`McpSettings.refusal`, the `--mcp-allow` list), and listing and calling their
tools over MCP's streamable HTTP transport from the `mcp` package, each bounded in
time, in size and in concurrency (per key and per process). Every HTTP request of a
session goes through its `Guard`: to an allowed URL only (redirects included), its
answer read up to a bound and never compressed.

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
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx2
import orjson
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ListToolsResult

from hotloop.config import ServerConfig

log = logging.getLogger("hotloop.mcp")

REDACTED = "[redacted]"
ENVELOPE = 64 * 1024
"""Bytes of an answer beyond what is kept of it (JSON-RPC framing, server metadata), and
the most read of an answer that carries no listing or result (discovery, errors)."""
DROPPED_HEADERS = frozenset(
    {
        # Hop-by-hop (RFC 9110 7.6.1): about one connection, not the server's business.
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        # Named by the URL (another virtual host of an allowed address is not allowed),
        # and the framing and encoding of the body, which are the client's own.
        "host",
        "content-length",
        "accept-encoding",
    }
)
"""Headers of an `mcp` tool's `headers` that are never sent."""


def sent_headers(headers: dict[str, str]) -> dict[str, str]:
    """An `mcp` tool's `headers` as they are sent: without `DROPPED_HEADERS`, nor any
    header their own `Connection` names."""
    named = {
        name.strip().lower()
        for key, value in headers.items()
        if key.lower() == "connection"
        for name in value.split(",")
    }
    return {
        key: value
        for key, value in headers.items()
        if key.lower() not in DROPPED_HEADERS and key.lower() not in named
    }


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


@dataclass(eq=False)
class McpError(Exception):
    """Why a listing or a call failed, as the OpenAI SDK's `McpToolCallError`: an
    `http_error` (with an HTTP-like code for hotloop's own bounds), an
    `mcp_protocol_error` or an `mcp_tool_execution_error`. Not frozen: raising it
    through a context manager sets its `__traceback__`."""

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
    max_servers: int = 8

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
            max_servers=config.mcp_max_servers,
        )

    def refusal(self, url: str) -> str | None:
        """Why a client may not name `url`, or a server send this client to it (None: it
        may). An entry of `allow` is a URL prefix (`https://mcp.example.com/v1/`) or a
        host (`mcp.example.com`); nothing is allowed without one, loopback and private
        addresses included. The URL is compared as it is requested (`normalized`)."""
        try:
            parsed = normalized(url)
        except ValueError as e:
            return f"server_url {url!r} cannot be used: {e}"
        normal = str(parsed)
        for entry in self.allow:
            if "://" in entry:
                prefix = str(httpx2.URL(entry))
                if normal == prefix or normal.startswith(prefix.rstrip("/") + "/"):
                    return None
            elif parsed.host == entry.lower():
                return None
        hint = " (a loopback, link-local or private address)" if _private(parsed.host) else ""
        return (
            f"server_url {url!r}{hint} is not an MCP server this server may call: "
            "its operator names them with --mcp-allow."
        )

    def answer_bytes(self, method: str | None) -> int:
        """The most read of the answer to a JSON-RPC `method`: twice what may be kept of
        it (a result comes as `content` and again as `structuredContent`, a listing with
        output schemas that are not kept), plus the `ENVELOPE`."""
        kept = {"tools/list": self.max_listing_bytes, "tools/call": self.max_result_bytes}
        return 2 * kept.get(method or "", 0) + ENVELOPE


def normalized(url: str) -> httpx2.URL:
    """`url` as the client requests it (scheme and host in lower case, a default port
    left out, `.` and `..` segments resolved, no fragment). Raises ValueError for one
    that is not http(s), carries credentials, or whose path still has a dot segment
    or a backslash once percent-decoded (a server that decodes before it resolves
    them would leave the allowed prefix)."""
    try:
        parsed = httpx2.URL(url)
    except httpx2.InvalidURL as e:
        raise ValueError(str(e)) from e
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError("it must be an http or https URL")
    if parsed.userinfo:
        raise ValueError("it must not carry credentials: send them in headers")
    segments = parsed.path.split("/")
    if "." in segments or ".." in segments or "\\" in parsed.path:
        raise ValueError("its path has an encoded dot segment or a backslash")
    return parsed.copy_with(fragment=None)


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
    """The process's MCP listings and calls: each opens its own session with the
    server's own headers (nothing is shared between keys or servers), under the bounds."""

    def __init__(self, settings: McpSettings) -> None:
        self.settings = settings
        self._running = 0
        self._running_of: dict[str | None, int] = {}
        self.approvals = Approvals()
        self.listings = Listings()
        self._tls: ssl.SSLContext | None = None
        """One TLS context for every session, made once on a thread (`_tls_context`):
        making one loads the CA certificates, about 0.2 s of CPU that would stall the
        event loop at each call."""
        self._making_tls = threading.Lock()

    async def list_tools(self, server: McpServer, principal: str | None) -> Listing:
        """The tools `server` offers (only its `allowed_tools`), within the call
        timeout, the listing's size bound and the bounds on what runs at once."""
        try:
            async with self._slot(principal):
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
        try:
            decoded = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError as e:
            raise McpError("mcp_protocol_error", -32602, f"arguments are not JSON: {e}") from e
        if not isinstance(decoded, dict):
            raise McpError("mcp_protocol_error", -32602, "arguments must be a JSON object.")
        async with self._slot(principal):
            return await self._call(server, name, decoded, min(timeout, self.settings.call_timeout))

    @asynccontextmanager
    async def _slot(self, principal: str | None) -> AsyncIterator[None]:
        """One listing or call running, counted for its key and in the process; refused
        (429) past either bound."""
        settings = self.settings
        if self._running >= settings.max_calls:
            raise McpError(
                "http_error",
                429,
                f"{settings.max_calls} MCP listings and calls are running on this server.",
            )
        if self._running_of.get(principal, 0) >= settings.max_calls_per_key:
            raise McpError(
                "http_error",
                429,
                f"{settings.max_calls_per_key} MCP listings and calls of this API key are running.",
            )
        self._running += 1
        self._running_of[principal] = self._running_of.get(principal, 0) + 1
        try:
            yield
        finally:
            self._running -= 1
            left = self._running_of.pop(principal) - 1
            if left:
                self._running_of[principal] = left

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
        async with self._session(server) as client:
            return await client.list_tools()

    async def _call_tool(
        self, server: McpServer, name: str, arguments: dict[str, Any]
    ) -> CallToolResult:
        async with self._session(server) as client:
            return await client.call_tool(name, arguments)

    def _tls_context(self) -> ssl.SSLContext:
        # Sessions that start together wait here for the first one's context instead of
        # each making its own (a stampede of CA loads at the first calls).
        with self._making_tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            return self._tls

    @asynccontextmanager
    async def _session(self, server: McpServer) -> AsyncIterator[Client]:
        """A session with `server`; a failure the session's `GuardedHttp` caused is raised
        as its own McpError (the `mcp` transport turns a failed request into errors of
        its own, some of them a bare "stream ended")."""
        tls = self._tls or await asyncio.to_thread(self._tls_context)
        # Redirects: the transport follows one only within the server's own origin, the
        # guard only to a URL the allow list admits.
        http = GuardedHttp(
            self.settings,
            headers={**server.headers, "Accept-Encoding": "identity"},
            timeout=self.settings.call_timeout,
            verify=tls,
        )
        try:
            async with http:
                # The guard bounds each answer whole: no bound per SSE event on top.
                transport = streamable_http_client(
                    server.url, http_client=http, max_sse_event_size=None
                )
                async with Client(transport, cache=None) as client:
                    yield client
        except Exception as e:
            if http.error is not None:
                raise http.error from e
            raise


class Refused(httpx2.TransportError):
    """A request or an answer `GuardedHttp` stopped (its McpError is the client's)."""


BOUND_SETTINGS = {"tools/list": "--mcp-max-listing-bytes", "tools/call": "--mcp-max-result-bytes"}


class GuardedHttp(httpx2.AsyncClient):
    """The HTTP client of one MCP session. Every request it sends (each redirect the
    `mcp` transport follows is one) goes to a URL the allow list admits, and its answer
    is read up to `McpSettings.answer_bytes` of the JSON-RPC method it answers, counted
    as it arrives, never compressed (gzip is a thousandfold in memory): what the server
    sends past the bound is never read. `error`: the first thing it stopped."""

    def __init__(self, settings: McpSettings, **options: Any) -> None:
        super().__init__(**options)
        self.settings = settings
        self.error: McpError | None = None

    def refused(self, error: McpError) -> Refused:
        if self.error is None:
            self.error = error
        return Refused(error.message)

    async def send(self, request: httpx2.Request, **options: Any) -> httpx2.Response:
        stream = options.pop("stream", False)
        refusal = self.settings.refusal(str(request.url))
        if refusal is not None:
            location = request.url.copy_with(query=None, fragment=None)
            message = f"The MCP server sent this request to {location}, which is not allowed: "
            raise self.refused(McpError("http_error", 403, message + refusal))
        method = _method(request)
        limit = self.settings.answer_bytes(method)
        response = await super().send(request, stream=True, **options)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        length = response.headers.get("content-length", "")
        error = None
        if encoding != "identity":
            error = McpError(
                "http_error",
                502,
                f"The MCP server answered with Content-Encoding {encoding}, though asked for "
                "identity: compressed answers are not read.",
            )
        elif length.isdigit() and int(length) > limit:
            error = _too_long(method, limit, f"its Content-Length is {length}: not read")
        if error is not None:
            await response.aclose()
            raise self.refused(error)
        assert isinstance(response.stream, httpx2.AsyncByteStream), "an async transport's"
        response.stream = BoundedAnswer(response.stream, self, method, limit)
        if not stream:
            await response.aread()
        return response


class BoundedAnswer(httpx2.AsyncByteStream):
    """An answer's bytes as they arrive, stopped past `limit`."""

    def __init__(
        self, stream: httpx2.AsyncByteStream, http: GuardedHttp, method: str | None, limit: int
    ) -> None:
        self.stream = stream
        self.http = http
        self.method = method
        self.limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        async for chunk in self.stream:
            read += len(chunk)
            if read > self.limit:
                stopped = f"reading stopped after {read} bytes"
                raise self.http.refused(_too_long(self.method, self.limit, stopped))
            yield chunk

    async def aclose(self) -> None:
        await self.stream.aclose()


def _method(request: httpx2.Request) -> str | None:
    """The JSON-RPC method a request sends (None: none, as the transport's GET)."""
    try:
        message = orjson.loads(request.content) if request.content else None
    except orjson.JSONDecodeError:
        return None
    method = message.get("method") if isinstance(message, dict) else None
    return method if isinstance(method, str) else None


def _too_long(method: str | None, limit: int, what: str) -> McpError:
    setting = BOUND_SETTINGS.get(method or "")
    why = f" ({setting})" if setting else ""
    return McpError(
        "http_error",
        413,
        f"The MCP server's answer to {method or 'a request'} is longer than {limit} bytes, "
        f"the most read of it{why}: {what}.",
    )


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
