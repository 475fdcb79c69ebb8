"""A response's state table (`hotloop.protocol.state`): every transition it holds is
taken, every other one raises, and real turns driven through a `Connection` pass
through the states the protocol names (sampling, cut for a steer, waiting for tools,
summarizing, prefilling, ending, done)."""

from __future__ import annotations

import itertools

import pytest
from connection_driver import ANSWER, FORMAT, ConnectionDriver, sim_connection
from hotloop.protocol import CacheBudget, ConnectionCache
from hotloop.protocol.response import Response
from hotloop.protocol.state import TRANSITIONS, ImpossibleTransition, State, advance
from test_protocol_connection import CALL, TOOLS, Client, Recorder

ALLOWED = [(a, b) for a, targets in TRANSITIONS.items() for b in targets]
FORBIDDEN = [(a, b) for a, b in itertools.product(State, State) if b not in TRANSITIONS[a]]


def test_the_table_names_every_state_and_done_is_final() -> None:
    assert set(TRANSITIONS) == set(State)
    assert TRANSITIONS[State.DONE] == frozenset()
    # Every state but the first is reached from somewhere, and every one reaches DONE.
    reached = {b for _, b in ALLOWED}
    assert reached == set(State) - {State.OPENED}
    for state in State:
        seen, frontier = {state}, [state]
        while frontier:
            for after in TRANSITIONS[frontier.pop()]:
                if after not in seen:
                    seen.add(after)
                    frontier.append(after)
        assert State.DONE in seen, state


@pytest.mark.parametrize(("current", "wanted"), ALLOWED, ids=lambda s: s.value)
def test_every_allowed_transition_is_taken(current: State, wanted: State) -> None:
    assert advance(current, wanted) is wanted


@pytest.mark.parametrize(("current", "wanted"), FORBIDDEN, ids=lambda s: s.value)
def test_every_impossible_transition_raises(current: State, wanted: State) -> None:
    with pytest.raises(ImpossibleTransition) as raised:
        advance(current, wanted)
    assert (raised.value.current, raised.value.wanted) == (current, wanted)
    assert current.value in str(raised.value) and wanted.value in str(raised.value)


def running(driver: ConnectionDriver, response_id: str) -> Response:
    response = driver.conn.running(response_id)
    assert response is not None
    return response


def test_a_turn_samples_then_is_done_and_goes_nowhere_else() -> None:
    client = Client()
    target = client.create("Hi")[0]["response"]["id"]
    response = running(client, target)
    assert response.state is State.SAMPLING
    # A second prewarm of a sampling response is a bug: refused by the table.
    with pytest.raises(ImpossibleTransition):
        response.prewarm(response.conversation.prompt())
    assert response.state is State.SAMPLING
    assert client.finish(ids=ANSWER)[-1]["type"] == "response.completed"
    assert response.state is State.DONE
    with pytest.raises(ImpossibleTransition):
        response.enter(State.SAMPLING)


def test_a_stored_turn_is_ending_until_its_commit() -> None:
    client = ConnectionDriver(
        sim_connection(ConnectionCache(1 << 30, CacheBudget(1 << 30)), Recorder(), durable=True)
    )
    target = client.create("Hi", store=True)[0]["response"]["id"]
    response = running(client, target)
    client.finish(ids=ANSWER)
    assert response.state is State.ENDING
    assert client.commit()[-1]["type"] == "response.completed"
    assert response.state is State.DONE


def test_a_prewarm_is_prefilling() -> None:
    client = Client()
    client.create("Hi", generate=False)
    (work,) = client.generating.values()
    response = client.conn.generating[work.key]
    assert response.state is State.PREFILLING
    client.finish(ids=[])
    assert response.state is State.DONE


def test_a_steered_response_is_cut_at_its_item_boundary() -> None:
    client = Client()
    target = client.create("Hi", max_output_tokens=500)[0]["response"]["id"]
    response = running(client, target)
    client.send({"type": "response.steer", "previous_response_id": target, "input": "Shorter."})
    thought_and_answer = FORMAT.completion_tokens(reasoning="Greeting.", text="Hello there.")
    assert not client.conn.engine_output(response.key, thought_and_answer)
    assert response.state is State.CUT_FOR_STEER
    # Cut: whatever else the engine sends is refused.
    assert not client.conn.engine_output(response.key, ANSWER)
    client.finish(ids=[])
    assert response.state is State.DONE


def test_a_long_running_response_waits_for_tools_then_samples_again() -> None:
    client = ConnectionDriver(
        sim_connection(ConnectionCache(1 << 30, CacheBudget(1 << 30)), Recorder(), inject=True)
    )
    target = client.create("List files", tools=TOOLS)[0]["response"]["id"]
    response = running(client, target)
    call = client.finish(ids=CALL)[-1]["item"]
    assert response.state is State.WAITING_FOR_TOOLS
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "a.py"}
    client.send({"type": "response.inject", "response_id": target, "input": [output]})
    assert response.state is State.SAMPLING
    client.finish(ids=ANSWER)
    assert response.state is State.DONE


def test_a_turn_over_its_threshold_summarizes_then_samples() -> None:
    client = Client()
    management = [{"type": "compaction", "compact_threshold": 1000}]
    target = client.create("word " * 1500, context_management=management)[0]["response"]["id"]
    response = running(client, target)
    assert response.state is State.SUMMARIZING
    client.finish(ids=FORMAT.completion_tokens(text="We said hi."))
    assert response.state is State.SAMPLING
    client.finish(ids=ANSWER)
    assert response.state is State.DONE
