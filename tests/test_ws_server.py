"""WebSocket mode over a real socket (uvicorn + websockets-sansio), spoken with a raw
`websockets` client: upgrade, auth, 426, frames, lanes, cancel, disconnect, ping."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hotloop.engines.sim import SimScript, SimSpeed
from sdk_events import validate
from servers import hotloop_server
from websockets.exceptions import ConnectionClosedOK, InvalidStatus
from websockets.sync.client import ClientConnection, connect

TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with hotloop_server(api_keys=("sk-test",)) as base:
        yield base.replace("http://", "ws://") + "/v1/responses"


def open_socket(url: str, key: str | None = "sk-test") -> ClientConnection:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return connect(url, additional_headers=headers, max_size=None)


def send(ws: ClientConnection, event: dict[str, Any]) -> None:
    ws.send(orjson.dumps(event).decode())


def until_terminal(ws: ClientConnection) -> list[dict[str, Any]]:
    frames = []
    while True:
        frame = validate(ws.recv())
        frames.append(frame)
        if frame["type"] in TERMINAL:
            return frames


def test_turn_and_continuation(url: str) -> None:
    with open_socket(url) as ws:
        send(ws, {"type": "response.create", "model": "sim", "input": "hi", "stream": True})
        first = until_terminal(ws)
        assert first[-1]["type"] == "response.completed"
        response_id = first[-1]["response"]["id"]
        send(
            ws,
            {
                "type": "response.create",
                "model": "sim",
                "input": "again",
                "previous_response_id": response_id,
            },
        )
        second = until_terminal(ws)[-1]["response"]
        assert second["usage"]["input_tokens_details"]["cached_tokens"] > 0
        assert second["model"] == "sim"


def test_auth_refuses_the_upgrade_with_401_json(url: str) -> None:
    # The codes and header parsing are the HTTP routes' (one `ApiKeys` for both).
    for headers, code in (
        ({}, "missing_api_key"),
        ({"Authorization": "Bearer sk-wrong"}, "invalid_api_key"),
        ({"Authorization": "Basic sk-test"}, "invalid_api_key"),
    ):
        with pytest.raises(InvalidStatus) as refused:
            connect(url, additional_headers=headers)
        response = refused.value.response
        assert response.status_code == 401
        body = orjson.loads(response.body or b"{}")
        assert body["error"]["type"] == "authentication_error"
        assert body["error"]["code"] == code
    with connect(url, additional_headers={"Authorization": "bearer  sk-test "}) as ws:
        send(ws, {"type": "response.create", "model": "sim", "input": "hi"})
        assert until_terminal(ws)[-1]["type"] == "response.completed"


def test_websocket_mode_off_gives_426() -> None:
    with hotloop_server(websocket=False) as base:
        with pytest.raises(InvalidStatus) as refused:
            connect(base.replace("http://", "ws://") + "/v1/responses")
        assert refused.value.response.status_code == 426


def test_bad_input_keeps_the_socket_and_other_sockets_usable(url: str) -> None:
    with open_socket(url) as ws, open_socket(url) as other:
        ws.send("{oops")
        assert validate(ws.recv())["error"]["code"] == "invalid_json"
        ws.send(b"\x00binary")
        assert validate(ws.recv())["error"]["code"] == "binary_frame_not_supported"
        send(ws, {"type": "nope"})
        assert validate(ws.recv())["error"]["code"] == "unknown_event_type"
        send(
            ws,
            {
                "type": "response.create",
                "model": "sim",
                "input": "x",
                "previous_response_id": "resp_x",
            },
        )
        assert validate(ws.recv())["error"]["code"] == "previous_response_not_found"
        send(ws, {"type": "response.create", "model": "sim", "input": "x", "background": True})
        assert validate(ws.recv())["status"] == 400
        send(ws, {"type": "response.create", "model": "sim", "input": "x", "stream_id": "bad id"})
        assert validate(ws.recv())["error"]["code"] == "invalid_stream_id"
        send(ws, {"type": "response.create", "model": "sim", "input": "x"})
        parent = until_terminal(ws)[-1]["response"]["id"]
        stray = [{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]
        send(
            ws,
            {
                "type": "response.create",
                "model": "sim",
                "input": stray,
                "previous_response_id": parent,
            },
        )
        refused = validate(ws.recv())
        assert refused["status"] == 400 and refused["error"]["param"].startswith("input")
        send(other, {"type": "response.create", "model": "sim", "input": "x"})
        assert until_terminal(other)[-1]["type"] == "response.completed"
        send(ws, {"type": "response.create", "model": "sim", "input": "x"})
        assert until_terminal(ws)[-1]["type"] == "response.completed"


def test_oversize_frame_is_an_error_not_a_close() -> None:
    with hotloop_server(max_frame_bytes=2048) as base:
        with connect(base.replace("http://", "ws://") + "/v1/responses") as ws:
            send(ws, {"type": "response.create", "model": "sim", "input": "x" * 3000})
            assert validate(ws.recv())["error"]["code"] == "frame_too_large"
            send(ws, {"type": "response.create", "model": "sim", "input": "small"})
            assert until_terminal(ws)[-1]["type"] == "response.completed"


def test_lanes_interleave_and_queue_fifo(url: str) -> None:
    with open_socket(url) as ws:
        for lane in ("a", "b", "a"):
            send(
                ws,
                {
                    "type": "response.create",
                    "model": "sim",
                    "input": f"to {lane}",
                    "stream_id": lane,
                },
            )
        done: dict[str, int] = {}
        while sum(done.values()) < 3:
            frame = validate(ws.recv())
            assert frame["stream_id"] in ("a", "b")
            if frame["type"] in TERMINAL:
                assert frame["type"] == "response.completed"
                done[frame["stream_id"]] = done.get(frame["stream_id"], 0) + 1
        assert done == {"a": 2, "b": 1}


SLOW = SimSpeed(tokens_per_second=50.0, ttft=0.0, prefill_tokens_per_second=1e9)


def test_cancel_mid_stream_and_ping_while_streaming() -> None:
    script = SimScript(text="word " * 400)
    with hotloop_server(script, SLOW) as base:
        with connect(base.replace("http://", "ws://") + "/v1/responses") as ws:
            send(ws, {"type": "response.create", "model": "sim", "input": "long", "stream_id": "s"})
            while validate(ws.recv())["type"] != "response.output_text.delta":
                pass
            assert ws.ping().wait(timeout=30)  # answered while a response streams
            send(ws, {"type": "response.cancel", "stream_id": "s"})
            frames = until_terminal(ws)
            assert frames[-1]["type"] == "response.incomplete"
            assert frames[-1]["response"]["status"] == "cancelled"
            send(
                ws,
                {
                    "type": "response.create",
                    "model": "sim",
                    "input": "next",
                    "max_output_tokens": 5,
                },
            )
            last = until_terminal(ws)[-1]
            assert last["type"] == "response.incomplete"
            assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_lifetime_closes_an_idle_socket_with_1000() -> None:
    with hotloop_server(connection_lifetime=0.2) as base:
        with connect(base.replace("http://", "ws://") + "/v1/responses") as ws:
            frame = validate(ws.recv(timeout=30))
            assert frame["error"]["code"] == "websocket_connection_limit_reached"
            with pytest.raises(ConnectionClosedOK) as closed:
                ws.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
