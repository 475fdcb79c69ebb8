"""Admission control (hotloop.transport.admission and the per-key cap of the app): a
connection that does not finish its headers is answered 408 and closed, a connection
over the process's cap gets 503 with a JSON error and `retry-after`, an API key over
its WebSocket cap gets 429 before the upgrade is accepted, and `hotloop serve` raises
its open-files limit to the hard limit. Against real servers on loopback."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import orjson
import pytest
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimScript, SimSpeed
from hotloop.transport import App
from hotloop.transport.admission import BodyPieces
from servers import HANG_GUARD, serving, sim_engine
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

KEYS = ("sk-a", "sk-b")


def app(tmp_path: Path, **config: object) -> object:
    return App.from_config(
        ServerConfig(engine="sim", api_keys=KEYS, data_dir=str(tmp_path), **config), sim_engine()
    )


def raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=HANG_GUARD)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def split(reply: bytes) -> tuple[str, dict[str, str], dict[str, object]]:
    head, _, body = reply.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines)
    return status, headers, orjson.loads(body)


@pytest.fixture
def tight(tmp_path: Path) -> Iterator[str]:
    with serving(app(tmp_path, header_timeout=0.2)) as url:
        yield url


def test_unfinished_headers_are_answered_408_and_closed(tight: str) -> None:
    """Before, the connection stayed open for as long as the client kept it."""
    with raw(tight) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        status, headers, body = split(read_all(sock))
    assert status.startswith("HTTP/1.1 408")
    assert headers["connection"] == "close"
    assert body["error"]["code"] == "header_timeout"  # type: ignore[index]
    metrics = httpx.get(tight + "/metrics").text
    assert 'hotloop_refusals_total{code="header_timeout"} 1' in metrics


def test_a_silent_connection_is_closed_too(tight: str) -> None:
    with raw(tight) as sock:
        assert split(read_all(sock))[0].startswith("HTTP/1.1 408")


def test_a_kept_alive_connection_gets_the_deadline_for_each_request(tight: str) -> None:
    with raw(tight) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finished
        assert split(read_all(sock))[0].startswith("HTTP/1.1 408")


def test_a_late_pipelined_request_never_cuts_the_response_before_it(tmp_path: Path) -> None:
    """A stream still going out when the next pipelined request's headers are late:
    the deadline ends the connection after the stream, never with a 408 inside it."""
    slow = SimSpeed(tokens_per_second=100.0, ttft=0.0, prefill_tokens_per_second=1e9)
    text = " ".join(f"word{i}" for i in range(100))  # about a second at this speed
    config = ServerConfig(engine="sim", api_keys=KEYS, data_dir=str(tmp_path), header_timeout=0.2)
    with serving(App.from_config(config, sim_engine(SimScript(text=text), slow))) as url:
        body = b'{"model":"sim","input":"hi","stream":true,"store":false}'
        with raw(url) as sock:
            sock.sendall(
                b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-a\r\n"
                b"Content-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
                + b"GET /health HTTP/1.1\r\nHost: x\r\n"  # never finished
            )
            reply = read_all(sock)
    stream, _, after = reply.partition(b"\r\n0\r\n\r\n")  # the last chunk
    assert stream.startswith(b"HTTP/1.1 200")
    assert b"event: response.completed" in stream
    assert b"HTTP/1.1 408" not in stream
    assert after == b"" or after.startswith(b"HTTP/1.1 408")


def test_connections_over_the_cap_get_503_with_retry_after(tmp_path: Path) -> None:
    with (
        serving(app(tmp_path, max_connections=4, header_timeout=HANG_GUARD)) as url,
        ExitStack() as held,
    ):
        # The server accepts in order: these four are counted before the fifth.
        for _ in range(4):
            held.enter_context(raw(url)).sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        with raw(url) as sock:
            status, headers, body = split(read_all(sock))
    assert status.startswith("HTTP/1.1 503")
    assert headers["retry-after"] == "1"
    assert body["error"]["code"] == "server_overloaded"  # type: ignore[index]
    assert body["error"]["type"] == "server_error"  # type: ignore[index]


def test_one_key_is_capped_in_websockets_another_is_not(tmp_path: Path) -> None:
    with serving(app(tmp_path, max_connections_per_key=2)) as url:
        ws_url = url.replace("http://", "ws://") + "/v1/responses"
        auth = {"authorization": "Bearer sk-a"}
        with connect(ws_url, additional_headers=auth), connect(ws_url, additional_headers=auth):
            with pytest.raises(InvalidStatus) as refused:
                connect(ws_url, additional_headers=auth)
            response = refused.value.response
            assert response.status_code == 429
            assert response.headers["retry-after"] == "1"
            error = orjson.loads(response.body)["error"]
            assert error["code"] == "too_many_connections"
            assert error["type"] == "rate_limit_error"
            with connect(ws_url, additional_headers={"authorization": "Bearer sk-b"}):
                pass
        metrics = httpx.get(url + "/metrics").text
        assert 'hotloop_refusals_total{code="too_many_connections"} 1' in metrics
        # Closed sockets give their places back.
        with connect(ws_url, additional_headers=auth):
            pass


def test_serve_raises_the_open_files_limit_to_the_hard_limit() -> None:
    """In a child whose soft limit was lowered first (this process is left alone)."""
    script = (
        "import resource\n"
        "from hotloop.transport.admission import raise_open_files_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "before, after = raise_open_files_limit()\n"
        "print(before, after, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    before, after, now, hard = (int(v) for v in out.split())
    assert before == 256
    assert after == now == min(hard, 1 << 20) and now > before


@pytest.mark.parametrize(
    "option", ["header_timeout", "keep_alive_timeout", "max_connections", "max_connections_per_key"]
)
def test_the_limits_are_options(option: str) -> None:
    value = ServerConfig.from_env({"HOTLOOP_" + option.upper(): "7"})
    assert getattr(value, option) == 7


def test_a_body_read_in_many_pieces_is_the_body_sent(tmp_path: Path) -> None:
    """A body of megabytes comes off the socket in many reads; it is kept as its pieces
    (`BodyPieces`) and joined once: the stored input is exactly the items sent, in
    order (their JSON read from the body itself, not a copy of it)."""
    items = [
        {"type": "message", "role": "user", "content": f"{n}: " + "pieces " * 20_000}
        for n in range(24)
    ]
    body = orjson.dumps({"model": "sim", "input": items, "store": True})
    assert len(body) > 3_000_000
    headers = {"Authorization": "Bearer sk-a", "Content-Type": "application/json"}
    with serving(app(tmp_path)) as url, httpx.Client(base_url=url, timeout=HANG_GUARD) as client:
        reply = client.post("/v1/responses", content=body, headers=headers)
        assert reply.status_code == 200, reply.text
        listed = client.get(
            f"/v1/responses/{reply.json()['id']}/input_items",
            params={"order": "asc", "limit": 100},
            headers=headers,
        ).json()["data"]
    assert [item["content"][0]["text"] for item in listed] == [i["content"] for i in items]


def test_body_pieces_are_joined_once_and_a_lone_piece_is_not_copied() -> None:
    piece = bytes(300_000)
    pieces = BodyPieces()
    pieces += piece
    assert len(pieces) == len(piece) and bytes(pieces) is piece
    pieces += b"more"
    assert bytes(pieces) == piece + b"more" and len(pieces) == len(piece) + 4
