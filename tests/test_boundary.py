"""The boundary invariant (issue 15, items 1 and 2): a value a strict JSON parser
refuses (a number outside 64 bits, a lone surrogate escape) in any field the core
passes through raw is refused with `invalid_value` and the field's `param`, over the
sans-I/O `Connection`, over a real WebSocket and through the real HTTP path (a 400
JSON error, never a 500); nothing of it is echoed, stored or booked."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest
from connection_driver import FORMAT, ConnectionDriver
from hotloop.config import ServerConfig
from hotloop.protocol import CacheBudget, Connection, ConnectionCache, Finished
from hotloop.transport import App
from servers import serving, sim_engine
from websockets.sync.client import connect

KEY = "sk-boundary"
HUGE = "9" * 400
# The repro, then the same values in every other raw pass-through field.
POISONED: list[tuple[str, str]] = [
    (
        '{"type":"response.create","store":true,"input":[{"type":"message","role":"user",'
        '"content":"hi","zz":1e999}]}',
        "input[0].zz",
    ),
    (
        '{"type":"response.create","input":[{"role":"user","content":[{"type":"input_text",'
        '"text":"hi","zz":-1e999}]}]}',
        "input[0].content[0].zz",
    ),
    (
        '{"type":"response.create","input":[{"type":"reasoning","summary":[],'
        '"encrypted_content":"\\ud800"},{"role":"user","content":"hi"}]}',
        "input[0].encrypted_content",
    ),
    (
        '{"type":"response.create","input":"hi","tools":[{"type":"function","name":"f"},'
        '{"type":"web_search"},{"type":"function","name":"g","foo":' + HUGE + "}]}",
        "tools[2].foo",
    ),
    (
        '{"type":"response.create","input":"hi","tools":[{"type":"web_search","x":1e999}]}',
        "tools[0].x",
    ),
    (
        '{"type":"response.create","input":"hi","tools":[{"type":"custom","name":"c",'
        '"format":{"definition":"\\udfff"}}]}',
        "tools[0].format.definition",
    ),
    (
        '{"type":"response.create","input":"hi","reasoning":{"effort":"\\ud800x"}}',
        "reasoning.effort",
    ),
    (
        '{"type":"response.create","input":"hi","metadata":{"k":"\\ud800\\u0041"}}',
        "metadata.k",
    ),
]


class Recorder:
    def __init__(self) -> None:
        self.done: list[Finished] = []

    def finished(self, response: Finished) -> None:
        self.done.append(response)


def driver() -> tuple[ConnectionDriver, Recorder]:
    recorder = Recorder()
    cache = ConnectionCache(1 << 30, CacheBudget(1 << 30))
    conn = Connection(
        chat_format=FORMAT, context_window=1 << 20, model="sim", cache=cache, observer=recorder
    )
    return ConnectionDriver(conn), recorder


@pytest.mark.parametrize(("frame", "param"), POISONED)
def test_connection_refuses_poisoned_values_at_their_field(frame: str, param: str) -> None:
    client, recorder = driver()
    (error,) = client.send(frame)
    assert error["type"] == "error"
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_value", param)
    assert client.generating == {} and recorder.done == []
    # The same frame on a named lane is answered on that lane.
    lane_frame = frame.replace('"response.create"', '"response.create","stream_id":"l"', 1)
    (error,) = client.send(lane_frame)
    assert error["stream_id"] == "l" and error["error"]["param"] == param


def test_accepted_values_at_the_edge_round_trip_into_the_record() -> None:
    client, recorder = driver()
    frame = (
        '{"type":"response.create","generate":false,"input":[{"role":"user","content":'
        '"\\ud83d\\ude00","zz":1.7976931348623157e308,"n":-9223372036854775808}],'
        '"tools":[{"type":"web_search","u":18446744073709551615}],'
        '"reasoning":{"effort":"low","t":1e-999}}'
    )
    (_created,) = client.send(frame)
    (completed,) = client.finish(ids=[])
    assert completed["type"] == "response.completed"
    (done,) = recorder.done
    response = orjson.loads(done.response_json)
    assert response["tools"] == [{"type": "web_search", "u": 18446744073709551615}]
    assert orjson.loads(done.request.input_json)[0]["content"] == "\U0001f600"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("store")
    settings = ServerConfig(engine="sim", api_keys=(KEY,), data_dir=str(data_dir))
    with serving(App.from_config(settings, sim_engine())) as base:
        yield base


def http_body(frame: str) -> bytes:
    # The HTTP body is the event without its `type`; kept as text, the values stay raw.
    return frame.replace('"type":"response.create",', '"model":"sim",', 1).encode()


@pytest.mark.parametrize(("frame", "param"), POISONED)
def test_http_refuses_poisoned_values_with_a_400(url: str, frame: str, param: str) -> None:
    for stream in ("false", "true"):
        body = http_body(frame).replace(b"{", b'{"stream":' + stream.encode() + b",", 1)
        reply = httpx.post(
            url + "/v1/responses",
            content=body,
            headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
        )
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert (error["code"], error["param"]) == ("invalid_value", param)


def test_websocket_refuses_poisoned_values_and_the_store_keeps_working(url: str) -> None:
    ws_url = url.replace("http://", "ws://") + "/v1/responses"
    with connect(ws_url, additional_headers={"authorization": f"Bearer {KEY}"}) as ws:
        for frame, param in POISONED:
            ws.send(frame)
            error = orjson.loads(ws.recv(timeout=10))
            assert (error["type"], error["error"]["param"]) == ("error", param)
        ws.send(orjson.dumps({"type": "response.create", "model": "sim", "input": "hi"}).decode())
        while (event := orjson.loads(ws.recv(timeout=10)))["type"] != "response.completed":
            pass
    response_id = event["response"]["id"]
    stored = httpx.get(
        f"{url}/v1/responses/{response_id}", headers={"authorization": f"Bearer {KEY}"}
    )
    assert stored.status_code == 200 and stored.json()["id"] == response_id
