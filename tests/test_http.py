"""The HTTP half, spoken by the real openai SDK against a real server (uvicorn, sim
engine, SQLite store): create (JSON and SSE), retrieve, delete, input items, models,
usage, health and metrics; warm continuations through the process cache, rebuilds
from the store after a restart, owner isolation, and every error envelope. Payloads
are validated strictly with the SDK's pydantic models."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from hotloop._core import ChatFormat
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimScript, SimSession, SimSpeed
from hotloop.store.sqlite import SQLiteDatabase
from hotloop.transport import App
from openai import OpenAI
from openai.types import Model
from openai.types.responses import Response, ResponseItemList
from sdk_events import validate
from servers import serving, sim_engine
from shell_tool import TOOLS
from test_background import until
from websockets.sync.client import connect

KEY = "sk-http"
OTHER_KEY = "sk-other"
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}


def hotloop_app(data_dir: Path, script: SimScript | None = None, **config: Any) -> App:
    settings = ServerConfig(
        engine="sim", api_keys=(KEY, OTHER_KEY), data_dir=str(data_dir), **config
    )
    return App.from_config(settings, sim_engine(script))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def url(data_dir: Path) -> Iterator[str]:
    with serving(hotloop_app(data_dir)) as base:
        yield base


@pytest.fixture
def client(url: str) -> OpenAI:
    return OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)


def strict_response(raw: bytes) -> Response:
    return Response.model_validate_json(raw, strict=True)


def create_raw(client: OpenAI, **body: Any) -> Response:
    """`client.responses.create`, validating the raw body strictly first."""
    raw = client.responses.with_raw_response.create(model="sim", **body)
    strict_response(raw.http_response.content)
    return raw.parse()


def sse_events(url: str, body: dict[str, Any], key: str = KEY) -> list[dict[str, Any]]:
    """POST with `stream: true`; every frame checked: `event:` names the payload's type
    and the payload validates as the SDK's server event."""
    events: list[dict[str, Any]] = []
    headers = {"authorization": f"Bearer {key}"}
    with httpx.stream(
        "POST", url + "/v1/responses", json={**body, "stream": True}, headers=headers
    ) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        for block in reply.read().decode().split("\n\n"):
            if not block:
                continue
            name, data = block.split("\n")
            assert name.startswith("event: ") and data.startswith("data: ")
            event = validate(data[len("data: ") :])
            assert event["type"] == name[len("event: ") :]
            events.append(event)
    return events


def test_create_returns_a_strict_response(client: OpenAI) -> None:
    response = create_raw(client, input="hello")
    assert response.status == "completed"
    assert response.output_text == "Done."
    assert response.id.startswith("resp_")
    assert response.usage is not None
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert response.store is True


def test_sse_frames_are_the_websocket_payloads(url: str) -> None:
    events = sse_events(url, {"model": "sim", "input": "hello"})
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert "response.output_text.delta" in kinds
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert all("stream_id" not in e for e in events)
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "Done."


def test_sdk_streaming(client: OpenAI) -> None:
    with client.responses.create(model="sim", input="hello", stream=True) as stream:
        events = list(stream)
    assert events[0].type == "response.created"
    final = events[-1]
    assert final.type == "response.completed"
    assert final.response.output_text == "Done."


def test_retrieve_input_items_and_delete(client: OpenAI) -> None:
    items: list[Any] = [
        {"role": "developer", "content": "Be terse."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "one"}]},
        {"role": "user", "content": "two"},
    ]
    created = create_raw(client, input=items)
    raw = client.responses.with_raw_response.retrieve(created.id)
    assert strict_response(raw.http_response.content) == created

    raw_items = client.responses.input_items.with_raw_response.list(created.id, order="asc")
    listed = ResponseItemList.model_validate_json(raw_items.http_response.content, strict=True)
    assert [item.type for item in listed.data] == ["message"] * 3
    texts = [item.content[0].text for item in listed.data]  # type: ignore[union-attr]
    assert texts == ["Be terse.", "one", "two"]
    # Auto-pagination walks the `after` cursor one item at a time, newest first.
    walked = [item.id for item in client.responses.input_items.list(created.id, limit=1)]
    assert walked == [item.id for item in reversed(listed.data)]

    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(created.id)


def test_previous_response_id_continues_warm_state(client: OpenAI, url: str) -> None:
    first = create_raw(client, input="hello", instructions="Be terse.")
    second = create_raw(
        client, input="and again", previous_response_id=first.id, instructions="Be terse."
    )
    assert second.previous_response_id == first.id
    assert second.usage is not None and first.usage is not None
    # Only the new item was rendered: the whole first turn came from the cache.
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    metrics = httpx.get(url + "/metrics").text
    assert "hotloop_cache_hits_total 0" not in metrics


def test_store_false_leaves_nothing_behind(client: OpenAI) -> None:
    response = create_raw(client, input="secret", store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="sim", input="more", previous_response_id=response.id)
    assert refused.value.code == "previous_response_not_found"
    assert refused.value.param == "previous_response_id"


def test_a_poisoned_tool_list_costs_no_one_else(url: str) -> None:
    """Issue 15 item 2: a tool carrying a number outside f64 made the request a bare 500,
    its usage was never booked, and booking could stop for everyone. Now the request is
    refused (by the core) or failed unacknowledged (by the store), and the next request
    of another key is served, stored and booked."""
    poisoned = (
        b'{"model":"sim","input":"hi","tools":[{"type":"function","name":"f",'
        b'"parameters":{"type":"object"},"zz":1e999}]}'
    )
    reply = httpx.post(
        url + "/v1/responses",
        content=poisoned,
        headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
    )
    assert (reply.status_code, reply.json()["error"]["code"]) in (
        (400, "invalid_value"),
        (503, "store_unavailable"),
    )
    other = {"authorization": f"Bearer {OTHER_KEY}"}
    before = httpx.get(url + "/v1/usage", headers=other).json()["responses"]
    served = httpx.post(url + "/v1/responses", json={"model": "sim", "input": "hi"}, headers=other)
    assert served.status_code == 200
    assert httpx.get(f"{url}/v1/responses/{served.json()['id']}", headers=other).status_code == 200
    assert httpx.get(url + "/v1/usage", headers=other).json()["responses"] == before + 1


def test_another_key_sees_nothing(client: OpenAI, url: str) -> None:
    mine = create_raw(client, input="mine")
    other = OpenAI(base_url=url + "/v1", api_key=OTHER_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(mine.id)
    with pytest.raises(openai.BadRequestError) as refused:
        other.responses.create(model="sim", input="steal", previous_response_id=mine.id)
    assert refused.value.code == "previous_response_not_found"
    assert client.responses.retrieve(mine.id).id == mine.id


def test_a_restarted_server_continues_from_the_store(tmp_path: Path) -> None:
    with serving(hotloop_app(tmp_path)) as base:
        client = OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
        first = create_raw(client, input="remember this", instructions="Be terse.")
        second = create_raw(client, input="and this", previous_response_id=first.id)
    # The sampled ids are stored verbatim beside the response.
    database = SQLiteDatabase(tmp_path / "responses.sqlite3")
    chain = database.chain(second.id, None)
    database.close()
    assert [r.id for r in chain] == [second.id, first.id]
    assert ChatFormat.harmony().tokenizer.decode(chain[0].output_token_ids).endswith("Done.<|end|>")
    with serving(hotloop_app(tmp_path)) as base:
        client = OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
        assert client.responses.retrieve(second.id) == second
        third = create_raw(client, input="what now", previous_response_id=second.id)
        assert third.status == "completed"
        assert third.previous_response_id == second.id
        assert third.usage is not None and second.usage is not None
        # The rebuilt chain is served from the cache like a warm one.
        assert third.usage.input_tokens > second.usage.input_tokens
        assert third.usage.input_tokens_details.cached_tokens > 0
        metrics = httpx.get(base + "/metrics").text
        assert "hotloop_store_rebuilds_total 1" in metrics


def test_a_websocket_continues_a_stored_response_read_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A WebSocket cache miss with store=true rebuilds from the store like HTTP does:
    the read runs in the store's thread (it used to be a synchronous read on the
    event loop's thread, which stalled every connection)."""
    readers: list[str] = []
    chain = SQLiteDatabase.chain

    def recording_chain(self: SQLiteDatabase, response_id: str, owner: str | None) -> Any:
        readers.append(threading.current_thread().name)
        return chain(self, response_id, owner)

    monkeypatch.setattr(SQLiteDatabase, "chain", recording_chain)
    headers = {"Authorization": f"Bearer {KEY}"}
    create = {"type": "response.create", "model": "sim", "input": "remember this"}

    def turn(base: str, event: dict[str, Any]) -> dict[str, Any]:
        url = base.replace("http://", "ws://") + "/v1/responses"
        with connect(url, additional_headers=headers) as ws:
            ws.send(orjson.dumps(event).decode())
            while (frame := validate(ws.recv()))["type"] not in TERMINAL:
                pass
        return frame["response"]

    with serving(hotloop_app(tmp_path)) as base:
        first = turn(base, create)
    # A restarted server: nothing cached, the chain is only in the database.
    with serving(hotloop_app(tmp_path)) as base:
        second = turn(base, {**create, "input": "and this", "previous_response_id": first["id"]})
    assert second["status"] == "completed"
    assert second["usage"]["input_tokens_details"]["cached_tokens"] > 0
    assert readers and all(name.startswith("hotloop-store") for name in readers)


def test_tool_loop_over_http(tmp_path: Path) -> None:
    script = SimScript(text="All done.", tool="exec_command", tool_calls=2, tool_arguments="{}")
    with serving(hotloop_app(tmp_path, script)) as base:
        client = OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
        response = create_raw(client, input="list files", tools=TOOLS)
        calls = 0
        while True:
            fc = [item for item in response.output if item.type == "function_call"]
            if not fc:
                break
            calls += 1
            output = [{"type": "function_call_output", "call_id": fc[0].call_id, "output": "ok"}]
            response = create_raw(
                client, input=output, tools=TOOLS, previous_response_id=response.id
            )
        assert calls == 2
        assert response.output_text == "All done."

        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(
                model="sim",
                tools=TOOLS,
                previous_response_id=response.id,
                input=[{"type": "function_call_output", "call_id": "call_nope", "output": "x"}],
            )
        assert refused.value.param is not None and refused.value.param.startswith("input")


def test_models_usage_health(client: OpenAI, url: str) -> None:
    raw = client.models.with_raw_response.list()
    listed = orjson.loads(raw.http_response.content)
    assert [Model.model_validate(m, strict=True).id for m in listed["data"]] == ["sim"]
    assert client.models.retrieve("sim").id == "sim"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-nothing")

    create_raw(client, input="count me")
    headers = {"authorization": f"Bearer {KEY}"}
    usage = httpx.get(url + "/v1/usage", headers=headers).json()
    assert usage["key"].startswith("key_") and KEY not in usage["key"]
    assert usage["responses"] >= 1 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    metrics = httpx.get(url + "/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert f'hotloop_usage_tokens_total{{key="{usage["key"]}",kind="output"}}' in metrics.text
    assert 'hotloop_turns_total{transport="http",outcome="completed"}' in metrics.text
    assert httpx.get(url + "/health").json()["status"] == "ok"


def error_of(reply: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["message"]
    return error


def test_bad_requests_get_clear_errors(url: str) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    post = url + "/v1/responses"
    error = error_of(
        httpx.post(post, content=b'{"model": "sim", "input": ', headers=auth), 400, "invalid_json"
    )
    assert error["type"] == "invalid_request_error"
    # Background responses are served (test_background.py), stored ones only.
    refused = {"model": "sim", "input": "x", "background": True, "store": False}
    error = error_of(httpx.post(post, json=refused, headers=auth), 400, "invalid_value")
    assert error["param"] == "store"
    error = error_of(
        httpx.post(
            post,
            json={"model": "sim", "input": "x", "previous_response_id": "resp_unknown"},
            headers=auth,
        ),
        400,
        "previous_response_not_found",
    )
    assert error["param"] == "previous_response_id" and "resp_unknown" in error["message"]
    error_of(httpx.get(url + "/v1/responses/resp_unknown", headers=auth), 404, "response_not_found")
    error_of(
        httpx.get(url + "/v1/responses/resp_x/input_items?limit=0", headers=auth),
        400,
        "invalid_value",
    )
    error_of(
        httpx.get(url + "/v1/responses/resp_x/input_items?order=up", headers=auth),
        400,
        "invalid_value",
    )
    error_of(httpx.put(post, headers=auth), 405, "method_not_allowed")
    error_of(httpx.get(url + "/v1/nothing", headers=auth), 404, "not_found")


def test_auth_failures(url: str) -> None:
    post = url + "/v1/responses"
    body = {"model": "sim", "input": "x"}
    for headers, code in (
        ({}, "missing_api_key"),
        ({"authorization": "Bearer sk-wrong"}, "invalid_api_key"),
        ({"authorization": "Basic sk-http"}, "invalid_api_key"),
    ):
        reply = httpx.post(post, json=body, headers=headers)
        error = error_of(reply, 401, code)
        assert error["type"] == "authentication_error"
        assert reply.headers["www-authenticate"] == "Bearer"
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=url + "/v1", api_key="sk-wrong", max_retries=0).models.list()
    # Health and metrics stay open for probes and scrapers.
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/metrics").status_code == 200


def test_oversize_body(tmp_path: Path) -> None:
    with serving(hotloop_app(tmp_path, max_frame_bytes=1024)) as base:
        reply = httpx.post(
            base + "/v1/responses",
            json={"model": "sim", "input": "x" * 4096},
            headers={"authorization": f"Bearer {KEY}"},
        )
        error_of(reply, 413, "request_too_large")


def test_websocket_and_http_share_the_store(client: OpenAI) -> None:
    """A stored HTTP response continues on a new socket (rebuilt from the store), and a
    stored WebSocket response is readable over HTTP and continues on another socket."""
    over_http = create_raw(client, input="started over HTTP")

    def one_turn(**body: Any) -> Any:
        with client.responses.connect() as conn:
            conn.response.create(model="sim", **body)
            while True:
                raw = conn.recv_bytes()
                event = validate(raw)
                if event["type"] in TERMINAL or event["type"] == "error":
                    break
            assert event["type"] == "response.completed", event
            return conn.parse_event(raw).response  # type: ignore[union-attr]

    continued = one_turn(input="go on", previous_response_id=over_http.id)
    assert continued.previous_response_id == over_http.id
    assert continued.usage.input_tokens_details.cached_tokens > 0
    stored = client.responses.retrieve(continued.id)
    assert stored.id == continued.id and stored.output_text == "Done."
    again = one_turn(input="and on", previous_response_id=continued.id)
    assert again.previous_response_id == continued.id

    private = one_turn(input="not kept", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(private.id)


def test_a_metadata_key_named_previous_response_id_does_not_hide_the_real_one(
    client: OpenAI, url: str
) -> None:
    """Issue 15 item 7: the warm-up read the first `"previous_response_id": "..."` of the
    raw frame; a metadata key of that name placed first made a valid continuation on a
    new socket fail. The store is now read for the top-level field the core parsed."""
    stored = create_raw(client, input="started over HTTP")
    frame = (
        '{"type":"response.create","model":"sim","metadata":{"previous_response_id":'
        f'"resp_decoy"}},"previous_response_id":"{stored.id}","input":"go on"}}'
    )
    ws_url = url.replace("http://", "ws://") + "/v1/responses"
    with connect(ws_url, additional_headers={"authorization": f"Bearer {KEY}"}) as ws:
        ws.send(frame)
        while (event := validate(ws.recv(timeout=30)))["type"] not in {*TERMINAL, "error"}:
            pass
    assert event["type"] == "response.completed", event
    assert event["response"]["previous_response_id"] == stored.id
    assert event["response"]["metadata"] == {"previous_response_id": "resp_decoy"}


def test_a_client_that_disconnects_mid_stream_cancels_generation(tmp_path: Path) -> None:
    slow = SimSpeed(tokens_per_second=50.0, ttft=0.0, prefill_tokens_per_second=1e9)
    text = " ".join(f"word{i}" for i in range(500))  # about 20 s at this speed
    settings = ServerConfig(engine="sim", api_keys=(KEY,), data_dir=str(tmp_path))
    app = App.from_config(settings, sim_engine(SimScript(text=text), slow))
    assert app.ledger is not None
    drain = app.ledger.drain
    ended = threading.Event()
    release = drain.release

    def released() -> None:
        release()
        ended.set()

    drain.release = released  # type: ignore[method-assign]
    headers = {"authorization": f"Bearer {KEY}"}
    with serving(app) as base:
        body = {"model": "sim", "input": "talk", "stream": True}
        with httpx.stream("POST", base + "/v1/responses", json=body, headers=headers) as reply:
            for line in reply.iter_lines():
                if line.startswith("data: ") and "response.output_text.delta" in line:
                    break
        # Leaving the block closed the connection mid-stream.
        assert ended.wait(60)
        assert drain.in_flight == 0
        # The server is fine, and the abandoned response was booked (issue 21 defect 2).
        quick = httpx.post(
            base + "/v1/responses",
            json={"model": "sim", "input": "short", "max_output_tokens": 2},
            headers=headers,
        )
        assert quick.json()["status"] == "incomplete"
        assert httpx.get(base + "/v1/usage", headers=headers).json()["responses"] == 2


class HeldClose:
    """An engine stream whose close (`close_stream`, after the stop token) waits until
    `release` is set (at most 30 s): as vLLM's stream, read to its usage and end."""

    def __init__(self, stream: Any, holding: threading.Event, release: threading.Event) -> None:
        self.stream, self.holding, self.release = stream, holding, release

    def __aiter__(self) -> HeldClose:
        return self

    async def __anext__(self) -> list[int]:
        batch: list[int] = await self.stream.__anext__()
        return batch

    async def aclose(self) -> None:
        self.holding.set()
        await asyncio.to_thread(self.release.wait, 30)
        await self.stream.aclose()


@pytest.mark.parametrize("transport", ["json", "sse", "websocket"])
def test_a_response_ends_before_its_engine_stream_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    """The terminal event (over HTTP, the end of the body; without `stream`, the whole
    Response) goes out once the engine's stop token is parsed, not after the engine's
    stream has closed: a client (an agent that runs its tool next) waits for nothing
    after the answer."""
    holding, release = threading.Event(), threading.Event()
    generate = SimSession.generate

    def held(self: SimSession, *args: Any, **kwargs: Any) -> HeldClose:
        return HeldClose(generate(self, *args, **kwargs), holding, release)

    monkeypatch.setattr(SimSession, "generate", held)
    body = {"model": "sim", "input": "hello", "store": False}
    headers = {"authorization": f"Bearer {KEY}"}
    try:
        with serving(hotloop_app(tmp_path)) as base:
            if transport == "json":
                reply = httpx.post(base + "/v1/responses", json=body, headers=headers, timeout=10)
                terminal = {"type": f"response.{reply.json()['status']}"}
            elif transport == "sse":
                with httpx.stream(
                    "POST",
                    base + "/v1/responses",
                    json={**body, "stream": True},
                    headers=headers,
                    timeout=10,
                ) as reply:
                    text = reply.read().decode()  # the whole body: its end too
                last = [b for b in text.split("\n\n") if b.strip()][-1]
                terminal = orjson.loads(last.split("data: ", 1)[1])
            else:
                url = base.replace("http://", "ws://") + "/v1/responses"
                with connect(url, additional_headers=headers) as ws:
                    ws.send(orjson.dumps({"type": "response.create", **body}).decode())
                    while (terminal := orjson.loads(ws.recv(timeout=10)))["type"] not in TERMINAL:
                        pass
            assert terminal["type"] == "response.completed"
            assert holding.is_set() and not release.is_set()
            release.set()
    finally:
        release.set()


def spy_parses(monkeypatch: pytest.MonkeyPatch, seen: Callable[[Any, Any], Any]) -> list[Any]:
    """`seen(body, parsed)` of each body the HTTP routes parse (Responses and Chat
    Completions), in order (a function of them, not them: kept, they would keep a pooled
    body from its pool)."""
    import hotloop.transport.http as http

    parses: list[Any] = []

    def recorded(parse: Any) -> Any:
        def recording(body: Any, *args: Any) -> Any:
            result = parse(body, *args)
            parses.append(seen(body, result))
            return result

        return recording

    for name in ("parse_request", "parse_chat_request"):
        monkeypatch.setattr(http, name, recorded(getattr(http, name)))
    return parses


@pytest.mark.parametrize("whole_history", ["bytes", "items", "off"])
def test_a_resent_history_is_recognized_by_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole_history: str
) -> None:
    """Over HTTP, on both APIs, the second whole-history request of a key has what the
    first sent recognized, not parsed (`whole_history` bytes); with items or off it is
    parsed whole. The usage is the same either way but off, where nothing is cached;
    another key's request is never recognized."""
    recognized = spy_parses(monkeypatch, lambda _, r: getattr(r, "request", r).seen_items)
    headers = {"authorization": f"Bearer {KEY}"}
    first = [{"role": "user", "content": "hello"}]
    chat = [{"role": "system", "content": "Be terse."}, *first]
    with serving(hotloop_app(tmp_path, whole_history=whole_history)) as base:
        usage = []
        for path, field, history in (
            ("responses", "input", first),
            ("chat/completions", "messages", chat),
        ):
            body: dict[str, Any] = {"model": "sim", field: history, "store": False}
            reply = httpx.post(f"{base}/v1/{path}", json=body, headers=headers).json()
            answer = reply["output"] if path == "responses" else [reply["choices"][0]["message"]]
            body[field] = [*history, *answer, {"role": "user", "content": "more"}]
            reply = httpx.post(f"{base}/v1/{path}", json=body, headers=headers).json()
            usage.append(reply["usage"])
            other = {"authorization": f"Bearer {OTHER_KEY}"}
            httpx.post(f"{base}/v1/{path}", json=body, headers=other).raise_for_status()
    expected = {"bytes": [0, 1, 0, 0, 1, 0]}.get(whole_history, [0] * 6)
    assert recognized == expected
    cached = [
        u.get("input_tokens_details", u.get("prompt_tokens_details"))["cached_tokens"]
        for u in usage
    ]
    assert all(cached) == (whole_history != "off")


@pytest.mark.parametrize(
    ("path", "field"), [("responses", "input"), ("chat/completions", "messages")]
)
@pytest.mark.parametrize("value", [b"1e999", b'"\\ud800"'])
def test_a_value_refused_after_a_resent_history_is_refused_every_time(
    tmp_path: Path, path: str, field: str, value: bytes
) -> None:
    """The elements a key was served are not checked again when it resends them; a value
    a strict parser refuses in what comes after them (an unknown field is read past, not
    decoded) still is, located at its element, and a refused request is not remembered:
    sent again, it is refused again."""
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    history: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
    with serving(hotloop_app(tmp_path, whole_history="bytes")) as base:
        body: dict[str, Any] = {"model": "sim", field: history, "store": False}
        reply = httpx.post(f"{base}/v1/{path}", json=body, headers=headers).json()
        answer = reply["output"] if path == "responses" else [reply["choices"][0]["message"]]
        history = [*history, *answer]
        bad = {"role": "user", "content": "more", "zz": 0}
        raw = orjson.dumps({"model": "sim", field: [*history, bad], "store": False})
        raw = raw.replace(b'"zz":0', b'"zz":' + value)
        for _ in range(2):
            refused = httpx.post(f"{base}/v1/{path}", content=raw, headers=headers)
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert (error["code"], error["param"]) == (
                "invalid_value",
                f"{field}[{len(history)}].zz",
            )
        # The history itself is still the key's: resent with a good item, it is served.
        good = {"model": "sim", field: [*history, {"role": "user", "content": "ok"}]}
        served = httpx.post(f"{base}/v1/{path}", json={**good, "store": False}, headers=headers)
        assert served.status_code == 200, served.text


@pytest.mark.parametrize("path", ["responses/compact", "responses/input_tokens", "trigger"])
def test_a_resent_history_is_compacted_and_counted_whole(tmp_path: Path, path: str) -> None:
    """compact, input_tokens and a turn ending in `compaction_trigger` render a request's
    whole input anew: a history the key sent before is parsed whole for them, not left
    recognized by its bytes (only a turn continuing the state holding it can take that:
    Codex's remote compaction and input_tokens got 400 invalid_value)."""
    headers = {"authorization": f"Bearer {KEY}"}
    history: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
    with serving(hotloop_app(tmp_path, whole_history="bytes")) as base:
        body = {"model": "sim", "input": history, "store": False}
        reply = httpx.post(f"{base}/v1/responses", json=body, headers=headers).json()
        history = [*history, *reply["output"], {"role": "user", "content": "more"}]
        body = {"model": "sim", "input": history, "store": False}
        httpx.post(f"{base}/v1/responses", json=body, headers=headers).raise_for_status()
        if path == "trigger":
            path, body = "responses", {**body, "input": [*history, {"type": "compaction_trigger"}]}
        again = httpx.post(f"{base}/v1/{path}", json=body, headers=headers)
    assert again.status_code == 200, again.text


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("path", "field"), [("responses", "input"), ("chat/completions", "messages")]
)
def test_a_kept_alive_connection_does_not_hold_the_request_it_answered(
    tmp_path: Path, path: str, field: str, stream: bool
) -> None:
    """The reply ends with the terminal event, written from the engine's task; uvicorn
    then arms the connection's keep-alive timer, which keeps the context it was armed
    in until the next request. That context must not hold the request (`SERVING`): a
    resent history's body would stay alive through every agent's think time."""
    from hotloop._core import Body

    Body.release_pool()  # the pool is the process's: earlier tests' buffers out
    text = "a line of an earlier tool's output\n" * (Body.POOLED_BYTES // 20)
    history = [{"role": "user", "content": text}]
    raw = orjson.dumps({"model": "sim", field: history, "stream": stream, "store": False})
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    # A timer longer than `until` polls: a body it held would never come back.
    app = hotloop_app(tmp_path, heap_trim_interval=0)
    with serving(app, timeout_keep_alive=120) as base, httpx.Client(timeout=10) as client:
        reply = client.post(f"{base}/v1/{path}", content=raw, headers=headers)
        assert reply.status_code == 200, reply.text
        # The connection stays open and idle; the body's buffer goes back to the pool.
        assert until(lambda: Body.pooled()[0] >= 1)


@pytest.mark.parametrize(
    ("path", "field"), [("responses", "input"), ("chat/completions", "messages")]
)
def test_a_large_resent_history_is_read_into_a_reused_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str, field: str
) -> None:
    """A whole-history body declared at least `Body.POOLED_BYTES` long is written into a
    pooled `Body`, not joined into new bytes: served as the same body sent compressed
    (read as bytes) is, recognized by its bytes the next turn, refused where a bad value
    follows it, and its buffer reused by the next such request instead of mapped anew."""
    import gzip

    from hotloop._core import Body

    bodies = spy_parses(monkeypatch, lambda body, _: type(body))
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    other = {**headers, "authorization": f"Bearer {OTHER_KEY}"}
    text = "a line of an earlier tool's output\n" * (Body.POOLED_BYTES // 20)
    history: list[dict[str, Any]] = [{"role": "user", "content": text}]
    # No heap trim meanwhile: it would empty the pool between the requests.
    with serving(hotloop_app(tmp_path, whole_history="bytes", heap_trim_interval=0)) as base:
        url = f"{base}/v1/{path}"

        def post(history: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
            raw = orjson.dumps({"model": "sim", field: history, "store": False})
            assert len(raw) >= Body.POOLED_BYTES
            reply = httpx.post(url, content=raw, headers=kw.get("headers", headers))
            assert reply.status_code == 200, reply.text
            body: dict[str, Any] = reply.json()
            return body

        first = post(history)
        answer = first["output"] if path == "responses" else [first["choices"][0]["message"]]
        history = [*history, *answer, {"role": "user", "content": "more"}]
        # The reply goes out with the terminal event; the request's buffer goes back
        # to the pool once its handler has finished.
        pooled = until(lambda: (p := Body.pooled())[0] >= 1 and p)
        resent = post(history)
        # The second request took the buffer the first one left, and gave it back.
        assert until(lambda: Body.pooled() == pooled)
        usage = resent["usage"]
        cached = usage.get("input_tokens_details", usage.get("prompt_tokens_details"))
        assert cached["cached_tokens"] > 0
        # Sent compressed by another key, it is read as bytes and rendered whole: the
        # same prompt, token for token.
        raw = orjson.dumps({"model": "sim", field: history, "store": False})
        compressed = httpx.post(
            url, content=gzip.compress(raw), headers={**other, "content-encoding": "gzip"}
        )
        assert compressed.status_code == 200, compressed.text
        tokens = "input_tokens" if path == "responses" else "prompt_tokens"
        assert compressed.json()["usage"][tokens] == usage[tokens]
        # A bad value after the resent history is refused, located at its element.
        bad = orjson.dumps({"model": "sim", field: [*history, {"role": "user", "content": 1}]})
        refused = httpx.post(url, content=bad, headers=headers)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"].startswith(f"{field}[{len(history)}]")
    assert bodies == [Body, Body, bytes, Body]


def test_a_client_that_leaves_mid_body_gives_its_buffer_back(tmp_path: Path) -> None:
    """A large body abandoned halfway (the client closes its socket) ends its request;
    the pooled buffer it was being written into goes back to the pool, where the next
    large body finds it, and the server serves on."""
    import socket

    from hotloop._core import Body

    size = Body.POOLED_BYTES * 2
    Body.release_pool()  # the pool is the process's: earlier tests' buffers out
    with serving(hotloop_app(tmp_path, heap_trim_interval=0)) as base:
        host, port = base.removeprefix("http://").split(":")
        head = (
            f"POST /v1/responses HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {KEY}\r\n"
            f"content-type: application/json\r\ncontent-length: {size}\r\n\r\n"
        )
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(head.encode() + b'{"model":"sim","input":"' + b"x" * (size // 2))
        pooled = until(lambda: Body.pooled()[0] == 1 and Body.pooled())
        # As large a body, of a short request (JSON allows the whitespace).
        raw = orjson.dumps({"model": "sim", "input": "hi", "store": False})
        raw = raw[:-1] + b" " * (size - len(raw)) + b"}"
        reply = httpx.post(
            base + "/v1/responses",
            content=raw,
            headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
        )
        assert reply.status_code == 200, reply.text
        # The served body took the abandoned one's buffer and gave it back.
        assert Body.pooled() == pooled
