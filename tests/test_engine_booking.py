"""Issue 21 defect 2: whatever the engine processed is booked to the key that asked, on
every path. A client that leaves after its prompt was prefilled and tokens were streaming
(WebSocket, SSE, plain HTTP) used to book 0 tokens and no turn; `/v1/responses/compact`
booked nothing at all. A real server (uvicorn, sim engine); the test waits for the
booking itself, never for time."""

from __future__ import annotations

import socket
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
from hotloop.config import ServerConfig
from hotloop.engines.base import Sampling
from hotloop.engines.sim import SimScript, SimSession, SimSpeed
from hotloop.transport import App
from servers import HANG_GUARD, serving, sim_engine
from websockets.sync.client import connect

KEY = "sk-booked"
HEADERS = {"authorization": f"Bearer {KEY}"}
# About 20 s of output at 50 tokens a second: every client below leaves long before.
SLOW = SimSpeed(tokens_per_second=50.0, ttft=0.0, prefill_tokens_per_second=1e9)
LONG = SimScript(text=" ".join(f"word{i}" for i in range(500)))


class Served:
    """A server whose engine says when it has sampled, and whose ledger says when it
    booked."""

    def __init__(self, app: App, base: str) -> None:
        self.app = app
        self.base = base
        self.sampling = threading.Event()
        self.booked = threading.Event()

    def usage(self) -> dict[str, Any]:
        reply = httpx.get(self.base + "/v1/usage", headers=HEADERS)
        assert reply.status_code == 200
        totals: dict[str, Any] = reply.json()
        return totals

    def turns(self, transport: str, outcome: str) -> int:
        line = f'hotloop_turns_total{{transport="{transport}",outcome="{outcome}"}} '
        for row in httpx.get(self.base + "/metrics").text.splitlines():
            if row.startswith(line):
                return int(float(row[len(line) :]))
        return 0


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    settings = ServerConfig(engine="sim", api_keys=(KEY,))
    app = App.from_config(settings, sim_engine(LONG, SLOW))
    ledger = app.ledger
    assert ledger is not None
    with serving(app) as base:
        server = Served(app, base)
        generate = SimSession.generate

        async def sampled(
            session: SimSession, prompt: Any, sampling: Sampling, route_key: str | None = None
        ) -> AsyncIterator[list[int]]:
            async for ids in generate(session, prompt, sampling, route_key):
                yield ids
                server.sampling.set()

        monkeypatch.setattr(SimSession, "generate", sampled)
        record = ledger.usage.record

        def booked(key: str | None, **tokens: int) -> None:
            record(key, **tokens)
            server.booked.set()

        monkeypatch.setattr(ledger.usage, "record", booked)
        yield server


def assert_booked_mid_turn(served: Served, transport: str) -> None:
    assert served.booked.wait(HANG_GUARD)
    usage = served.usage()
    assert usage["responses"] == 1
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert served.turns(transport, "cancelled") == 1


def test_a_websocket_client_that_leaves_mid_turn_is_booked(served: Served) -> None:
    url = served.base.replace("http://", "ws://") + "/v1/responses"
    with connect(url, additional_headers=HEADERS) as ws:
        ws.send(orjson.dumps({"type": "response.create", "model": "sim", "input": "talk"}).decode())
        while "response.output_text.delta" not in str(ws.recv(timeout=HANG_GUARD)):
            pass
    assert_booked_mid_turn(served, "websocket")


def test_an_sse_client_that_leaves_mid_stream_is_booked(served: Served) -> None:
    body = {"model": "sim", "input": "talk", "stream": True}
    with httpx.stream("POST", served.base + "/v1/responses", json=body, headers=HEADERS) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: ") and "response.output_text.delta" in line:
                break
    assert_booked_mid_turn(served, "http")


def test_a_plain_http_client_that_leaves_mid_turn_is_booked(served: Served) -> None:
    body = orjson.dumps({"model": "sim", "input": "talk"})
    host, port = served.base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as client:
        client.sendall(
            b"POST /v1/responses HTTP/1.1\r\nhost: hotloop\r\ncontent-type: application/json\r\n"
            + f"authorization: Bearer {KEY}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        # The prompt is prefilled and tokens stream (nothing is sent before the end).
        assert served.sampling.wait(HANG_GUARD)
    assert_booked_mid_turn(served, "http")


def test_a_compaction_is_booked() -> None:
    settings = ServerConfig(engine="sim", api_keys=(KEY,))
    with serving(App.from_config(settings, sim_engine())) as base:
        conversation = [{"role": "user", "content": "We launch on Tuesday."}]
        reply = httpx.post(
            base + "/v1/responses/compact",
            json={"model": "sim", "input": conversation},
            headers=HEADERS,
        )
        assert reply.status_code == 200, reply.text
        spent = reply.json()["usage"]
        # Booked on the loop's next turn, before the next request is read.
        usage = httpx.get(base + "/v1/usage", headers=HEADERS).json()
    assert usage["responses"] == 1
    assert usage["input_tokens"] == spent["input_tokens"] > 0
    assert usage["output_tokens"] == spent["output_tokens"] > 0


def test_a_prewarm_is_booked() -> None:
    """`prompt_cache_options.prewarm`: the engine prefilled the prompt, so the key is
    booked its input tokens (it booked none when a warm-up never reached the engine)."""
    settings = ServerConfig(engine="sim", api_keys=(KEY,))
    with serving(App.from_config(settings, sim_engine())) as base:
        body = {"model": "sim", "input": "Warm me.", "prompt_cache_options": {"prewarm": True}}
        reply = httpx.post(base + "/v1/responses", json=body, headers=HEADERS)
        assert reply.status_code == 200, reply.text
        spent = reply.json()["usage"]
        # Booked on the loop's next turn, before the next request is read.
        usage = httpx.get(base + "/v1/usage", headers=HEADERS).json()
    assert usage["responses"] == 1
    assert usage["input_tokens"] == spent["input_tokens"] > 0
    assert usage["output_tokens"] == 0
