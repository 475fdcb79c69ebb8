"""`response.steer` spoken by the real openai SDK over a socket
(`conn.response.steer(...)`), and Codex's `response.interrupt` on the SDK's connection:
every frame validated strictly (tests/sdk_events.py) by the server fixture and again
here, the steer events parsed into the SDK's own types. A steered turn on a
conversation appends its successor (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hotloop.engines.sim import SimScript, SimSpeed, SimTurn
from openai import OpenAI
from openai.types.responses import ResponseSteerAcceptedEvent
from sdk_events import validate
from servers import hotloop_server
from test_conversations import all_items, rendered_items, served, user

TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}
# Long reasoning decoded at a modest rate: the response is still sampling it when the
# steer, sent on its first delta, arrives (the test accepts `completed` all the same).
SCRIPT = SimScript(turns=(SimTurn(reasoning="Let me think. " * 60, text="Bonjour."),))
SPEED = SimSpeed(tokens_per_second=400.0, ttft=0.0, prefill_tokens_per_second=1e9)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with hotloop_server(SCRIPT, SPEED, api_keys=("sk-test",)) as url:
        yield url + "/v1"


def steered(conn: Any) -> list[bytes]:
    """Every frame up to the successor's terminal event (validated), the response just
    created steered to answer in French at its first reasoning delta."""
    frames: list[bytes] = []
    target: str | None = None
    first_delta = False
    ended = 0
    while ended < 2:
        frames.append(raw := conn.recv_bytes())
        event = validate(raw)
        if event["type"] == "response.created" and target is None:
            target = event["response"]["id"]
            first_delta = True
        if event["type"] == "response.reasoning_text.delta" and first_delta:
            first_delta = False
            conn.response.steer(input="Answer in French.", previous_response_id=target)
        ended += event["type"] in TERMINAL
    return frames


def test_sdk_steer_starts_a_successor_on_the_same_lane(base_url: str) -> None:
    client = OpenAI(base_url=base_url, api_key="sk-test")
    with client.responses.connect() as conn:
        conn.response.create(model="sim", input="Say hello.", store=False, max_output_tokens=4000)
        frames = steered(conn)
        events = [orjson.loads(raw) for raw in frames]
        typed = [conn.parse_event(raw) for raw in frames]
        target = events[0]["response"]["id"]
        accepted = [t for t in typed if isinstance(t, ResponseSteerAcceptedEvent)]
        assert len(accepted) == 1 and accepted[0].steer.previous_response_id == target
        assert accepted[0].steer.id.startswith("steer_")
        ended = next(e for e in events if e["type"] in TERMINAL)["response"]
        assert ended["id"] == target
        assert ended["status"] == "completed" or ended["incomplete_details"] == {
            "reason": "steered"
        }
        successor = [e for e in events if e["type"] == "response.created"][1]
        assert successor["response"]["previous_response_id"] == target
        assert successor["response"]["max_output_tokens"] == 4000
        last = events[-1]["response"]
        assert last["status"] == "completed" and last["previous_response_id"] == target
        assert last["usage"]["input_tokens_details"]["cached_tokens"] > 0


def test_interrupt_over_the_socket_then_continue(base_url: str) -> None:
    """Codex's `response.interrupt`, sent raw on the SDK's connection (the SDK has no
    method for it): the interrupted id is continued on the same socket."""
    client = OpenAI(base_url=base_url, api_key="sk-test")
    with client.responses.connect() as conn:
        conn.response.create(model="sim", input="Say hello.", store=False)
        kinds: list[str] = []
        target = ""
        while True:
            event = validate(conn.recv_bytes())
            kinds.append(event["type"])
            if event["type"] == "response.created":
                target = event["response"]["id"]
            if event["type"] == "response.reasoning_text.delta" and kinds.count(event["type"]) == 1:
                conn.send_raw(
                    orjson.dumps(
                        {
                            "type": "response.interrupt",
                            "response_id": target,
                            "mode": "discard_partial_items",
                        }
                    ).decode()
                )
            if event["type"] in TERMINAL:
                break
        assert event["type"] == "response.incomplete", kinds
        assert event["response"]["incomplete_details"] == {"reason": "interrupted"}
        assert event["response"]["output"] == []
        assert kinds[-3:-1] == ["response.interrupt.accepted", "response.output_item.interrupted"]
        conn.response.create(model="sim", input="Go on.", previous_response_id=target)
        while (event := validate(conn.recv_bytes()))["type"] not in TERMINAL:
            pass
        assert event["type"] == "response.completed"
        assert event["response"]["previous_response_id"] == target


def test_a_steered_turn_on_a_conversation_appends_its_successor(
    store_settings: dict[str, str],
) -> None:
    with served(SCRIPT, SPEED, api_keys=("sk-test",), **store_settings) as url:
        client = OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
        conversation = client.conversations.create(items=[user("remember 7")])
        with client.responses.connect() as conn:
            conn.response.create(model="sim", input="Say hello.", conversation=conversation.id)
            events = [orjson.loads(raw) for raw in steered(conn)]
            first, successor = [e["response"] for e in events if e["type"] in TERMINAL]
            assert successor["previous_response_id"] == first["id"]
            assert successor["conversation"] == {"id": conversation.id}
            # Everything both turns saw and said, in order, is the conversation's.
            items = all_items(client, conversation.id)
            said = [i.id for i in items if i.type == "reasoning" or i.role == "assistant"]  # type: ignore[union-attr]
            assert said == [o["id"] for o in first["output"] + successor["output"]]
            asked = [i.content[0].text for i in items if i.type == "message" and i.role == "user"]  # type: ignore[union-attr]
            assert asked == ["remember 7", "Say hello.", "Answer in French."]
            # The next turn continues the successor's state: nothing rendered again.
            before = rendered_items(url + "/v1")
            conn.response.create(model="sim", input="And now?", conversation=conversation.id)
            while (event := validate(conn.recv_bytes()))["type"] not in TERMINAL:
                pass
            assert event["type"] == "response.completed"
            assert rendered_items(url + "/v1") == before
            usage = successor["usage"]
            cached = event["response"]["usage"]["input_tokens_details"]["cached_tokens"]
            assert cached >= usage["input_tokens"] + usage["output_tokens"] - 1
