"""A request without `model` (the Open Responses specification requires it; llm-comply
checks it): 400 `missing_required_parameter` with `param: "model"` over HTTP (JSON, SSE,
`/responses/compact`) and WebSocket, with the real openai SDK; served, and echoing the
default, when the operator set `--default-model`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from hotloop.config import ServerConfig
from openai import OpenAI
from servers import stored_server
from websockets.sync.client import connect

KEY = "sk-model"
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with stored_server(str(tmp_path_factory.mktemp("strict")), api_keys=(KEY,)) as url:
        yield url


@pytest.fixture(scope="module")
def defaulted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = str(tmp_path_factory.mktemp("defaulted"))
    with stored_server(data_dir, api_keys=(KEY,), default_model="house-model") as url:
        yield url


def post(url: str, route: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"authorization": f"Bearer {KEY}"}
    return httpx.post(f"{url}/v1/{route}", json=body, headers=headers, timeout=30)


def ws_first_terminal(url: str, frame: dict[str, Any]) -> dict[str, Any]:
    ws_url = url.replace("http://", "ws://") + "/v1/responses"
    with connect(ws_url, additional_headers={"authorization": f"Bearer {KEY}"}) as ws:
        ws.send(orjson.dumps({"type": "response.create", **frame}).decode())
        while True:
            event: dict[str, Any] = orjson.loads(ws.recv())
            if event["type"] in TERMINAL or event["type"] == "error":
                return event


@pytest.mark.parametrize("stream", [False, True])
def test_http_without_model_is_400_missing_required_parameter(strict: str, stream: bool) -> None:
    reply = post(strict, "responses", {"input": "hi", "stream": stream})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == ("missing_required_parameter", "model")
    compact = post(strict, "responses/compact", {"input": "hi"})
    assert compact.status_code == 400 and compact.json()["error"]["param"] == "model"


def test_the_sdk_sees_a_bad_request_naming_model(strict: str) -> None:
    client = OpenAI(base_url=strict + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(input="hi")
    assert refused.value.param == "model" and refused.value.code == "missing_required_parameter"
    assert client.responses.create(model="sim", input="hi").status == "completed"


def test_websocket_without_model_is_an_error_event(strict: str) -> None:
    event = ws_first_terminal(strict, {"input": "hi"})
    assert event["type"] == "error" and event["status"] == 400
    assert (event["error"]["code"], event["error"]["param"]) == (
        "missing_required_parameter",
        "model",
    )


def test_with_a_default_model_the_request_is_served_as_it(defaulted: str) -> None:
    reply = post(defaulted, "responses", {"input": "hi"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "house-model"
    event = ws_first_terminal(defaulted, {"input": "hi"})
    assert event["type"] == "response.completed"
    assert event["response"]["model"] == "house-model"
    # A request naming its model echoes its own.
    assert post(defaulted, "responses", {"model": "sim", "input": "hi"}).json()["model"] == "sim"
    assert post(defaulted, "responses/compact", {"input": "hi"}).status_code == 200


def test_the_setting_reads_from_the_environment() -> None:
    config = ServerConfig.from_env({"HOTLOOP_DEFAULT_MODEL": "house-model"})
    assert config.default_model == "house-model"
    assert ServerConfig().default_model is None
