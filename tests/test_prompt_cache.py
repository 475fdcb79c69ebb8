"""Prompt-cache controls, with the real openai SDK over HTTP and a WebSocket against a
real server: `prompt_cache_key`, `prompt_cache_retention` and `prompt_cache_options`
accepted, validated with the SDK's values and echoed as the SDK's Response reads them.
Routing by `prompt_cache_key` through HAProxy and to the upstream replicas is
tests/test_scaleout.py::test_a_prompt_cache_key_goes_to_one_node_and_one_replica."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from openai import OpenAI
from openai.types.responses import Response
from servers import stored_server
from websockets.sync.client import connect

KEY = "sk-cache"
AUTH = {"authorization": f"Bearer {KEY}"}
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
CONTROLS: dict[str, Any] = {
    "prompt_cache_key": "agent-7",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "explicit", "ttl": "12h"},
}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = str(tmp_path_factory.mktemp("store"))
    with stored_server(data_dir, api_keys=(KEY, "sk-other")) as base:
        yield base


@pytest.fixture
def client(url: str) -> OpenAI:
    return OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)


def ws_turn(url: str, **fields: Any) -> dict[str, Any]:
    with connect(url.replace("http://", "ws://") + "/v1/responses", additional_headers=AUTH) as ws:
        ws.send(orjson.dumps({"type": "response.create", "model": "sim", **fields}).decode())
        while True:
            event: dict[str, Any] = orjson.loads(ws.recv())
            if event["type"] in TERMINAL or event["type"] == "error":
                return event


def test_the_controls_are_echoed_over_http_as_the_sdk_reads_them(client: OpenAI) -> None:
    raw = client.responses.with_raw_response.create(model="sim", input="hi", **CONTROLS)
    response = Response.model_validate_json(raw.http_response.content, strict=True)
    assert response.prompt_cache_key == "agent-7"
    assert response.prompt_cache_retention == "24h"
    assert response.prompt_cache_options is not None
    assert (response.prompt_cache_options.mode, response.prompt_cache_options.ttl) == (
        "explicit",
        "12h",
    )
    # Stored as served.
    stored = client.responses.retrieve(response.id)
    assert stored.prompt_cache_key == "agent-7" and stored.prompt_cache_retention == "24h"


def test_the_controls_are_echoed_over_a_websocket(url: str) -> None:
    event = ws_turn(url, input="hi", **CONTROLS)
    assert event["type"] == "response.completed"
    response = event["response"]
    assert {k: response[k] for k in CONTROLS} == {
        **CONTROLS,
        "prompt_cache_options": {"mode": "explicit", "ttl": "12h", "comparison_response_id": None},
    }


def test_defaults_echo_the_key_only(client: OpenAI) -> None:
    raw = client.responses.with_raw_response.create(
        model="sim", input="hi", prompt_cache_retention="in_memory", prompt_cache_options={}
    )
    body = raw.http_response.json()
    assert body["prompt_cache_key"] is None
    assert body["prompt_cache_retention"] == "in_memory"
    assert body["prompt_cache_options"] == {
        "mode": "implicit",
        "ttl": "30m",
        "comparison_response_id": None,
    }
    plain = client.responses.with_raw_response.create(model="sim", input="hi").http_response
    assert "prompt_cache_options" not in plain.json()


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt_cache_key": 7}, "prompt_cache_key"),
        ({"prompt_cache_retention": "forever"}, "prompt_cache_retention"),
        ({"prompt_cache_options": {"ttl": "1h"}}, "prompt_cache_options.ttl"),
        ({"prompt_cache_options": {"mode": "auto"}}, "prompt_cache_options.mode"),
        ({"prompt_cache_options": {"prewarm": "yes"}}, "prompt_cache_options.prewarm"),
        ({"prompt_cache_options": []}, "prompt_cache_options"),
    ],
)
def test_invalid_controls_are_refused_at_their_param(
    url: str, fields: dict[str, Any], param: str
) -> None:
    body = {"model": "sim", "input": "hi", **fields}
    reply = httpx.post(f"{url}/v1/responses", json=body, headers=AUTH)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param
    event = ws_turn(url, input="hi", **fields)
    assert event["type"] == "error" and event["error"]["param"] == param


# ---------------------------------------------------------------- prompt_cache_diagnostics

TOOL = {"type": "function", "name": "read", "parameters": {"type": "object", "properties": {}}}


def compared(client: OpenAI, compare_to: str, **body: Any) -> dict[str, Any]:
    """A response made with `comparison_response_id`, its diagnostics (SDK-validated)."""
    raw = client.responses.with_raw_response.create(
        model="sim", prompt_cache_options={"comparison_response_id": compare_to}, **body
    )
    response = Response.model_validate_json(raw.http_response.content, strict=True)
    assert response.prompt_cache_diagnostics is not None
    diagnostics: dict[str, Any] = raw.http_response.json()["prompt_cache_diagnostics"]
    return diagnostics


def messages(*texts: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": text} for text in texts]


def test_a_continuation_of_the_compared_response_is_a_cache_hit(client: OpenAI) -> None:
    first = client.responses.create(model="sim", input="Fix the test.", instructions="Be brief.")
    diagnostics = compared(
        client,
        first.id,
        input="And the docs.",
        previous_response_id=first.id,
        instructions="Be brief.",
    )
    assert diagnostics["type"] == "cache_hit", diagnostics


@pytest.mark.parametrize(
    ("changed", "part", "reason"),
    [
        ({"instructions": "Be thorough."}, "instructions", "input_changed"),
        ({"tools": [TOOL]}, "tools", "tools_changed"),
        ({"input": messages("Fix the build.", "Then the docs.")}, "input[0]", "input_changed"),
        ({"input": messages("Fix the test.", "Then the tests.")}, "input[1]", "input_changed"),
    ],
)
def test_a_miss_names_where_the_prompts_first_differ(
    client: OpenAI, changed: dict[str, Any], part: str, reason: str
) -> None:
    base = {"instructions": "Be brief.", "input": messages("Fix the test.", "Then the docs.")}
    first = client.responses.create(model="sim", **base)  # type: ignore[arg-type]
    diagnostics = compared(client, first.id, **{**base, **changed})
    assert diagnostics["type"] == "cache_miss"
    assert (diagnostics["part"], diagnostics["reason"]) == (part, reason)
    reusable = diagnostics["comparison_reusable_tokens"]
    assert diagnostics["first_difference"] == reusable
    assert diagnostics["cache_missed_tokens"] > 0
    # Later parts reuse more of the compared prompt than earlier ones.
    if part == "input[1]":
        assert (
            reusable
            > compared(client, first.id, **{**base, "instructions": "X"})[
                "comparison_reusable_tokens"
            ]
        )


def test_an_unknown_or_another_key_s_response_is_not_found(url: str, client: OpenAI) -> None:
    assert compared(client, "resp_unknown", input="hi") == {"type": "comparison_response_not_found"}
    other = OpenAI(base_url=url + "/v1", api_key="sk-other", max_retries=0)
    theirs = other.responses.create(model="sim", input="secret")
    assert compared(client, theirs.id, input="secret") == {"type": "comparison_response_not_found"}


def test_diagnostics_over_a_websocket(url: str) -> None:
    with connect(url.replace("http://", "ws://") + "/v1/responses", additional_headers=AUTH) as ws:

        def turn(**fields: Any) -> dict[str, Any]:
            ws.send(orjson.dumps({"type": "response.create", "model": "sim", **fields}).decode())
            while True:
                event: dict[str, Any] = orjson.loads(ws.recv())
                if event["type"] in TERMINAL or event["type"] == "error":
                    assert event["type"] == "response.completed", event
                    response: dict[str, Any] = event["response"]
                    return response

        first = turn(input="Fix the test.", store=False)
        options = {"comparison_response_id": first["id"]}
        hit = turn(
            input="More.",
            previous_response_id=first["id"],
            store=False,
            prompt_cache_options=options,
        )
        assert hit["prompt_cache_diagnostics"]["type"] == "cache_hit"
        miss = turn(input="Fix the docs.", store=False, prompt_cache_options=options)
        assert miss["prompt_cache_diagnostics"]["part"] == "input[0]"
