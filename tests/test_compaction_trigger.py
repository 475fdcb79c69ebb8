"""Remote compaction V2, as Codex asks for it: a request whose input ends with
`{"type": "compaction_trigger"}` is answered by a response whose output is exactly one
`compaction` item (the engine's summary, sealed), over HTTP (JSON and SSE, the real
openai SDK) and WebSocket; the item sent back as input continues the conversation from
the summary, and a trigger anywhere but last is refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hotloop.protocol.compaction import PREFIX
from openai import OpenAI
from openai.types.responses import Response
from servers import stored_server
from websockets.sync.client import connect

KEY = "sk-trigger"
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
HISTORY: list[dict[str, Any]] = [
    {"type": "message", "role": "user", "content": "Fix the failing test."},
    {"type": "message", "role": "assistant", "content": "Done: it passes now."},
]
TRIGGER = {"type": "compaction_trigger"}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with stored_server(str(tmp_path_factory.mktemp("store")), api_keys=(KEY,)) as base:
        yield base


@pytest.fixture
def client(url: str) -> OpenAI:
    return OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)


def one_compaction(output: list[dict[str, Any]]) -> dict[str, Any]:
    assert [item["type"] for item in output] == ["compaction"]
    item = output[0]
    assert item["encrypted_content"].startswith(PREFIX)
    return item


def ws_turn(ws: Any, **fields: Any) -> list[dict[str, Any]]:
    ws.send(orjson.dumps({"type": "response.create", "model": "sim", **fields}).decode())
    events = []
    while True:
        event: dict[str, Any] = orjson.loads(ws.recv())
        events.append(event)
        if event["type"] in TERMINAL or event["type"] == "error":
            return events


def test_http_answers_one_compaction_item_that_continues_the_conversation(
    client: OpenAI,
) -> None:
    raw = client.responses.with_raw_response.create(
        model="sim",
        input=[*HISTORY, TRIGGER],  # type: ignore[list-item]
        store=False,
    )
    response = Response.model_validate_json(raw.http_response.content, strict=True)
    assert response.status == "completed"
    assert response.usage is not None and response.usage.output_tokens > 0
    item = one_compaction(raw.http_response.json()["output"])
    # Sent back in place of the history, as Codex does: the next turn runs on it.
    after = client.responses.create(
        model="sim",
        input=[item, {"type": "message", "role": "user", "content": "Now the docs."}],
        store=False,
    )
    assert after.status == "completed" and after.output_text


def test_a_stored_trigger_response_is_continued_by_previous_response_id(client: OpenAI) -> None:
    first = client.responses.create(model="sim", input="Fix the failing test.")
    compacted = client.responses.create(
        model="sim",
        input=[TRIGGER],  # type: ignore[list-item]
        previous_response_id=first.id,
    )
    assert [item.type for item in compacted.output] == ["compaction"]
    after = client.responses.create(
        model="sim", input="Now the docs.", previous_response_id=compacted.id
    )
    assert after.status == "completed" and after.output_text


def test_sse_streams_the_compaction_item_then_completes(url: str) -> None:
    body = {"model": "sim", "input": [*HISTORY, TRIGGER], "stream": True, "store": False}
    events = []
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", f"{url}/v1/responses", json=body, headers=headers) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: "):
                events.append(orjson.loads(line[6:]))
    kinds = [event["type"] for event in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    one_compaction(events[-1]["response"]["output"])
    assert events[3]["item"] == events[-1]["response"]["output"][0]


def test_websocket_answers_one_compaction_item_and_continues_from_it(url: str) -> None:
    ws_url = url.replace("http://", "ws://") + "/v1/responses"
    with connect(ws_url, additional_headers={"authorization": f"Bearer {KEY}"}) as ws:
        events = ws_turn(ws, input=[*HISTORY, TRIGGER], store=False)
        assert events[-1]["type"] == "response.completed"
        item = one_compaction(events[-1]["response"]["output"])
        user = {"type": "message", "role": "user", "content": "Next step?"}
        after = ws_turn(ws, input=[item, user], store=False)
        assert after[-1]["type"] == "response.completed"


def test_a_trigger_that_is_not_the_last_item_is_refused(url: str) -> None:
    body = {"model": "sim", "input": [TRIGGER, *HISTORY]}
    reply = httpx.post(f"{url}/v1/responses", json=body, headers={"authorization": f"Bearer {KEY}"})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "input[0]"
