"""`response.steer` (protocol.md section 8), driven with plain function calls: every
order of steer, item boundary, completion, tool-call stop and failure. Frames are
validated with the openai SDK's own steer event models (`connection_driver.pump`)."""

from __future__ import annotations

from typing import Any

from connection_driver import ANSWER, FORMAT, ConnectionDriver, sim_connection
from hotloop._core import Conversation, Limits
from hotloop.protocol import CacheBudget, ConnectionCache
from hotloop.protocol.connection_cache import ConversationStart
from hotloop.protocol.steering import MAX_PENDING_STEERS
from test_protocol_connection import CALL, TOOLS, Client, Recorder

THOUGHT_AND_ANSWER = FORMAT.completion_tokens(
    reasoning="The user greets me.", text="Hello there, my good friend."
)
END = FORMAT.tokenizer.special("<|end|>")
assert END is not None
# Sampled ids up to and including the reasoning item's end.
THOUGHT = THOUGHT_AND_ANSWER[: THOUGHT_AND_ANSWER.index(END) + 1]


def steer(
    client: ConnectionDriver, target: str, input: Any = "Answer in French."
) -> list[dict[str, Any]]:
    return client.send({"type": "response.steer", "previous_response_id": target, "input": input})


def types(frames: list[dict[str, Any]]) -> list[str]:
    return [frame["type"] for frame in frames]


def history(client: Client) -> str:
    """The prompt of the latest generation, as text."""
    return FORMAT.tokenizer.decode(client.generating[max(client.generating)].prompt.tokens())


def test_steer_ends_the_item_being_sampled_and_a_successor_continues() -> None:
    client = Client()
    target = client.create("Hi", instructions="Be brief.", max_output_tokens=500)[0]["response"]
    key = min(client.generating)
    target_prompt = client.generating[key].prompt.tokens()
    assert client.conn.engine_output(key, THOUGHT[:3])
    client.pump()

    accepted = steer(client, target["id"])
    assert types(accepted) == ["response.steer.accepted"]
    steer_id = accepted[0]["steer"]["id"]
    assert steer_id.startswith("steer_")
    assert accepted[0]["steer"]["previous_response_id"] == target["id"]

    # The engine's batch runs past the reasoning item: the rest is dropped unseen.
    assert not client.conn.engine_output(key, THOUGHT_AND_ANSWER[3:])
    streamed = client.pump()
    assert types(streamed)[-1] == "response.output_item.done"
    assert "response.output_text.delta" not in types(streamed)
    client.conn.engine_done(key)
    del client.generating[key]
    frames = client.pump()
    assert types(frames) == ["response.incomplete", "response.created", "response.in_progress"]
    ended, successor = frames[0]["response"], frames[1]["response"]
    assert ended["incomplete_details"] == {"reason": "steered"}
    assert [item["type"] for item in ended["output"]] == ["reasoning"]
    assert successor["id"] != target["id"]
    assert successor["previous_response_id"] == target["id"]
    assert successor["instructions"] == "Be brief." and successor["max_output_tokens"] == 500

    # The successor's prompt is the target's prompt, the sampled ids verbatim, then
    # only the steering input: an append, not a re-render.
    prompt = client.generating[max(client.generating)].prompt.tokens()
    assert prompt[: len(target_prompt) + len(THOUGHT)] == target_prompt + THOUGHT
    assert history(client).endswith("Answer in French.<|end|><|start|>assistant")
    done = client.finish()[-1]["response"]
    assert done["status"] == "completed"
    cached = done["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached == len(target_prompt) + len(THOUGHT)

    # Later steers target the successor; the ended target refuses them.
    late = steer(client, target["id"])
    assert types(late) == ["response.steer.failed"]
    assert late[0]["error"]["code"] == "response_already_completed"
    assert late[0]["steer"] == {"previous_response_id": target["id"], "input": "Answer in French."}


def test_a_steer_racing_completion_ends_completed_and_still_gets_its_successor() -> None:
    client = Client()
    target = client.create("Hi", stream_id="a")[0]["response"]["id"]
    assert steer(client, target)[0]["stream_id"] == "a"
    frames = client.finish(ids=ANSWER)
    kinds = types(frames)
    assert kinds[-3:] == ["response.completed", "response.created", "response.in_progress"]
    assert (
        frames[-1]["stream_id"] == "a" and frames[-2]["response"]["previous_response_id"] == target
    )
    assert client.finish()[-1]["type"] == "response.completed"


def test_two_steers_are_applied_in_submission_order_by_one_successor() -> None:
    client = Client()
    target = client.create("Hi")[0]["response"]["id"]
    first, second = (
        steer(client, target, "First this."),
        steer(
            client,
            target,
            [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Then that."}],
                }
            ],
        ),
    )
    assert first[0]["steer"]["id"] != second[0]["steer"]["id"]
    assert [f["sequence_number"] for f in first + second] == [2, 3]
    frames = client.finish(ids=THOUGHT_AND_ANSWER)
    assert types(frames).count("response.created") == 1
    text = history(client)
    assert text.index("First this.") < text.index("Then that.")


def test_steer_waits_for_tool_output_and_is_prepended_to_the_continuation() -> None:
    client = Client()
    target = client.create("List files", tools=TOOLS)[0]["response"]["id"]
    assert types(steer(client, target, "Only .py files.")) == ["response.steer.accepted"]
    frames = client.finish(ids=CALL)
    assert types(frames)[-2:] == ["response.completed", "response.steer.pending"]
    call = frames[-3]["item"]
    pending = frames[-1]
    assert pending["reason"] == "waiting_for_required_input"
    assert pending["required_input"] == [
        {"type": "function_call_output", "call_id": call["call_id"], "name": "exec_command"}
    ]
    assert not client.generating  # no automatic successor while the call is open

    # A steer sent after the stop is queued too, behind the first.
    late = steer(client, target, "And sort them.")
    assert types(late) == ["response.steer.accepted", "response.steer.pending"]

    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "a.py b.txt"}
    assert types(client.create([output], previous_response_id=target, tools=TOOLS)) == [
        "response.created",
        "response.in_progress",
    ]
    text = history(client)
    assert text.index("Only .py files.") < text.index("And sort them.") < text.index("a.py b.txt")
    assert client.finish()[-1]["type"] == "response.completed"
    # The queue was consumed: the next continuation carries its own input only.
    assert types(steer(client, target))[0] == "response.steer.failed"


def test_steer_refusals_return_the_input() -> None:
    client = Client()
    missing = steer(client, "resp_nope")
    assert missing[0]["error"]["code"] == "response_not_found"
    assert "id" not in missing[0]["steer"] and missing[0]["sequence_number"] == 0

    target = client.create("Hi", stream_id="a")[0]["response"]["id"]
    for bad in (
        [],
        [{"type": "function_call_output", "call_id": "call_1", "output": "x"}],
    ):
        refused = steer(client, target, bad)
        assert refused[0]["error"]["code"] == "invalid_input"
        assert refused[0]["steer"]["input"] == bad
    # The lane is the target's: a steer naming one is refused.
    wrong_lane = client.send(
        {"type": "response.steer", "previous_response_id": target, "input": "x", "stream_id": "b"}
    )
    assert wrong_lane[0]["error"]["code"] == "invalid_input"

    for _ in range(MAX_PENDING_STEERS):
        assert types(steer(client, target)) == ["response.steer.accepted"]
    assert steer(client, target)[0]["error"]["code"] == "too_many_pending_steers"

    # Cancelled: its accepted steers come back, with their ids.
    frames = client.send({"type": "response.cancel", "stream_id": "a"})
    assert types(frames) == ["response.incomplete"] + ["response.steer.failed"] * MAX_PENDING_STEERS
    assert {f["error"]["code"] for f in frames[1:]} == {"response_not_active"}
    assert all(f["steer"]["id"].startswith("steer_") for f in frames[1:])
    assert not client.generating


def test_a_successor_that_cannot_be_created_returns_the_steer() -> None:
    client = Client(request=Limits(max_text_bytes=64))
    target = client.create("Hi")[0]["response"]["id"]
    steer(client, target, "x" * 100)
    frames = client.finish(ids=ANSWER)
    assert types(frames)[-2:] == ["response.completed", "response.steer.failed"]
    assert frames[-1]["error"]["code"] == "successor_creation_failed"
    assert frames[-1]["steer"]["input"] == "x" * 100
    assert client.turn("Next", previous_response_id=target)["type"] == "response.completed"


def test_a_successor_refused_at_the_lifetime_limit_returns_the_steer() -> None:
    client = Client()
    target = client.create("Hi")[0]["response"]["id"]
    steer(client, target)
    client.conn.lifetime_reached()
    frames = client.finish(ids=ANSWER)
    assert types(frames)[-3:] == ["response.completed", "response.steer.failed", "error"]
    assert frames[-2]["error"]["code"] == "successor_creation_failed"
    assert frames[-1]["error"]["code"] == "websocket_connection_limit_reached"
    assert client.closed is not None and not client.generating


def test_a_durable_response_starts_its_successor_once_committed() -> None:
    client = ConnectionDriver(
        sim_connection(ConnectionCache(1 << 30, CacheBudget(1 << 30)), Recorder(), durable=True)
    )
    target = client.create("Hi")[0]["response"]["id"]
    steer(client, target)
    assert client.finish(ids=ANSWER)[-1]["type"] == "response.output_item.done"
    # Committing to the store: neither running nor finished.
    assert steer(client, target)[0]["error"]["code"] == "response_not_active"
    frames = client.commit()
    assert types(frames) == ["response.completed", "response.created", "response.in_progress"]
    assert frames[1]["response"]["previous_response_id"] == target


def test_the_successor_of_a_turn_on_a_conversation_continues_the_conversation() -> None:
    """Issue 39 item 7: the successor ran without `conversation`, so neither the steer
    nor its answer reached the conversation. It names it, and starts where the target's
    commit left it (its items end a turn only if nothing changed the conversation)."""
    cache, recorder = ConnectionCache(1 << 30, CacheBudget(1 << 30)), Recorder()
    client = ConnectionDriver(sim_connection(cache, recorder, durable=True))
    # The conversation's state, as the transport puts it (`Ledger.warm_conversation`).
    empty = Conversation(FORMAT, context_window=1 << 20)
    cache.put("conv_t", empty.checkpoint(), None, "conv_t", ConversationStart((0, 0), 0))
    target = client.create("Hi", conversation="conv_t")[0]["response"]["id"]
    steer(client, target)
    client.finish(ids=ANSWER)
    appended = ConversationStart((2, 2), 0)  # the target's input and answer
    frames = client.commit(continued=appended)
    assert types(frames) == ["response.completed", "response.created", "response.in_progress"]
    successor = frames[1]["response"]
    assert successor["conversation"] == {"id": "conv_t"}
    assert successor["previous_response_id"] == target
    client.finish()
    client.commit()
    finished = recorder.done[-1]
    assert finished.response_id == successor["id"]
    assert finished.request.conversation == "conv_t"
    assert finished.conversation_start == appended


DEEP = "[" * 1100 + "]" * 1100


def test_frames_the_decoder_refuses_are_errors_not_a_dropped_socket() -> None:
    """Issue 21 minor: the core skips an unknown field at any depth, the connection's
    decoder stops at 1,024 levels; a steer, interrupt or inject frame with such a field
    raised out of the connection (the socket dropped with 1006, a traceback per frame)."""
    driver = ConnectionDriver(
        sim_connection(ConnectionCache(1 << 30, CacheBudget(1 << 30)), Recorder(), inject=True)
    )
    target = driver.create("Hi")[0]["response"]["id"]
    for kind in ("response.steer", "response.interrupt", "response.inject", "response.append"):
        frame = f'{{"type":"{kind}","response_id":"{target}","zz":{DEEP}}}'
        (error,) = driver.send(frame)
        assert error["type"] == "error" and error["error"]["code"] == "invalid_json", error
    assert driver.finish()[-1]["type"] == "response.completed"


def test_a_continuation_taking_queued_steers_is_refused_cleanly_or_runs() -> None:
    """Issue 21 minor: `"input": null`, or an unknown field nested too deep, on the
    continuation that takes the steers queued for a response waiting for tool output
    raised out of the connection. Null is no input, as the core parses it; too deep is
    refused; the steers stay queued for the next continuation."""
    client = Client()
    target = client.create("List files", tools=TOOLS)[0]["response"]["id"]
    steer(client, target, "Only .py files.")
    call = client.finish(ids=CALL)[-3]["item"]
    deep = (
        '{"type":"response.create","model":"sim","input":[],"zz":'
        + DEEP
        + f',"previous_response_id":"{target}"}}'
    )
    (error,) = client.send(deep)
    assert error["error"]["code"] == "invalid_json"
    started = client.create(None, previous_response_id=target, tools=TOOLS)
    assert types(started) == ["response.created", "response.in_progress"], started
    assert history(client).endswith("Only .py files.<|end|><|start|>assistant")
    client.finish()
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "a.py"}
    assert client.turn([output], previous_response_id=target, tools=TOOLS)["type"] == (
        "response.completed"
    )
    assert not client.conn.busy
