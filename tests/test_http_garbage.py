"""An HTTP turn leaves no reference cycles: what a request builds (its protocol
`Connection` and units, its `Driver` and writer, uvicorn's request cycle and the corking
`send` of `AdmittingHttpProtocol`) is freed by reference counting when the exchange
ends. Each cycle left per request is work for the garbage collector, whose collections
hold the event loop (issue 36: a whole-history HTTP agent made many times the
collections of a WebSocket one). Counted, not timed: with the collector off, the
collection after K turns finds nothing unreachable."""

from __future__ import annotations

import gc
import http.client
from collections.abc import Iterator

import orjson
import pytest
from hotloop.config import ServerConfig
from hotloop.transport import App
from servers import serving, sim_engine

KEY = "sk-garbage"
TURNS = 20


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = ServerConfig(
        engine="sim", api_keys=(KEY,), data_dir=str(tmp_path_factory.mktemp("garbage"))
    )
    with serving(App.from_config(config, sim_engine())) as base:
        yield base


def turns(client: http.client.HTTPConnection, count: int, stream: bool, store: bool) -> None:
    """`count` turns of a stateless agent: the whole history each time, on one
    kept-alive connection."""
    history: list[dict[str, str]] = []
    for n in range(count):
        history.append({"role": "user", "content": f"turn {n}"})
        body = {"model": "sim", "input": history, "stream": stream, "store": store}
        headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
        client.request("POST", "/v1/responses", orjson.dumps(body), headers)
        reply = client.getresponse()
        text = reply.read()
        assert reply.status == 200, text
        assert b"response.completed" in text if stream else b'"completed"' in text
        history.append({"role": "assistant", "content": "Done."})


@pytest.mark.parametrize(("stream", "store"), [(True, False), (False, False), (True, True)])
def test_http_turns_leave_no_reference_cycles(url: str, stream: bool, store: bool) -> None:
    client = http.client.HTTPConnection(url.removeprefix("http://"))
    turns(client, 3, stream, store)  # what lives on (caches, pools) is made
    gc.collect()
    gc.disable()
    try:
        turns(client, TURNS, stream, store)
        unreachable = gc.collect()
    finally:
        gc.enable()
        client.close()
    assert unreachable == 0
