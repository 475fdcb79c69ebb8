"""The MCP client's bounds and its allow-list (hotloop.mcp_client), against the tests'
MCP server (tests/mcp_server.py)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from typing import Any

import pytest
from hotloop.mcp_client import McpClient, McpError, McpServer, McpSettings
from mcp_server import mcp_server


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

    async def calls() -> None:
        for _ in range(3):
            assert await client.call(server(mcp_url), "add", '{"a": 1, "b": 1}', None, 5) == "2.0"

    asyncio.run(calls())
    assert len(made) == 1
