"""Attacks through HTTP request bodies (issue 21, defect 1), and the legitimate client
still served: a body that never arrives holds no connection for long, whether or not
its request was answered first; a key's HTTP requests in progress count in its
connection cap like its WebSockets. The first attack runs against a real `hotloop
serve` process, the others against the same protocol on an in-process server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import orjson
import pytest
from hotloop.auth import key_id
from hotloop.config import ServerConfig
from hotloop.store import PAGE_CHUNK_BYTES
from hotloop.store.items import listed_items, page_of
from hotloop.transport import App
from hotloop_process import HotloopProcess
from servers import HANG_GUARD, serving, sim_engine
from test_store import response

KEYS = ("sk-a", "sk-b")
ATTACKERS = 20
SLOW_BODY = (
    b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000000\r\n"
)


def raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=HANG_GUARD)


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One response's status and body (its `content-length`), leaving the connection
    as the server left it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, body
        body += chunk
    return int(lines[0].split()[1]), body


def read_to_end(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def slow_body(sock: socket.socket, key: str | None, *extra: bytes) -> None:
    """Complete headers announcing a megabyte, then one byte of it."""
    auth = b"" if key is None else b"Authorization: Bearer " + key.encode() + b"\r\n"
    sock.sendall(SLOW_BODY + auth + b"".join(extra) + b"\r\n{")


def test_unauthenticated_slow_bodies_never_shut_out_the_legitimate_client(
    tmp_path: Path,
) -> None:
    """Before: each 401 left its connection open with no timer (one byte at a time kept
    it), every place of the process was held and `GET /health` got 503."""
    args = [
        "--engine=sim",
        "--sim-ttft=0",
        "--api-keys=" + ",".join(KEYS),
        f"--max-connections={ATTACKERS}",
        "--data-dir=" + str(tmp_path),
    ]
    with HotloopProcess(args) as server, ExitStack() as held:
        attackers = [held.enter_context(raw(server.url)) for _ in range(ATTACKERS)]
        for sock in attackers:
            slow_body(sock, None)
        for sock in attackers:
            status, body = read_response(sock)
            assert status == 401, body
        # Every place is held by a connection whose body nobody reads: each gives it up.
        with httpx.Client(base_url=server.url, timeout=HANG_GUARD) as client:
            assert client.get("/health").status_code == 200
            answer = client.post(
                "/v1/responses",
                json={"model": "sim", "input": "hi", "store": False},
                headers={"authorization": "Bearer sk-b"},
            )
            assert answer.status_code == 200, answer.text
        # Each attacker was told the connection is over (a half-close after the 401).
        for sock in attackers:
            assert read_to_end(sock) == b""


def test_an_answer_before_the_body_is_read_says_connection_close(tmp_path: Path) -> None:
    """Before: a 401 (or 413, 429) answered from the headers promised nothing about the
    connection, which the server then ends (the body is never read): a client sent its
    next request on it and lost it. Now the answer says `connection: close`."""
    with serving(app(tmp_path)) as url, raw(url) as sock:
        slow_body(sock, None)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(65536)
            assert chunk, head
            head += chunk
    lines = head.partition(b"\r\n\r\n")[0].decode().lower().split("\r\n")
    assert lines[0].split()[1] == "401"
    assert "connection: close" in lines[1:]


def app(tmp_path: Path, **config: object) -> object:
    return App.from_config(
        ServerConfig(engine="sim", api_keys=KEYS, data_dir=str(tmp_path), **config), sim_engine()
    )


@pytest.fixture
def strict(tmp_path: Path) -> Iterator[str]:
    with serving(app(tmp_path, body_timeout=0.2, min_body_rate=1000.0)) as url:
        yield url


def test_an_authenticated_body_slower_than_the_rate_gets_408(strict: str) -> None:
    """Before: with a valid key, the server waited for the rest of the body forever."""
    with raw(strict) as sock:
        slow_body(sock, "sk-a")
        status, body = read_response(sock)
        assert status == 408
        assert orjson.loads(body)["error"]["code"] == "body_timeout"
        assert read_to_end(sock) == b""
    metrics = httpx.get(strict + "/metrics").text
    assert 'hotloop_refusals_total{code="body_timeout"} 1' in metrics


def test_a_body_at_the_rate_is_read_whole(strict: str) -> None:
    """The deadline grows with what arrives: a body sent in pieces, each well within
    the time the bytes before it earned, is served."""
    payload = orjson.dumps({"model": "sim", "input": "x" * 4000, "store": False})
    with raw(strict) as sock:
        sock.sendall(
            b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-a\r\n"
            b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n"
        )
        for start in range(0, len(payload), 1000):
            sock.sendall(payload[start : start + 1000])
        status, body = read_response(sock)
    assert status == 200, body


def test_http_requests_in_progress_count_in_the_key_cap(tmp_path: Path) -> None:
    """Before: only WebSockets counted, so one key could hold every place with bodies."""
    with serving(app(tmp_path, max_connections_per_key=2)) as strict, ExitStack() as held:
        for _ in range(2):
            sock = held.enter_context(raw(strict))
            # `Expect: 100-continue`: the server says "go on" once the app reads the body.
            slow_body(sock, "sk-a", b"Expect: 100-continue\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 100")
        refused = httpx.get(strict + "/v1/models", headers={"authorization": "Bearer sk-a"})
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "too_many_connections"
        other = httpx.get(strict + "/v1/models", headers={"authorization": "Bearer sk-b"})
        assert other.status_code == 200


async def test_one_keys_store_reads_take_a_bounded_share(tmp_path: Path) -> None:
    """Issue 21: sixteen concurrent 15 MB `input_items` reads of one key queued ahead of
    another key's read in the store's reader (2 ms became 878 ms). Now a key runs at
    most `--max-reads-per-key` store reads at once; the others wait their turn."""
    served = app(tmp_path, max_reads_per_key=2)
    await served.start()  # type: ignore[attr-defined]
    entered: list[str] = []
    two_in = asyncio.Event()
    release = asyncio.Event()

    async def reading(response_id: str, owner: str | None, **page: object) -> None:
        entered.append(response_id)
        if response_id == "resp_a":
            if entered.count("resp_a") == 2:
                two_in.set()
            await release.wait()

    served.ledger.store.list_input_items = reading  # type: ignore[attr-defined]
    transport = httpx.ASGITransport(app=served)  # type: ignore[arg-type]
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:

            async def read(response_id: str, key: str) -> int:
                path = f"/v1/responses/{response_id}/input_items"
                reply = await client.get(path, headers={"authorization": f"Bearer {key}"})
                return reply.status_code

            attack = [asyncio.ensure_future(read("resp_a", "sk-a")) for _ in range(16)]
            await two_in.wait()
            assert await read("resp_b", "sk-b") == 404  # served while sk-a's reads wait
            assert entered.count("resp_a") == 2
            release.set()
            assert await asyncio.gather(*attack) == [404] * 16
            assert entered.count("resp_a") == 16
    finally:
        await served.close()  # type: ignore[attr-defined]


async def test_a_large_input_items_page_is_written_in_pieces_of_its_stored_bytes(
    tmp_path: Path,
) -> None:
    """Issue 21 (minor): a 6 MB page was parsed on a reader thread, serialized again on
    the event loop and written in one piece, all holding the loop from another key's
    GET. Now its stored item bytes are joined into pieces of at most `PAGE_CHUNK_BYTES`
    (a larger item alone, as stored) and written one at a time; the page is the same."""
    served = app(tmp_path)
    await served.start()  # type: ignore[attr-defined]
    item = {"role": "user", "content": "x" * 60_000}
    items = [item] * 50 + [{"role": "user", "content": f"item {n}"} for n in range(2_000)]
    owner = key_id("sk-a")
    try:
        store = served.ledger.store  # type: ignore[attr-defined]
        await store.put(response("resp_big", owner=owner, items=items))
        messages: list[dict[str, object]] = []

        async def receive() -> dict[str, object]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, object]) -> None:
            messages.append(message)

        scope = {
            "type": "http",
            "method": "GET",
            "path": "/v1/responses/resp_big/input_items",
            "query_string": b"limit=100&order=asc",
            "headers": [(b"authorization", b"Bearer sk-a")],
        }
        await served(scope, receive, send)  # type: ignore[operator]
    finally:
        await served.close()  # type: ignore[attr-defined]
    start, *bodies = messages
    assert start["status"] == 200
    pieces = [message["body"] for message in bodies]
    assert all(isinstance(piece, bytes) for piece in pieces)
    # Items joined into pieces of PAGE_CHUNK_BYTES or more: each less than two of that
    # (no item here is larger), about 25 for the 3 MB page.
    body = b"".join(pieces)  # type: ignore[arg-type]
    assert max(len(piece) for piece in pieces) < 2 * PAGE_CHUNK_BYTES  # type: ignore[arg-type]
    assert len(pieces) > len(body) // (2 * PAGE_CHUNK_BYTES)
    assert dict(start["headers"])[b"content-length"] == str(len(body)).encode()  # type: ignore[call-overload]
    listed = listed_items("resp_big", orjson.dumps(items))
    expected, has_more = page_of(listed, ascending=True, limit=100, after=None)
    assert orjson.loads(body) == {
        "object": "list",
        "data": expected,
        "first_id": expected[0]["id"],
        "last_id": expected[-1]["id"],
        "has_more": has_more,
    }
