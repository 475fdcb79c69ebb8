"""`response.interrupt` (protocol.md section 8), driven with plain function calls: the
response stops, partial items are reported interrupted and dropped, and the id stays
continuable with only its completed items."""

from __future__ import annotations

from typing import Any

from connection_driver import FORMAT
from test_protocol_connection import CALL, TOOLS, Client

THOUGHT_AND_ANSWER = FORMAT.completion_tokens(
    reasoning="The user greets me.", text="Hello there, my good friend."
)


def interrupt(client: Client, response_id: str, **fields: Any) -> list[dict[str, Any]]:
    return client.send({"type": "response.interrupt", "response_id": response_id, **fields})


def test_interrupt_discards_the_partial_item_and_stays_continuable() -> None:
    client = Client()
    created = client.create("Hi")[0]["response"]["id"]
    key = min(client.generating)
    # Everything but the answer's last tokens: the reasoning item is complete, the
    # message is open.
    client.conn.engine_output(key, THOUGHT_AND_ANSWER[:-4])
    streamed = client.pump()
    assert [e["type"] for e in streamed].count("response.output_item.done") == 1
    message_id = next(
        e["item"]["id"]
        for e in streamed
        if e["type"] == "response.output_item.added" and e["item"]["type"] == "message"
    )

    frames = interrupt(client, created, mode="discard_partial_items")
    assert [e["type"] for e in frames] == [
        "response.interrupt.accepted",
        "response.output_item.interrupted",
        "response.incomplete",
    ]
    assert client.cancelled == [key]
    assert frames[1]["item_id"] == message_id and frames[1]["output_index"] == 1
    response = frames[-1]["response"]
    assert response["incomplete_details"] == {"reason": "interrupted"}
    assert [item["type"] for item in response["output"]] == ["reasoning"]
    seqs = [e["sequence_number"] for e in streamed + frames]
    assert seqs == list(range(2, 2 + len(seqs)))

    # The id continues, with the completed reasoning in its history.
    assert [e["type"] for e in client.create("Go on", previous_response_id=created)] == [
        "response.created",
        "response.in_progress",
    ]
    history = FORMAT.tokenizer.decode(client.generating[max(client.generating)].prompt.tokens())
    assert "The user greets me." in history
    assert "Hello there" not in history and history.endswith("Go on<|end|><|start|>assistant")
    assert client.finish()[-1]["type"] == "response.completed"


def test_interrupt_between_items_reports_no_partial_item() -> None:
    client = Client()
    created = client.create("Hi")[0]["response"]["id"]
    frames = interrupt(client, created)
    assert [e["type"] for e in frames] == ["response.interrupt.accepted", "response.incomplete"]
    assert frames[-1]["response"]["output"] == []
    assert client.turn("Again", previous_response_id=created)["type"] == "response.completed"


def test_interrupt_of_a_finished_or_unknown_response_is_an_error() -> None:
    client = Client()
    done = client.turn()["response"]["id"]
    assert [e["error"]["code"] for e in interrupt(client, done)] == ["response_already_completed"]
    assert [e["error"]["code"] for e in interrupt(client, "resp_nope")] == ["response_not_found"]
    assert [e["error"]["code"] for e in client.send({"type": "response.interrupt"})] == [
        "missing_required_parameter"
    ]
    created = client.create("Hi")[0]["response"]["id"]
    assert [e["error"]["code"] for e in interrupt(client, created, mode="keep")] == [
        "invalid_value"
    ]
    # The running response is untouched by the refused interrupt.
    assert client.finish()[-1]["type"] == "response.completed"


def test_an_interrupted_response_keeps_its_completed_call_id() -> None:
    """Regression: the completed items were rebuilt from text, and the parser minted a
    new call id for the call, so its output (by the id the client saw) was refused."""
    client = Client()
    created = client.create("List files", tools=TOOLS)[0]["response"]["id"]
    key = min(client.generating)
    # The call is sampled whole; the engine has not reported the end yet.
    client.conn.engine_output(key, CALL)
    call = next(e["item"] for e in client.pump() if e["type"] == "response.output_item.done")
    frames = interrupt(client, created)
    assert frames[-1]["response"]["output"] == [call]
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "a.py"}
    continued = client.create([output], previous_response_id=created, tools=TOOLS)
    assert [e["type"] for e in continued] == ["response.created", "response.in_progress"]
    history = FORMAT.tokenizer.decode(client.generating[max(client.generating)].prompt.tokens())
    assert history.index('{"cmd":"ls"}') < history.index("a.py")


def test_an_interrupted_namespaced_call_renders_under_its_namespace() -> None:
    """Regression: the completed call was rebuilt from its bare `name`, so a function of a
    `namespace` tool came back as `functions.NAME`, not the call the model sampled."""
    client = Client()
    namespace = {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Sub-agents.",
        "tools": [{"type": "function", "name": "spawn_agent"}],
    }
    tools = [*TOOLS, namespace]
    created = client.create("Delegate", tools=tools)[0]["response"]["id"]
    key = min(client.generating)
    client.conn.engine_output(
        key, FORMAT.completion_tokens(calls=[("multi_agent_v1.spawn_agent", '{"task":"x"}')])
    )
    call = next(e["item"] for e in client.pump() if e["type"] == "response.output_item.done")
    assert (call["namespace"], call["name"]) == ("multi_agent_v1", "spawn_agent")
    interrupt(client, created)
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "started"}
    client.create([output], previous_response_id=created, tools=tools)
    history = FORMAT.tokenizer.decode(client.generating[max(client.generating)].prompt.tokens())
    assert " to=multi_agent_v1.spawn_agent" in history and "functions.spawn_agent" not in history
