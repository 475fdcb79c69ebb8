"""The per-connection state machine, driven with plain function calls (no sockets, no
event loop): lanes, FIFO, limits, lifetime, cancel, the connection cache and errors.
The engine is played by the test, with real ids from the chat format."""

from __future__ import annotations

from typing import Any

import pytest
from connection_driver import ANSWER, FORMAT, ConnectionDriver, sim_connection
from hotloop.engines.base import EngineError
from hotloop.protocol import (
    CacheBudget,
    Close,
    ConnectionCache,
    ConnectionLimits,
    Finished,
)
from hotloop.protocol.request_queue import MAX_IN_FLIGHT, MAX_NAMED_LANES

CALL = FORMAT.completion_tokens(calls=[("exec_command", '{"cmd":"ls"}')])
TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]


class Recorder:
    """An Observer that remembers what it was told."""

    def __init__(self) -> None:
        self.done: list[Finished] = []

    def finished(self, response: Finished) -> None:
        self.done.append(response)


class Client(ConnectionDriver):
    """Plays the client and the engine against one Connection."""

    def __init__(self, **limits: Any) -> None:
        self.observer = Recorder()
        self.budget = CacheBudget(1 << 30)
        self.cache = ConnectionCache(1 << 30, self.budget)
        super().__init__(
            sim_connection(self.cache, self.observer, limits=ConnectionLimits(**limits))
        )

    def turn(self, input: Any = "Hi", ids: list[int] = ANSWER, **fields: Any) -> dict[str, Any]:
        """One whole turn; returns its terminal event."""
        started = self.create(input, **fields)
        assert [e["type"] for e in started] == ["response.created", "response.in_progress"]
        return self.finish(ids=ids)[-1]


def errors(frames: list[dict[str, Any]]) -> list[str]:
    return [f["error"]["code"] for f in frames if f["type"] == "error"]


def test_text_turn_sequence_and_usage() -> None:
    client = Client()
    started = client.create("Say hello", stream=True)
    assert [e["type"] for e in started] == ["response.created", "response.in_progress"]
    (work,) = client.generating.values()
    assert work.sampling.stop_tokens == tuple(FORMAT.stop_tokens)
    frames = client.finish()
    kinds = [f["type"] for f in frames]
    assert kinds[0] == "response.output_item.added" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    seqs = [f["sequence_number"] for f in started + frames]
    assert seqs == list(range(len(seqs)))
    final = frames[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == "Hello there, friend."
    usage = final["usage"]
    assert usage["input_tokens"] == len(work.prompt) and usage["output_tokens"] == len(ANSWER)
    assert usage["input_tokens_details"]["cached_tokens"] == 0
    assert final["id"] in client.cache
    (done,) = client.observer.done
    assert done.response_id == final["id"] and done.checkpoint is not None


def test_nested_create_and_background_refused() -> None:
    client = Client()
    nested = client.send({"type": "response.create", "response": {"model": "sim", "input": "x"}})
    assert nested[0]["type"] == "response.created"
    client.finish()
    refused = client.create(background=True)
    assert errors(refused) == ["invalid_value"] and refused[0]["status"] == 400
    assert refused[0]["error"]["param"] == "background"


def test_continuation_serves_history_from_cache() -> None:
    client = Client()
    first = client.turn("one")["response"]
    second = client.turn("two", previous_response_id=first["id"])["response"]
    assert client.budget.hits == 1
    details = second["usage"]["input_tokens_details"]
    assert details["cached_tokens"] > 0
    assert second["previous_response_id"] == first["id"]
    assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"]


def test_unknown_previous_response_is_an_error_and_the_socket_goes_on() -> None:
    client = Client()
    frames = client.create(previous_response_id="resp_nope")
    assert errors(frames) == ["previous_response_not_found"]
    assert frames[0]["error"]["param"] == "previous_response_id"
    assert "resp_nope" in frames[0]["error"]["message"]
    assert client.turn()["type"] == "response.completed"


def test_a_miss_rebuilt_into_the_cache_continues() -> None:
    # The transports rebuild a stored parent into the cache before the request arrives.
    client = Client()
    first = client.turn()["response"]
    checkpoint = client.observer.done[0].checkpoint
    assert checkpoint is not None
    client.cache.evict(first["id"])
    assert errors(client.create("again", previous_response_id=first["id"])) == [
        "previous_response_not_found"
    ]
    client.cache.put(first["id"], checkpoint, None, first["id"])
    assert client.turn("again", previous_response_id=first["id"])["type"] == "response.completed"


def test_tool_loop_and_bad_call_id_evicts_the_parent() -> None:
    client = Client()
    call = client.turn("list files", ids=CALL, tools=TOOLS)["response"]
    item = call["output"][0]
    assert item["type"] == "function_call" and item["name"] == "exec_command"
    bad = [{"type": "function_call_output", "call_id": "call_unknown", "output": "x"}]
    frames = client.create(bad, previous_response_id=call["id"], tools=TOOLS)
    assert frames[0]["type"] == "error" and frames[0]["status"] == 400
    assert (frames[0]["error"]["param"] or "").startswith("input")
    assert call["id"] not in client.cache
    retry = [{"type": "function_call_output", "call_id": item["call_id"], "output": "a b"}]
    again = client.create(retry, previous_response_id=call["id"], tools=TOOLS)
    assert errors(again) == ["previous_response_not_found"]


def test_matching_call_output_continues() -> None:
    client = Client()
    call = client.turn("list files", ids=CALL, tools=TOOLS)["response"]
    output = [
        {"type": "function_call_output", "call_id": call["output"][0]["call_id"], "output": "a"}
    ]
    done = client.turn(output, previous_response_id=call["id"], tools=TOOLS)
    assert done["type"] == "response.completed"


def test_failed_fork_keeps_the_parent() -> None:
    client = Client()
    parent = client.turn(stream_id="a")["response"]["id"]
    bad = [{"type": "function_call_output", "call_id": "call_x", "output": "x"}]
    frames = client.create(bad, previous_response_id=parent, stream_id="b")
    assert frames[0]["type"] == "error" and frames[0]["stream_id"] == "b"
    assert parent in client.cache
    fork = client.turn("fork", previous_response_id=parent, stream_id="b")
    assert fork["type"] == "response.completed" and fork["stream_id"] == "b"


def test_warm_up_then_continue() -> None:
    client = Client()
    frames = client.create(
        [{"type": "message", "role": "developer", "content": "You are terse."}],
        generate=False,
        tools=TOOLS,
    )
    assert [f["type"] for f in frames] == ["response.created"]
    # A prewarm: the engine evaluates the prompt and samples nothing.
    (work,) = client.generating.values()
    assert work.sampling.max_output_tokens == 0
    warm = client.finish(ids=[])[-1]["response"]
    assert warm["status"] == "completed" and warm["output"] == []
    usage = warm["usage"]
    assert usage["input_tokens"] == len(work.prompt) and usage["output_tokens"] == 0
    next_turn = client.turn("go", previous_response_id=warm["id"], tools=TOOLS)["response"]
    assert next_turn["usage"]["input_tokens_details"]["cached_tokens"] > 0


def test_default_lane_is_fifo() -> None:
    client = Client()
    client.create("first")
    queued = client.create("second")
    assert queued == [] and len(client.generating) == 1
    frames = client.finish()
    assert frames[-2]["type"] == "response.created"  # the second starts right after
    assert frames[-3]["type"] == "response.completed"
    assert len(client.generating) == 1


def test_lanes_run_concurrently_and_echo_stream_id() -> None:
    client = Client()
    a = client.create(stream_id="a")
    b = client.create(stream_id="b")
    assert len(client.generating) == 2
    assert {f["stream_id"] for f in a} == {"a"} and {f["stream_id"] for f in b} == {"b"}
    keys = sorted(client.generating)
    done_b = client.finish(keys[1])
    assert {f["stream_id"] for f in done_b} == {"b"}
    assert [f["sequence_number"] for f in b + done_b] == list(range(len(b + done_b)))


def test_in_flight_cap_queues_the_rest() -> None:
    client = Client()
    for i in range(MAX_IN_FLIGHT + 1):
        client.create(stream_id=f"s{i}")
    assert len(client.generating) == MAX_IN_FLIGHT
    frames = client.finish()
    assert frames[-1]["stream_id"] == f"s{MAX_IN_FLIGHT}"
    assert len(client.generating) == MAX_IN_FLIGHT


def test_named_lane_limit_and_invalid_names() -> None:
    client = Client()
    for i in range(MAX_NAMED_LANES):
        client.turn(stream_id=f"lane-{i}")
    frames = client.create(stream_id="one-too-many")
    assert errors(frames) == ["websocket_stream_limit_reached"]
    assert frames[0]["stream_id"] == "one-too-many"
    assert client.turn(stream_id="lane-0")["type"] == "response.completed"
    for bad in ["", "has space", "x" * 257, "ünï"]:
        assert errors(client.create(stream_id=bad)) == ["invalid_stream_id"]
    assert client.turn()["type"] == "response.completed"


def test_bad_frames_get_errors_and_the_socket_goes_on() -> None:
    client = Client(max_frame_bytes=4096)
    assert errors(client.send("{not json")) == ["invalid_json"]
    assert errors(client.send('["array"]')) == ["invalid_json"]
    unknown = client.send({"type": "response.frobnicate", "stream_id": "z"})
    assert errors(unknown) == ["unknown_event_type"] and unknown[0]["stream_id"] == "z"
    client.conn.receive_bytes(b"\x00\x01")
    assert errors(client.pump()) == ["binary_frame_not_supported"]
    oversize = client.create("x" * 5000)
    assert errors(oversize) == ["frame_too_large"]
    assert client.send({"type": "response.processed", "response_id": "resp_1"}) == []
    assert client.turn()["type"] == "response.completed"


def test_queue_bytes_limit() -> None:
    client = Client(max_queued_bytes=300)
    client.create("first")  # starts at once: not queued
    assert client.create("y" * 100) == []
    frames = client.create("z" * 200)
    assert errors(frames) == ["websocket_queue_limit_reached"]
    # A limit that refuses work says when to retry, as OpenAI's 429s do.
    assert frames[0]["status"] == 429
    assert frames[0]["error"]["type"] == "rate_limit_error"
    assert frames[0]["error"]["headers"] == {"retry-after": "1"}


def test_cancel_ends_with_one_cancelled_terminal() -> None:
    client = Client()
    client.create(stream_id="a")
    (key,) = client.generating
    assert client.conn.engine_output(key, ANSWER[:3])
    partial = client.pump()
    frames = client.send({"type": "response.cancel", "stream_id": "a"})
    assert client.cancelled == [key]
    assert [f["type"] for f in frames] == ["response.incomplete"]
    response = frames[0]["response"]
    assert response["status"] == "cancelled" and frames[0]["stream_id"] == "a"
    assert frames[0]["sequence_number"] == partial[-1]["sequence_number"] + 1 if partial else 2
    # Late engine output of the abandoned response is never sent.
    assert client.conn.engine_output(key, ANSWER[3:]) is False
    client.conn.engine_done(key)
    assert client.pump() == []
    assert client.send({"type": "response.cancel", "stream_id": "a"}) == []
    assert response["id"] not in client.cache


def test_engine_failure_fails_the_response_and_evicts_the_parent() -> None:
    client = Client()
    parent = client.turn()["response"]["id"]
    client.create("again", previous_response_id=parent)
    (key,) = client.generating
    client.conn.engine_failed(key, EngineError("upstream_down", "connection refused"))
    frames = client.pump()
    assert frames[-1]["type"] == "response.failed"
    assert frames[-1]["response"]["error"]["code"] == "server_error"
    assert "connection refused" in frames[-1]["response"]["error"]["message"]
    assert parent not in client.cache


def test_max_output_tokens_gives_incomplete() -> None:
    client = Client()
    client.create(max_output_tokens=16)
    (work,) = client.generating.values()
    assert work.sampling.max_output_tokens == 16
    long_answer = FORMAT.completion_tokens(text="word " * 100)
    frames = client.finish(ids=long_answer[:16])
    assert frames[-1]["type"] == "response.incomplete"
    assert frames[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_lifetime_on_an_idle_socket() -> None:
    client = Client()
    client.conn.lifetime_reached()
    frames = client.pump()
    assert errors(frames) == ["websocket_connection_limit_reached"]
    assert client.closed == Close(1000, "connection lifetime reached")


def test_lifetime_never_cuts_a_response() -> None:
    client = Client()
    client.create("long")
    client.create("queued")
    client.conn.lifetime_reached()
    assert client.pump() == [] and client.closed is None
    late = client.create("late", stream_id="x")
    assert errors(late) == ["websocket_connection_limit_reached"]
    frames = client.finish()
    kinds = [f["type"] for f in frames]
    assert kinds[-2:] == ["response.completed", "error"]
    assert frames[-1]["error"]["code"] == "websocket_connection_limit_reached"
    assert client.closed is not None and client.closed.code == 1000


def test_disconnect_cancels_generation_and_drops_the_cache() -> None:
    client = Client()
    parent = client.turn()["response"]["id"]
    client.create(stream_id="a")
    client.create(stream_id="b")
    client.conn.connection_lost()
    client.pump()
    assert sorted(client.cancelled) == [1, 2] and not client.generating
    assert parent not in client.cache and len(client.cache) == 0


@pytest.mark.parametrize("budget_bytes", [1, 1 << 30])
def test_cache_is_bounded_per_connection_and_globally(budget_bytes: int) -> None:
    budget = CacheBudget(budget_bytes)
    client = Client()
    client.cache = client.conn.cache = ConnectionCache(1 << 30 if budget_bytes == 1 else 1, budget)
    first = client.turn()["response"]["id"]
    second = client.turn()["response"]["id"]
    assert first not in client.cache and second in client.cache
    assert budget.evictions == 1
    assert budget.hits == 0 and budget.misses == 0


def test_cache_leaves_the_global_budget_when_the_socket_closes() -> None:
    client = Client()
    client.turn()
    assert client.budget.used_bytes > 0
    client.conn.lifetime_reached()
    client.pump()
    client.conn.connection_lost()
    assert client.budget.used_bytes == 0 and len(client.cache) == 0


def test_every_turn_of_a_chain_routes_by_its_root() -> None:
    client = Client()
    client.create("first")
    (work,) = client.generating.values()
    first = client.finish()[-1]["response"]["id"]
    # A new chain is named by its own first response.
    assert work.route_key == first
    second = client.turn("second", previous_response_id=first)["response"]["id"]
    for parent in (second, first):  # a continuation, then a fork from the root
        client.create("again", previous_response_id=parent)
        (work,) = client.generating.values()
        assert work.route_key == first
        client.finish()


def test_a_rebuilt_chain_keeps_the_root_it_was_stored_under() -> None:
    client = Client()
    first = client.turn()["response"]
    checkpoint = client.observer.done[0].checkpoint
    assert checkpoint is not None
    client.cache.evict(first["id"])
    client.cache.put(first["id"], checkpoint, None, "resp_root")
    client.create("again", previous_response_id=first["id"])
    (work,) = client.generating.values()
    assert work.route_key == "resp_root"


def test_a_session_header_names_every_conversation_of_the_connection() -> None:
    cache = ConnectionCache(1 << 30, CacheBudget(1 << 30))
    client = ConnectionDriver(sim_connection(cache, Recorder(), session_key="codex-session-1"))
    client.create("one")
    client.create("two", stream_id="side")
    assert {w.route_key for w in client.generating.values()} == {"codex-session-1"}


def test_a_parent_the_store_could_not_read_is_unavailable_not_unknown() -> None:
    client = Client()
    client.conn.store_unavailable("resp_elsewhere", "connection refused")
    (refused,) = client.create("go on", previous_response_id="resp_elsewhere")
    assert refused["error"]["code"] == "store_unavailable" and refused["status"] == 503
    # Said once: the next miss is an unknown id again.
    assert errors(client.create("go on", previous_response_id="resp_elsewhere")) == [
        "previous_response_not_found"
    ]
