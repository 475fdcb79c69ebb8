"""The MCP client's bounds and its allow-list (hotloop.mcp_client), against the tests'
MCP server (tests/mcp_server.py)."""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Iterator
from typing import Any

import pytest
from hotloop.mcp_client import McpClient, McpError, McpServer, McpSettings
from mcp_server import SEEN_PATHS, hostile_server, mcp_server


@pytest.fixture(scope="module")
def mcp_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with mcp_server(tmp_path_factory.mktemp("sandbox")) as url:
        yield url


def server(url: str) -> McpServer:
    return McpServer("tests", url, {}, None, "never")


def test_calls_past_the_per_key_and_process_bounds_are_refused(mcp_url: str) -> None:
    client = McpClient(McpSettings(allow=(mcp_url,), max_calls=2, max_calls_per_key=1))
    add = '{"a": 1, "b": 1}'

    async def calls() -> list[str | BaseException]:
        # Started in this order: each counts before its first wait, the next sees it.
        return await asyncio.gather(
            client.call(server(mcp_url), "add", add, "key-a", 5),
            client.call(server(mcp_url), "add", add, "key-a", 5),
            client.call(server(mcp_url), "add", add, "key-b", 5),
            client.call(server(mcp_url), "add", add, "key-c", 5),
            return_exceptions=True,
        )

    results = asyncio.run(calls())
    assert results[0] == "2.0" and results[2] == "2.0"
    for refused, bound in ((results[1], "of this API key"), (results[3], "on this server")):
        assert isinstance(refused, McpError) and refused.code == 429, refused
        assert bound in refused.message
    # Every call ended: the counts are back to zero, a new call runs.
    assert asyncio.run(client.call(server(mcp_url), "add", add, "key-a", 5)) == "2.0"


def test_listings_count_against_the_bounds_of_calls(mcp_url: str) -> None:
    """One request could list 512 servers at once (969 connections, the process at its
    open-file limit): a listing takes a place among the key's and the process's
    running calls, as a call does."""
    client = McpClient(McpSettings(allow=(mcp_url,), max_calls=2, max_calls_per_key=1))

    async def listings() -> tuple[Any, ...]:
        # Started in this order: each counts before its first wait, the next sees it.
        return await asyncio.gather(
            client.call(server(mcp_url), "add", '{"a": 1, "b": 1}', "key-a", 5),
            client.list_tools(server(mcp_url), "key-a"),
            client.list_tools(server(mcp_url), "key-b"),
            client.list_tools(server(mcp_url), "key-c"),
        )

    called, *listed = asyncio.run(listings())
    assert called == "2.0" and listed[1].error is None and listed[1].tools
    for refused, bound in ((listed[0], "of this API key"), (listed[2], "on this server")):
        assert refused.tools == [] and refused.error is not None, refused
        assert refused.error.code == 429 and bound in refused.error.message
    # Every listing ended: the counts are back to zero.
    assert asyncio.run(client.list_tools(server(mcp_url), "key-a")).error is None


@pytest.mark.parametrize("path", ["/huge", "/huge-error", "/gzip"])
def test_an_answer_is_read_up_to_its_bound_and_never_decompressed(path: str) -> None:
    """A listing answer of 64 MiB (as JSON, as the body of a 500, or as 64 KiB of gzip)
    took the process up by its size (gzip: a thousandfold) before the listing's bound
    was checked: it is read up to the bound only, and a compressed one not at all."""
    with hostile_server() as hostile:
        url = hostile + path
        settings = McpSettings(allow=(url,), max_listing_bytes=100_000)
        listing = asyncio.run(McpClient(settings).list_tools(server(url), None))
    error = listing.error
    assert listing.tools == [] and error is not None, listing
    if path == "/gzip":
        assert error.code == 502 and "Content-Encoding gzip" in error.message, error
        return
    assert error.code == 413, error
    stopped = re.search(r"reading stopped after (\d+) bytes", error.message)
    assert stopped is not None, error
    # The bound, and the piece that passed it (a read of the socket: 64 KiB at most).
    assert int(stopped.group(1)) <= settings.answer_bytes("tools/list") + 65536


def test_a_redirect_out_of_the_allowed_prefix_is_not_followed() -> None:
    """The transport follows a redirect within the server's origin: one to a path the
    allow list does not admit (`/admin/mcp` from `/escape`) is refused, not followed."""
    SEEN_PATHS.clear()
    with hostile_server() as hostile:
        url = hostile + "/escape"
        listing = asyncio.run(McpClient(McpSettings(allow=(url,))).list_tools(server(url), None))
    assert listing.error is not None and listing.error.code == 403, listing
    assert "/admin/mcp" in listing.error.message and "not allowed" in listing.error.message
    assert SEEN_PATHS and "/admin/mcp" not in SEEN_PATHS


def test_arguments_that_are_not_a_json_object_are_an_error_without_a_call() -> None:
    client = McpClient(McpSettings(allow=("127.0.0.1",)))
    for arguments in ("not json", "[1, 2]"):
        with pytest.raises(McpError) as refused:
            asyncio.run(client.call(server("http://127.0.0.1:9/mcp"), "add", arguments, None, 5))
        assert refused.value.kind == "mcp_protocol_error"


@pytest.mark.parametrize(
    ("allow", "url", "allowed"),
    [
        ((), "https://mcp.example.com/v1", False),
        (("mcp.example.com",), "https://mcp.example.com/v1", True),
        (("mcp.example.com",), "https://evil.example.com/v1", False),
        (("https://mcp.example.com/v1/",), "https://mcp.example.com/v1/tools", True),
        (("https://mcp.example.com/v1",), "https://mcp.example.com/v10", False),
        (("https://mcp.example.com/v1",), "https://mcp.example.com/v1", True),
        (("mcp.example.com",), "https://user:pw@mcp.example.com/", False),
        (("mcp.example.com",), "file:///etc/passwd", False),
        ((), "http://169.254.169.254/latest", False),
        (("127.0.0.1",), "http://127.0.0.1:8000/mcp", True),
        # Compared as requested: dot segments resolved (or refused, encoded), hosts and
        # default ports normalized.
        (("https://mcp.example.com/v1/",), "https://mcp.example.com/v1/../admin", False),
        (("https://mcp.example.com/v1/",), "https://mcp.example.com/v1/./tools", True),
        (("https://mcp.example.com/v1/",), "https://mcp.example.com/v1/%2e%2e/admin", False),
        (("https://mcp.example.com/v1/",), "https://mcp.example.com/v1/.%2E/admin", False),
        (("https://mcp.example.com/v1/",), "https://mcp.example.com/v1/..%2fadmin", False),
        (("https://mcp.example.com/v1/",), "https://MCP.example.com:443/v1/tools", True),
        (("https://mcp.example.com/v1/",), "https://mcp.example.com:8443/v1/tools", False),
    ],
)
def test_the_allow_list(allow: tuple[str, ...], url: str, allowed: bool) -> None:
    assert (McpSettings(allow=allow).refusal(url) is None) is allowed


def test_a_private_address_not_named_is_refused_as_such() -> None:
    refusal = McpSettings(allow=("mcp.example.com",)).refusal("http://10.0.0.5/mcp")
    assert refusal is not None and "private" in refusal


def test_sessions_share_one_tls_context(mcp_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Making a TLS context loads the CA certificates (about 0.2 s of CPU): once per
    call, it stalled the event loop that much at every MCP call."""
    made = []
    create = ssl.create_default_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(1)
        return create(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counted)
    client = McpClient(McpSettings(allow=(mcp_url,)))

    async def call() -> None:
        assert await client.call(server(mcp_url), "add", '{"a": 1, "b": 1}', None, 5) == "2.0"

    async def calls() -> None:
        # The first calls start together (each made its own before any had one), then
        # one after another.
        await asyncio.gather(*(call() for _ in range(4)))
        for _ in range(2):
            await call()

    asyncio.run(calls())
    assert len(made) == 1
