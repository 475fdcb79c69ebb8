"""Open Responses conformance, written from the specification (its OpenAPI document,
tests/data) and the behaviour its compliance checks describe, against a real server
(uvicorn, sim engine): the HTTP checks (basic, system prompt, multi-turn, assistant
phase, streaming, tool calling, image input, compact, compact without model) and the
WebSocket ones (single, sequential, continuation, store=false reconnect, unknown
previous id, a failed continuation evicting its parent, compact then a new chain).

Every Response object, compaction object and streamed event is checked against the
specification's schemas with `jsonschema` and, strictly, against the openai SDK's
pydantic models."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hotloop._core import ChatFormat
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimEngine, SimScript
from hotloop.protocol.compaction import SUMMARY_HEADER
from hotloop.transport import App
from open_responses import check_compaction, check_event, check_response
from openai import OpenAI
from openai.types.responses import CompactedResponse, Response
from sdk_events import validate
from servers import FAST, serving
from websockets.sync.client import ClientConnection, connect

KEY = "sk-conformance"
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a location",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string"}},
        "required": ["location"],
    },
}
SUMMARY = "The user set the code word slate; nothing else is open."
IMAGE = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQ"
    "DwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def server(
    data_dir: Path, script: SimScript | None = None, modalities: tuple[str, ...] = ("text",)
) -> Any:
    engine = SimEngine(
        ChatFormat.harmony(), model="sim", speed=FAST, script=script, modalities=modalities
    )
    config = ServerConfig(engine="sim", api_keys=(KEY,), data_dir=str(data_dir))
    return serving(App.from_config(config, engine))


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # The sim answers with the summary text, so compaction items seal a known summary.
    with server(tmp_path_factory.mktemp("text"), SimScript(text=SUMMARY)) as url:
        yield url + "/v1"


@pytest.fixture(scope="module")
def echo_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The sim answers with the prompt it was given: what reached the model."""
    with server(tmp_path_factory.mktemp("echo"), SimScript(echo=True)) as url:
        yield url + "/v1"


@pytest.fixture(scope="module")
def tool_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    script = SimScript(tool="get_weather", tool_calls=1, tool_arguments='{"location":"SF"}')
    with server(tmp_path_factory.mktemp("tools"), script) as url:
        yield url + "/v1"


@pytest.fixture(scope="module")
def namespace_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The sim calls a function of a `namespace` tool, by its qualified name."""
    script = SimScript(
        tool="multi_agent_v1.spawn_agent", tool_calls=1, tool_arguments='{"task":"x"}'
    )
    with server(tmp_path_factory.mktemp("namespace"), script) as url:
        yield url + "/v1"


@pytest.fixture(scope="module")
def vision_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    script = SimScript(echo=True)
    with server(tmp_path_factory.mktemp("vision"), script, modalities=("text", "image")) as url:
        yield url + "/v1"


def post(base: str, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY}"}
    return httpx.post(base + path, json=body, headers=headers, timeout=30)


def completed(base: str, body: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed response, valid under both the specification and the SDK."""
    reply = post(base, "/responses", {"model": "sim", **body})
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-request-id"].startswith("req_")
    response: dict[str, Any] = reply.json()
    check_response(response)
    Response.model_validate_json(reply.content, strict=True)
    assert response["status"] == "completed" and response["output"]
    return response


def sse_events(base: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {KEY}"}
    events = []
    with httpx.stream(
        "POST",
        base + "/responses",
        json={"model": "sim", **body, "stream": True},
        headers=headers,
        timeout=30,
    ) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: "):
                events.append(checked(line[6:], websocket=False))
    return events


def checked(frame: str | bytes, *, websocket: bool) -> dict[str, Any]:
    """One streamed event, valid under the SDK's models and the specification."""
    event = validate(frame)
    check_event(event, websocket=websocket)
    if event["type"] in TERMINAL:
        check_response(event["response"])
    return event


# ---------------------------------------------------------------- HTTP


def test_basic_response(base: str) -> None:
    response = completed(
        base, {"input": [{"type": "message", "role": "user", "content": "Say hello."}]}
    )
    assert response["output"][0]["role"] == "assistant"
    assert response["completed_at"] >= response["created_at"]
    # Stored, and retrieved as it was sent.
    headers = {"Authorization": f"Bearer {KEY}"}
    stored = httpx.get(f"{base}/responses/{response['id']}", headers=headers, timeout=30)
    assert stored.status_code == 200
    check_response(stored.json())


def test_settings_are_echoed_or_filled_with_defaults(base: str) -> None:
    defaults = completed(base, {"input": "hi", "tools": [WEATHER]})
    assert defaults["temperature"] == 1.0 and defaults["top_p"] == 1.0
    assert defaults["presence_penalty"] == 0.0 and defaults["frequency_penalty"] == 0.0
    assert defaults["top_logprobs"] == 0 and defaults["service_tier"] == "default"
    assert defaults["max_tool_calls"] is None and defaults["safety_identifier"] is None
    assert defaults["prompt_cache_key"] is None
    assert defaults["reasoning"] == {"effort": None, "summary": None}
    assert defaults["tools"][0]["strict"] is True
    assert defaults["tools"][0]["parameters"] == WEATHER["parameters"]
    sent = {
        "temperature": 0.2,
        "top_p": 0.5,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "top_logprobs": 3,
        "service_tier": "flex",
        "max_tool_calls": 4,
        "safety_identifier": "user-1",
        "prompt_cache_key": "agent-7",
    }
    echoed = completed(base, {"input": "hi", **sent})
    assert {k: echoed[k] for k in sent} == sent


def seen(response: dict[str, Any]) -> str:
    """The prompt the echoing sim was given (`SimScript.echo`), from its answer."""
    (message,) = [item for item in response["output"] if item["type"] == "message"]
    return "".join(part["text"] for part in message["content"])


def in_order(prompt: str, *texts: str) -> bool:
    """Whether each of `texts` occurs in `prompt`, one after the other."""
    at = 0
    for text in texts:
        at = prompt.find(text, at)
        if at < 0:
            return False
        at += len(text)
    return True


def test_system_prompt(echo_base: str) -> None:
    response = completed(
        echo_base,
        {
            "input": [
                {"type": "message", "role": "system", "content": "You are a pirate."},
                {"type": "message", "role": "user", "content": "Say hello."},
            ]
        },
    )
    prompt = seen(response)
    assert in_order(prompt, "You are a pirate.", "<|end|>", "<|start|>user", "Say hello."), prompt


def test_multi_turn(echo_base: str) -> None:
    response = completed(
        echo_base,
        {
            "input": [
                {"type": "message", "role": "user", "content": "My name is Alice."},
                {"type": "message", "role": "assistant", "content": "Hello Alice!"},
                {"type": "message", "role": "user", "content": "What is my name?"},
            ]
        },
    )
    prompt = seen(response)
    turns = ("<|start|>user", "My name is Alice.", "<|start|>assistant", "Hello Alice!")
    assert in_order(prompt, *turns, "<|start|>user", "What is my name?"), prompt


def test_assistant_phase(echo_base: str) -> None:
    response = completed(
        echo_base,
        {
            "input": [
                {"role": "assistant", "phase": "commentary", "content": "Checking the number."},
                {"role": "assistant", "phase": "final_answer", "content": "It is four."},
                {"role": "user", "content": "Repeat only the number."},
            ]
        },
    )
    prompt = seen(response)
    # Both assistant messages, in order, before the user's question. (`phase` is
    # accepted and not rendered: both are on harmony's final channel.)
    said = ("<|start|>assistant", "Checking the number.", "<|start|>assistant", "It is four.")
    assert in_order(prompt, *said, "<|start|>user", "Repeat only the number."), prompt


def test_streaming_response(base: str) -> None:
    events = sse_events(base, {"input": "Count from 1 to 5."})
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_tool_calling(tool_base: str) -> None:
    response = completed(tool_base, {"input": "Weather in San Francisco?", "tools": [WEATHER]})
    call = next(item for item in response["output"] if item["type"] == "function_call")
    assert call["name"] == "get_weather" and call["status"] == "completed"
    kinds = [e["type"] for e in sse_events(tool_base, {"input": "Again?", "tools": [WEATHER]})]
    for kind in (
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ):
        assert kind in kinds


def image_input() -> list[dict[str, Any]]:
    content = [
        {"type": "input_text", "text": "What do you see?"},
        {"type": "input_image", "image_url": IMAGE},
    ]
    return [{"type": "message", "role": "user", "content": content}]


def test_image_input_is_refused_by_a_text_only_model(base: str) -> None:
    reply = post(base, "/responses", {"model": "sim", "input": image_input()})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["code"] == "unsupported_content"
    assert error["param"] == "input[0].content[1]"
    assert "text only" in error["message"]
    with socket(base) as ws:
        send(ws, {"type": "response.create", "model": "sim", "input": image_input()})
        refused = checked(ws.recv(), websocket=True)
        assert refused["type"] == "error" and refused["status"] == 400
        assert refused["error"]["code"] == "unsupported_content"
        assert refused["error"]["param"] == "input[0].content[1]"


def test_image_input_to_a_model_with_vision(vision_base: str) -> None:
    prompt = seen(completed(vision_base, {"input": image_input()}))
    # The image reached the model as its placeholder, where the user put it.
    assert in_order(prompt, "<|start|>user", "What do you see?", "[image]"), prompt


def compact(base: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = post(base, "/responses/compact", body)
    assert reply.status_code == 200, reply.text
    resource: dict[str, Any] = reply.json()
    check_compaction(resource)
    CompactedResponse.model_validate_json(reply.content, strict=True)
    return resource


CONVERSATION = [
    {"role": "user", "content": "We launch on Tuesday; remember the code word slate."},
    {"role": "assistant", "content": "Understood: Tuesday, and the code word is slate."},
]


def test_compact(base: str) -> None:
    resource = compact(base, {"model": "sim", "input": CONVERSATION})
    assert resource["object"] == "response.compaction"
    (item,) = resource["output"]
    assert item["type"] == "compaction" and item["id"].startswith("cmp_")
    # Opaque: neither the summary nor the conversation can be read from it.
    assert "slate" not in item["encrypted_content"] and "Tuesday" not in item["encrypted_content"]
    assert resource["usage"]["input_tokens"] > 0 and resource["usage"]["output_tokens"] > 0


def test_compact_without_model_is_refused(base: str) -> None:
    reply = post(base, "/responses/compact", {"input": CONVERSATION})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "model"


def test_compaction_renders_its_summary_in_place_of_the_history(base: str) -> None:
    (item,) = compact(base, {"model": "sim", "input": CONVERSATION})["output"]
    question = {"role": "user", "content": "What is the code word?"}
    counted = post(base, "/responses/input_tokens", {"model": "sim", "input": [item, question]})
    summary = {"role": "user", "content": SUMMARY_HEADER + SUMMARY}
    expected = post(base, "/responses/input_tokens", {"model": "sim", "input": [summary, question]})
    assert counted.status_code == 200, counted.text
    assert counted.json() == expected.json()
    response = completed(base, {"input": [item, question]})
    assert response["usage"]["input_tokens"] == counted.json()["input_tokens"]


def test_a_changed_compaction_item_is_refused(base: str) -> None:
    (item,) = compact(base, {"model": "sim", "input": CONVERSATION})["output"]
    sealed = item["encrypted_content"]
    flipped = sealed[:-3] + ("A" if sealed[-3] != "A" else "B") + sealed[-2:]
    for content in (flipped, "not a compaction"):
        tampered = {**item, "encrypted_content": content}
        reply = post(base, "/responses", {"model": "sim", "input": [tampered]})
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["code"] == "invalid_encrypted_content"
        assert error["param"] == "input[0].encrypted_content"


def test_compaction_survives_a_restart_with_the_same_data_dir(tmp_path: Path) -> None:
    with server(tmp_path, SimScript(text=SUMMARY)) as url:
        (item,) = compact(url + "/v1", {"model": "sim", "input": CONVERSATION})["output"]
    with server(tmp_path, SimScript(text=SUMMARY)) as url:
        completed(url + "/v1", {"input": [item, {"role": "user", "content": "Go on."}]})


def test_compact_continues_a_chain(base: str) -> None:
    first = completed(base, {"input": CONVERSATION})
    resource = compact(base, {"model": "sim", "previous_response_id": first["id"]})
    assert resource["usage"]["input_tokens_details"]["cached_tokens"] > 0
    missing = post(base, "/responses/compact", {"model": "sim", "previous_response_id": "resp_x"})
    assert missing.status_code == 400
    assert missing.json()["error"]["code"] == "previous_response_not_found"


def test_input_tokens_counts_as_a_turn_would(base: str) -> None:
    body = {"model": "sim", "input": CONVERSATION, "instructions": "Be brief."}
    counted = post(base, "/responses/input_tokens", body)
    assert counted.status_code == 200, counted.text
    assert counted.json()["object"] == "response.input_tokens"
    first = completed(base, body)
    assert counted.json()["input_tokens"] == first["usage"]["input_tokens"]
    # From the cached chain: the count of a continuation is its turn's prompt.
    follow = {"model": "sim", "input": "And then?", "previous_response_id": first["id"]}
    assert (
        post(base, "/responses/input_tokens", follow).json()["input_tokens"]
        == (completed(base, follow)["usage"]["input_tokens"])
    )
    missing = post(base, "/responses/input_tokens", {**follow, "previous_response_id": "resp_x"})
    assert missing.status_code == 400


# ---------------------------------------------------------------- WebSocket


def socket(base: str) -> ClientConnection:
    url = base.replace("http://", "ws://") + "/responses"
    return connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, max_size=None)


def send(ws: ClientConnection, event: dict[str, Any]) -> None:
    ws.send(orjson.dumps(event).decode())


def turn(ws: ClientConnection, **fields: Any) -> list[dict[str, Any]]:
    """One `response.create` and its events up to the terminal one (or an error)."""
    send(ws, {"type": "response.create", "model": "sim", **fields})
    events = []
    while True:
        event = checked(ws.recv(), websocket=True)
        events.append(event)
        if event["type"] in TERMINAL or event["type"] == "error":
            return events


def test_websocket_response(base: str) -> None:
    with socket(base) as ws:
        events = turn(ws, input=[{"type": "message", "role": "user", "content": "Count to 3."}])
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"]


def test_websocket_sequential_responses(base: str) -> None:
    with socket(base) as ws:
        first = turn(ws, store=False, input="Reply with exactly: first")[-1]
        second = turn(ws, store=False, input="Reply with exactly: second")[-1]
    assert first["type"] == second["type"] == "response.completed"
    assert first["response"]["id"] != second["response"]["id"]


def test_websocket_continuation(base: str) -> None:
    with socket(base) as ws:
        first = turn(ws, store=False, input="Remember the code word: cobalt.")[-1]["response"]
        second = turn(ws, store=False, previous_response_id=first["id"], input="Code word?")
    response = second[-1]["response"]
    assert response["status"] == "completed" and response["previous_response_id"] == first["id"]
    assert response["usage"]["input_tokens_details"]["cached_tokens"] > 0


MULTI_AGENT = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "description": "Start one.",
            "parameters": {"type": "object", "properties": {"task": {"type": "string"}}},
        },
        {"type": "function", "name": "wait", "description": "Wait for one."},
    ],
}


def test_websocket_namespace_tool_call(namespace_base: str) -> None:
    """Codex's `namespace` tools: the model's call comes back as the SDK's function_call
    (`name` and `namespace`), and sent back as input it renders as it was sampled."""
    tools = [WEATHER, MULTI_AGENT]
    user = {"type": "message", "role": "user", "content": "Delegate."}

    def turn(ws: ClientConnection, **fields: Any) -> list[dict[str, Any]]:
        # The SDK's models only: Open Responses' schema has no `namespace` tool to echo.
        send(ws, {"type": "response.create", "model": "sim", **fields})
        events = [validate(ws.recv())]
        while events[-1]["type"] not in TERMINAL and events[-1]["type"] != "error":
            events.append(validate(ws.recv()))
        return events

    with socket(namespace_base) as ws:
        first = turn(ws, store=False, tools=tools, input=[user])
        call = next(i for i in first[-1]["response"]["output"] if i["type"] == "function_call")
        assert (call["namespace"], call["name"]) == ("multi_agent_v1", "spawn_agent")
        added = next(e for e in first if e["type"] == "response.output_item.added")["item"]
        assert (added["namespace"], added["name"]) == ("multi_agent_v1", "spawn_agent")
        done = next(e for e in first if e["type"] == "response.function_call_arguments.done")
        assert done["name"] == "spawn_agent"
        answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
        second = turn(
            ws,
            store=False,
            tools=tools,
            previous_response_id=first[-1]["response"]["id"],
            input=[answer],
        )[-1]["response"]
        # The whole history in one request, the call as the client got it.
        sent_call = {k: call[k] for k in ("type", "call_id", "namespace", "name", "arguments")}
        again = turn(ws, store=False, tools=tools, input=[user, sent_call, answer])[-1]["response"]
    assert second["status"] == again["status"] == "completed"
    assert second["usage"]["input_tokens"] == again["usage"]["input_tokens"]
    # The continuation reused the sampled call's tokens: the render matched them.
    cached = second["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached > first[-1]["response"]["usage"]["input_tokens"]


def test_websocket_store_false_does_not_survive_a_reconnect(base: str) -> None:
    with socket(base) as ws:
        first = turn(ws, store=False, input="Remember: copper.")[-1]["response"]
    with socket(base) as ws:
        missed = turn(ws, store=False, previous_response_id=first["id"], input="Go on.")[-1]
        assert missed["type"] == "error"
        assert missed["error"]["code"] == "previous_response_not_found"
        recovered = turn(ws, store=False, input="Start again: recovered.")[-1]
        assert recovered["type"] == "response.completed"


def test_websocket_unknown_previous_response(base: str) -> None:
    with socket(base) as ws:
        missed = turn(ws, store=False, previous_response_id="resp_missing", input="Hi")[-1]
    assert missed["type"] == "error" and missed["status"] == 400
    assert missed["error"]["code"] == "previous_response_not_found"
    assert missed["error"]["param"] == "previous_response_id"


def test_websocket_failed_continuation_evicts_its_parent(base: str) -> None:
    orphan = {"type": "function_call_output", "call_id": "call_missing", "output": "x"}
    with socket(base) as ws:
        first = turn(ws, store=False, input="Remember: ember.")[-1]["response"]
        failed = turn(ws, store=False, previous_response_id=first["id"], input=[orphan])[-1]
        assert failed["type"] == "error" and failed["status"] == 400
        retry = turn(ws, store=False, previous_response_id=first["id"], input="stale?")[-1]
    assert retry["type"] == "error"
    assert retry["error"]["code"] == "previous_response_not_found"


def test_websocket_compact_then_a_new_chain(base: str) -> None:
    (item,) = compact(base, {"model": "sim", "input": CONVERSATION})["output"]
    question = {"role": "user", "content": "Continue from here."}
    with socket(base) as ws:
        events = turn(ws, store=False, input=[item, question], tools=[])
    response = events[-1]["response"]
    assert response["status"] == "completed" and response["previous_response_id"] is None
    counted = post(base, "/responses/input_tokens", {"model": "sim", "input": [item, question]})
    assert response["usage"]["input_tokens"] == counted.json()["input_tokens"]


def test_request_ids_are_logged_with_response_ids(
    base: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hotloop.requests")
    reply = post(base, "/responses", {"model": "sim", "input": "hi"})
    line = f"response {reply.json()['id']} request {reply.headers['x-request-id']}"
    assert line in caplog.messages
    for path in ("/models", "/nowhere"):
        assert (
            httpx.get(base + path, headers={"Authorization": f"Bearer {KEY}"})
            .headers["x-request-id"]
            .startswith("req_")
        )


def test_websocket_request_ids(base: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hotloop.requests")
    with socket(base) as ws:
        assert ws.response is not None
        assert ws.response.headers["x-request-id"].startswith("req_")
        first = turn(ws, input="one")
        second = turn(ws, input="two")
    for events in (first, second):
        created, terminal = events[0], events[-1]
        assert created["request_id"] == terminal["request_id"]
        assert created["request_id"].startswith("req_")
    assert first[0]["request_id"] != second[0]["request_id"]
    response_id = first[-1]["response"]["id"]
    assert f"response {response_id} request {first[0]['request_id']}" in caplog.messages


def test_a_limit_that_refuses_work_says_when_to_retry(tmp_path: Path) -> None:
    engine = SimEngine(ChatFormat.harmony(), model="sim", speed=FAST)
    config = ServerConfig(engine="sim", data_dir=str(tmp_path), max_queued_bytes=256)
    with serving(App.from_config(config, engine)) as url:
        reply = httpx.post(
            url + "/v1/responses", json={"model": "sim", "input": "x" * 300}, timeout=30
        )
        with socket(url + "/v1") as ws:
            refused = turn(ws, input="y" * 300)[-1]
    assert reply.status_code == 429 and reply.headers["retry-after"] == "1"
    error = reply.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert error["code"] == "websocket_queue_limit_reached"
    assert error["headers"] == {"retry-after": "1"}
    assert refused["status"] == 429 and refused["error"]["headers"] == {"retry-after": "1"}


def test_the_openai_sdk_compacts_and_counts(base: str) -> None:
    client = OpenAI(base_url=base, api_key=KEY, max_retries=0)
    compacted = client.responses.compact(model="sim", input=CONVERSATION)  # type: ignore[arg-type]
    assert compacted.object == "response.compaction"
    assert compacted.output[0].type == "compaction"
    assert compacted._request_id is not None and compacted._request_id.startswith("req_")
    item = compacted.output[0].model_dump(exclude_none=True)
    counted = client.responses.input_tokens.count(
        model="sim",
        input=[item, {"role": "user", "content": "Go on."}],  # type: ignore[list-item]
    )
    assert counted.object == "response.input_tokens" and counted.input_tokens > 0
    response = client.responses.create(
        model="sim",
        input=[item, {"role": "user", "content": "Go on."}],  # type: ignore[list-item]
    )
    assert response.usage is not None
    assert response.usage.input_tokens == counted.input_tokens
    assert response._request_id is not None


def test_a_compacted_chain_continues_after_a_restart(tmp_path: Path) -> None:
    management = [{"type": "compaction", "compact_threshold": 1000}]
    with server(tmp_path, SimScript(text=SUMMARY)) as url:
        first = completed(url + "/v1", {"input": "word " * 1500})
        compacted = completed(
            url + "/v1",
            {
                "input": "Go on.",
                "previous_response_id": first["id"],
                "context_management": management,
            },
        )
        assert compacted["output"][0]["type"] == "compaction"
    follow = {"input": "And then?", "previous_response_id": compacted["id"]}
    with server(tmp_path, SimScript(text=SUMMARY)) as url:
        # Rebuilt from the store: the summary and what followed, not the long history.
        response = completed(url + "/v1", follow)
    assert response["usage"]["input_tokens"] < 200


def test_a_model_with_vision_compacts_a_conversation_with_images(vision_base: str) -> None:
    (item,) = compact(vision_base, {"model": "sim", "input": image_input()})["output"]
    completed(vision_base, {"input": [item, {"role": "user", "content": "And?"}]})
