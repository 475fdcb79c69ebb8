"""`response.steer` spoken by the real openai SDK over a socket
(`conn.response.steer(...)`), and Codex's `response.interrupt` on the SDK's connection:
every frame validated strictly (tests/sdk_events.py) by the server fixture and again
here, the steer events parsed into the SDK's own types."""

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

TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}
# Long reasoning decoded at a modest rate: the response is still sampling it when the
# steer, sent on its first delta, arrives (the test accepts `completed` all the same).
SCRIPT = SimScript(turns=(SimTurn(reasoning="Let me think. " * 60, text="Bonjour."),))
SPEED = SimSpeed(tokens_per_second=400.0, ttft=0.0, prefill_tokens_per_second=1e9)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with hotloop_server(SCRIPT, SPEED, api_keys=("sk-test",)) as url:
        yield url + "/v1"


def test_sdk_steer_starts_a_successor_on_the_same_lane(base_url: str) -> None:
    client = OpenAI(base_url=base_url, api_key="sk-test")
    with client.responses.connect() as conn:
        conn.response.create(model="sim", input="Say hello.", store=False, max_output_tokens=4000)
        events: list[dict[str, Any]] = []
        typed: list[Any] = []
        target: str | None = None
        steered = False
        while True:
            raw = conn.recv_bytes()
            event = validate(raw)
            events.append(event)
            typed.append(conn.parse_event(raw))
            if event["type"] == "response.created" and target is None:
                target = event["response"]["id"]
            if event["type"] == "response.reasoning_text.delta" and not steered:
                assert target is not None
                steered = True
                conn.response.steer(input="Answer in French.", previous_response_id=target)
            created = [e for e in events if e["type"] == "response.created"]
            if len(created) == 2 and event["type"] in TERMINAL:
                break
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
