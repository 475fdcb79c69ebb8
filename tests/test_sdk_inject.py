"""The long-running response over a real socket, spoken by the openai SDK's beta
Responses connection (`client.beta.responses.connect()`, `conn.response.inject(...)`)
with the `OpenAI-Beta: responses_multi_agent=v1` header: every frame validated strictly
(tests/sdk_events.py) by the server fixture and again here, and parsed into the SDK's
beta types. On a conversation, what the response took in while it ran is appended in
order (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hotloop.engines.sim import SimScript, SimTurn
from openai import OpenAI
from openai.types.beta import BetaResponseInjectCreatedEvent, BetaResponseInjectFailedEvent
from sdk_events import validate
from servers import hotloop_server
from test_conversations import all_items, served, user

TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}
BETA = {"OpenAI-Beta": "responses_multi_agent=v1"}
TOOLS: Any = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        "strict": False,
    }
]
# The model lists the files, then answers from the listing.
SCRIPT = SimScript(
    turns=(
        SimTurn(calls=(("exec_command", '{"cmd":"ls"}'),)),
        SimTurn(text="Two files: a.py and b.txt."),
    )
)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with hotloop_server(SCRIPT, api_keys=("sk-test",)) as url:
        yield url + "/v1"


def until_call(conn: Any) -> tuple[str, str, list[dict[str, Any]]]:
    """Read up to the function call item: (response id, call id, frames)."""
    frames: list[dict[str, Any]] = []
    while True:
        frames.append(event := validate(conn.recv_bytes()))
        assert event["type"] not in TERMINAL, frames
        if event["type"] == "response.output_item.done":
            return frames[0]["response"]["id"], event["item"]["call_id"], frames


def test_sdk_inject_resumes_the_waiting_response(base_url: str) -> None:
    client = OpenAI(base_url=base_url, api_key="sk-test")
    with client.beta.responses.connect(extra_headers=BETA) as conn:
        conn.response.create(model="sim", input="List files", tools=TOOLS, store=False)
        target, call_id, frames = until_call(conn)
        # A wrong call id first: refused with the input returned, the response waits on.
        conn.response.inject(
            input=[{"type": "function_call_output", "call_id": "call_x", "output": "?"}],
            response_id=target,
        )
        raw = conn.recv_bytes()
        refused = validate(raw)
        assert refused["error"]["code"] == "invalid_input"
        assert refused["input"][0]["call_id"] == "call_x"
        assert isinstance(conn.parse_event(raw), BetaResponseInjectFailedEvent)

        conn.response.inject(
            input=[{"type": "function_call_output", "call_id": call_id, "output": "a.py b.txt"}],
            response_id=target,
        )
        typed = []
        while True:
            raw = conn.recv_bytes()
            frames.append(event := validate(raw))
            typed.append(conn.parse_event(raw))
            if event["type"] in TERMINAL:
                break
        created = typed[0]
        assert isinstance(created, BetaResponseInjectCreatedEvent)
        assert created.response_id == target
        kinds = [frame["type"] for frame in frames]
        assert kinds.count("response.created") == 1 and kinds[-1] == "response.completed"
        done = frames[-1]["response"]
        assert done["id"] == target
        assert [item["type"] for item in done["output"]] == ["function_call", "message"]
        assert done["output"][1]["content"][0]["text"] == "Two files: a.py and b.txt."
        assert done["usage"]["input_tokens_details"]["cached_tokens"] > 0
        seqs = [frame["sequence_number"] for frame in frames]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)

        # Finished: an injection now is refused with the SDK's own code.
        conn.response.inject(
            input=[{"type": "function_call_output", "call_id": call_id, "output": "again"}],
            response_id=target,
        )
        late = conn.parse_event(raw := conn.recv_bytes())
        validate(raw)
        assert isinstance(late, BetaResponseInjectFailedEvent)
        assert late.error.code == "response_already_completed"


def test_without_the_beta_header_a_tool_call_ends_the_response(base_url: str) -> None:
    client = OpenAI(base_url=base_url, api_key="sk-test")
    with client.beta.responses.connect() as conn:
        conn.response.create(model="sim", input="List files", tools=TOOLS, store=False)
        while (event := validate(conn.recv_bytes()))["type"] not in TERMINAL:
            pass
        assert event["type"] == "response.completed"
        conn.response.inject(
            input=[{"type": "function_call_output", "call_id": "call_1", "output": "x"}],
            response_id=event["response"]["id"],
        )
        refused = validate(conn.recv_bytes())
        assert refused["type"] == "error" and refused["error"]["code"] == "unknown_event_type"


def test_the_server_flag_and_the_idle_timeout_over_a_socket() -> None:
    with hotloop_server(SCRIPT, inject=True, inject_idle_timeout=0.05) as url:
        client = OpenAI(base_url=url + "/v1", api_key="none")
        with client.beta.responses.connect() as conn:
            conn.response.create(model="sim", input="List files", tools=TOOLS, store=False)
            target, call_id, _ = until_call(conn)
            ended = validate(conn.recv_bytes())
            assert ended["type"] == "response.incomplete"
            assert ended["response"]["incomplete_details"] == {"reason": "idle_timeout"}
            # Still continuable, the HTTP way: a response.create with the output.
            conn.response.create(
                model="sim",
                previous_response_id=target,
                input=[{"type": "function_call_output", "call_id": call_id, "output": "a.py"}],
                tools=TOOLS,
                store=False,
            )
            while (event := validate(conn.recv_bytes()))["type"] not in TERMINAL:
                pass
            assert event["type"] == "response.completed"


def test_a_long_running_turn_on_a_conversation_appends_what_it_took_in_order(
    store_settings: dict[str, str],
) -> None:
    """The output injected into a response and the steering input it took while it
    waited are the conversation's too, where the model saw them: after the call."""
    with served(SCRIPT, api_keys=("sk-test",), **store_settings) as url:
        client = OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
        conversation = client.conversations.create(items=[user("hi")])
        with client.beta.responses.connect(extra_headers=BETA) as conn:
            conn.response.create(
                model="sim", input="List files", tools=TOOLS, conversation=conversation.id
            )
            target, call_id, _ = until_call(conn)
            conn.response.steer(input="Be brief.", previous_response_id=target)
            output = {"type": "function_call_output", "call_id": call_id, "output": "a.py b.txt"}
            conn.response.inject(input=[output], response_id=target)
            while (event := validate(conn.recv_bytes()))["type"] not in TERMINAL:
                pass
        assert event["type"] == "response.completed"
        done = event["response"]
        items = [item.model_dump() for item in all_items(client, conversation.id)]
        assert [(item["type"], item.get("role")) for item in items] == [
            ("message", "user"),
            ("message", "user"),
            ("function_call", None),
            ("function_call_output", None),
            ("message", "user"),
            ("message", "assistant"),
        ]
        assert items[3]["call_id"] == call_id and items[3]["output"] == "a.py b.txt"
        assert items[4]["content"][0]["text"] == "Be brief."
        assert [items[2]["id"], items[5]["id"]] == [o["id"] for o in done["output"]]
        # Listed with the ids the stored response's input items have.
        listed = client.responses.input_items.list(target, order="asc")
        assert [i.id for i in listed.data] == [items[n]["id"] for n in (1, 3, 4)]
