"""The long-running response (protocol.md section 8: `response.inject` and its alias
`response.append`), driven with plain function calls: a response that calls a client tool
waits open, injected outputs are checked against its waiting calls and appended to its
tokens, sampling resumes in the same response; every refusal, the waiting response's
cancel, interrupt, idle timeout and lifetime, steering meanwhile, and the queue memory
injected and steering input holds. Frames are validated with the openai SDK's (beta)
models (`connection_driver.pump`)."""

from __future__ import annotations

from functools import cache
from typing import Any

from connection_driver import ANSWER, FORMAT, ConnectionDriver, sim_connection
from hotloop._core import ChatFormat
from hotloop.engines.sim import SIM_FORMATS
from hotloop.protocol import (
    CacheBudget,
    Connection,
    ConnectionCache,
    ConnectionLimits,
    QueueMemory,
)
from test_protocol_connection import CALL, TOOLS, Recorder


def client(inject: bool = True, **options: Any) -> ConnectionDriver:
    budget = ConnectionCache(1 << 30, CacheBudget(1 << 30))
    return ConnectionDriver(sim_connection(budget, Recorder(), inject=inject, **options))


@cache
def chatml() -> ChatFormat:
    """SmolLM2's ChatML: a model turn may hold several calls (harmony's ends at one)."""
    return SIM_FORMATS["smollm2"]()


def parallel_client(**options: Any) -> ConnectionDriver:
    return ConnectionDriver(
        Connection(
            chat_format=chatml(),
            context_window=1 << 20,
            model="sim",
            cache=ConnectionCache(1 << 30, CacheBudget(1 << 30)),
            inject=True,
            **options,
        )
    )


def two_calls() -> list[int]:
    return chatml().completion_tokens(
        calls=[("exec_command", '{"cmd":"ls"}'), ("exec_command", '{"cmd":"pwd"}')]
    )


def types(frames: list[dict[str, Any]]) -> list[str]:
    return [frame["type"] for frame in frames]


def output(call_id: str, text: str = "a.py b.txt") -> dict[str, str]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def inject(driver: ConnectionDriver, response_id: str, *items: Any) -> list[dict[str, Any]]:
    return driver.send(
        {"type": "response.inject", "response_id": response_id, "input": list(items)}
    )


def waiting_call(
    driver: ConnectionDriver, ids: list[int] = CALL
) -> tuple[str, list[dict[str, Any]]]:
    """Start a response and let its model call the tool: (response id, the calls)."""
    target = driver.create("List files", tools=TOOLS)[0]["response"]["id"]
    frames = driver.finish(ids=ids)
    calls = [f["item"] for f in frames if f["type"] == "response.output_item.done"]
    return target, calls


def history(driver: ConnectionDriver) -> str:
    return FORMAT.tokenizer.decode(driver.generating[max(driver.generating)].prompt.tokens())


def test_a_tool_call_waits_open_and_injected_output_resumes_the_same_response() -> None:
    driver = client()
    created = driver.create("List files", tools=TOOLS)
    target = created[0]["response"]["id"]
    first = driver.generating[min(driver.generating)]
    first_prompt = first.prompt.tokens()
    frames = driver.finish(ids=CALL)
    # The call items, then nothing: no terminal event, the response waits.
    assert types(frames)[-1] == "response.output_item.done"
    assert not {"response.completed", "response.incomplete"} & set(types(frames))
    call = frames[-1]["item"]
    assert call["type"] == "function_call" and list(driver.waits) == [first.key]

    resumed = inject(driver, target, output(call["call_id"]))
    assert types(resumed) == ["response.inject.created"]
    assert resumed[0]["response_id"] == target
    assert driver.cancelled == [first.key]  # its idle timer
    # Same engine sequence: the first prompt, the sampled ids verbatim, then only the
    # tool output and the next assistant header.
    prompt = driver.generating[max(driver.generating)].prompt.tokens()
    assert prompt[: len(first_prompt) + len(CALL)] == first_prompt + CALL
    assert history(driver).endswith("a.py b.txt<|end|><|start|>assistant")

    rest = driver.finish(ids=ANSWER)
    assert types(rest)[-1] == "response.completed"
    added = [f for f in rest if f["type"] == "response.output_item.added"]
    assert [f["output_index"] for f in added] == [1]
    seqs = [f["sequence_number"] for f in created + frames + resumed + rest]
    assert seqs == list(range(len(seqs)))
    done = rest[-1]["response"]
    assert done["id"] == target
    assert [item["type"] for item in done["output"]] == ["function_call", "message"]
    usage = done["usage"]
    assert usage["output_tokens"] == len(CALL) + len(ANSWER)
    assert usage["input_tokens"] == len(first_prompt) + len(prompt)
    # The second model turn's prompt came from the cache but for the new tokens.
    new_tokens = len(prompt) - len(first_prompt) - len(CALL)
    assert usage["input_tokens_details"]["cached_tokens"] == len(prompt) - new_tokens
    # Its call was answered inside the response: nothing waits for it now.
    late = driver.send({"type": "response.steer", "previous_response_id": target, "input": "x"})
    assert late[0]["error"]["code"] == "response_already_completed"
    assert types(driver.create("Thanks", previous_response_id=target))[0] == "response.created"


def test_refused_injections_return_their_input() -> None:
    driver = client()
    unknown = inject(driver, "resp_nope", output("call_1"))
    assert unknown[0]["error"]["code"] == "response_not_found"
    assert unknown[0]["sequence_number"] == 0 and unknown[0]["input"] == [output("call_1")]

    # Before the call is emitted: the response waits for nothing yet.
    target = driver.create("List files", tools=TOOLS)[0]["response"]["id"]
    early = inject(driver, target, output("call_1"))
    assert early[0]["error"]["code"] == "invalid_input"
    frames = driver.finish(ids=CALL)
    call_id = frames[-1]["item"]["call_id"]
    # The refused injection left nothing behind: the sequence numbers go on.
    assert frames[0]["sequence_number"] == early[0]["sequence_number"] + 1

    for bad in (
        [output("call_other")],
        [output(call_id), output(call_id)],
        [{"type": "message", "role": "user", "content": "hi"}],
        [],
    ):
        refused = inject(driver, target, *bad)
        assert [f["error"]["code"] for f in refused] == ["invalid_input"], bad
        assert refused[0]["input"] == bad
    extra = driver.send(
        {"type": "response.inject", "response_id": target, "input": [output(call_id)], "x": 1}
    )
    assert extra[0]["error"]["code"] == "invalid_input"
    assert not driver.generating  # still waiting

    assert types(inject(driver, target, output(call_id))) == ["response.inject.created"]
    # Twice: the response samples again and waits for nothing.
    again = inject(driver, target, output(call_id))
    assert again[0]["error"]["code"] == "invalid_input"
    driver.finish(ids=ANSWER)
    done = inject(driver, target, output(call_id))
    assert done[0]["error"]["code"] == "response_already_completed"


def test_parallel_calls_resume_once_every_call_is_answered() -> None:
    driver = parallel_client()
    target, calls = waiting_call(driver, two_calls())
    first, second = (call["call_id"] for call in calls)
    assert types(inject(driver, target, output(first, "one"))) == ["response.inject.created"]
    assert not driver.generating
    assert inject(driver, target, output(first))[0]["error"]["code"] == "invalid_input"
    assert types(inject(driver, target, output(second, "two"))) == ["response.inject.created"]
    prompt = driver.generating[max(driver.generating)].prompt.tokens()
    text = chatml().tokenizer.decode(prompt)
    assert text.index("one") < text.index("two")
    answer = chatml().completion_tokens(text="Done.")
    assert driver.finish(ids=answer)[-1]["type"] == "response.completed"


def test_append_is_an_alias_and_both_need_the_long_running_mode() -> None:
    driver = client()
    target, (call,) = waiting_call(driver)
    frames = driver.send({"type": "response.append", "input": [output(call["call_id"])]})
    assert types(frames) == ["response.inject.created"] and frames[0]["response_id"] == target
    assert driver.finish()[-1]["type"] == "response.completed"
    nothing = driver.send({"type": "response.append", "input": [output(call["call_id"])]})
    assert nothing[0]["error"]["code"] == "response_not_found"

    # Off: a tool call ends the response, as without the beta header.
    off = client(inject=False)
    target = off.create("List files", tools=TOOLS)[0]["response"]["id"]
    assert types(off.finish(ids=CALL))[-1] == "response.completed"
    for kind in ("response.inject", "response.append"):
        refused = off.send({"type": kind, "response_id": target, "input": [output("c")]})
        assert [f["error"]["code"] for f in refused] == ["unknown_event_type"]


def test_a_waiting_response_holds_its_lane_and_obeys_cancel() -> None:
    driver = client()
    target, _ = waiting_call(driver)
    # Queued behind the waiting response, as behind a running one.
    assert driver.create("Next") == []
    frames = driver.send({"type": "response.cancel", "response_id": target})
    assert types(frames)[:3] == ["response.incomplete", "response.created", "response.in_progress"]
    assert frames[0]["response"]["status"] == "cancelled"
    assert not driver.waits
    assert driver.finish()[-1]["type"] == "response.completed"


def test_interrupt_while_waiting_keeps_the_call_continuable() -> None:
    driver = client()
    target, (call,) = waiting_call(driver)
    frames = driver.send({"type": "response.interrupt", "response_id": target})
    assert types(frames) == ["response.interrupt.accepted", "response.incomplete"]
    assert frames[-1]["response"]["incomplete_details"] == {"reason": "interrupted"}
    assert [item["call_id"] for item in frames[-1]["response"]["output"]] == [call["call_id"]]
    continued = driver.create([output(call["call_id"])], previous_response_id=target, tools=TOOLS)
    assert types(continued) == ["response.created", "response.in_progress"]


def test_the_idle_timeout_ends_a_waiting_response_continuable() -> None:
    driver = client(inject_idle_timeout=7.5)
    target, (call,) = waiting_call(driver)
    (wait,) = driver.waits.values()
    assert wait.seconds == 7.5
    driver.conn.wait_expired(wait.key)
    frames = driver.pump()
    assert types(frames) == ["response.incomplete"]
    assert frames[0]["response"]["incomplete_details"] == {"reason": "idle_timeout"}
    driver.conn.wait_expired(wait.key)  # a late timer finds nothing
    assert driver.pump() == []
    assert inject(driver, target, output(call["call_id"]))[0]["error"]["code"] == (
        "response_already_completed"
    )
    continued = driver.create([output(call["call_id"])], previous_response_id=target, tools=TOOLS)
    assert types(continued) == ["response.created", "response.in_progress"]


def test_a_timer_of_a_resumed_response_finds_nothing() -> None:
    driver = client()
    target, (call,) = waiting_call(driver)
    (key,) = driver.waits
    inject(driver, target, output(call["call_id"]))
    driver.conn.wait_expired(key)
    assert driver.pump() == []
    assert driver.finish()[-1]["type"] == "response.completed"


def test_the_lifetime_ends_a_waiting_response_continuable() -> None:
    driver = client()
    target, (call,) = waiting_call(driver)
    driver.conn.lifetime_reached()
    frames = driver.pump()
    assert types(frames) == ["response.incomplete", "error"]
    response = frames[0]["response"]
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "connection_closing"}
    assert frames[1]["error"]["code"] == "websocket_connection_limit_reached"
    assert driver.closed is not None
    entry = driver.conn.cache.get(target)
    assert entry is not None and entry.checkpoint.fork().open_call_ids == [call["call_id"]]


def test_a_disconnect_ends_a_waiting_response_committed_and_booked() -> None:
    """The client goes away while the response waits: it ends as on a closing
    connection, its usage is booked, and it is committed (so a new connection can
    continue it); nothing else starts on its lane."""
    recorder = Recorder()
    cache = ConnectionCache(1 << 30, CacheBudget(1 << 30))
    driver = ConnectionDriver(sim_connection(cache, recorder, inject=True, durable=True))
    target, _ = waiting_call(driver)
    driver.create("Then this", tools=TOOLS)  # queued behind it on the lane
    driver.conn.connection_lost()
    driver.pump()
    (work,) = driver.persisting.values()
    assert work.finished.response_id == target and work.finished.status == "incomplete"
    assert work.finished.checkpoint is not None
    assert [finished.response_id for finished in recorder.done] == [target]
    assert not driver.generating and driver.conn.in_flight == 0


def test_a_draining_server_ends_a_waiting_response_and_a_call_does_not_wait() -> None:
    driver = client()
    target, _ = waiting_call(driver)
    other = driver.create("List files", tools=TOOLS, stream_id="b")[0]["response"]["id"]
    driver.conn.shutting_down()
    frames = driver.pump()
    assert types(frames) == ["response.incomplete"]
    assert frames[0]["response"]["id"] == target
    assert frames[0]["response"]["incomplete_details"] == {"reason": "connection_closing"}
    # The other lane's response ends calling while the server drains: it could not
    # resume here, so it ends at once, continuable, instead of waiting.
    frames = driver.finish(ids=CALL)
    assert types(frames)[-1] == "response.incomplete"
    assert frames[-1]["response"]["id"] == other
    assert not driver.waits and driver.closed is None
    assert driver.conn.in_flight == 0


def test_a_steer_while_waiting_follows_the_tool_output() -> None:
    driver = client()
    target, (call,) = waiting_call(driver)
    frames = driver.send(
        {"type": "response.steer", "previous_response_id": target, "input": "Only .py files."}
    )
    assert types(frames) == ["response.steer.accepted", "response.steer.pending"]
    assert frames[1]["required_input"] == [
        {"type": "function_call_output", "call_id": call["call_id"], "name": "exec_command"}
    ]
    assert types(inject(driver, target, output(call["call_id"]))) == ["response.inject.created"]
    text = history(driver)
    assert text.index("a.py b.txt") < text.index("Only .py files.")
    assert driver.finish()[-1]["type"] == "response.completed"


def test_an_interrupt_of_a_resumed_turn_keeps_the_earlier_turns() -> None:
    driver = client()
    target, (call,) = waiting_call(driver)
    inject(driver, target, output(call["call_id"]))
    key = max(driver.generating)
    driver.conn.engine_output(key, ANSWER[:-3])
    driver.pump()
    frames = driver.send({"type": "response.interrupt", "response_id": target})
    assert types(frames) == [
        "response.interrupt.accepted",
        "response.output_item.interrupted",
        "response.incomplete",
    ]
    assert frames[1]["output_index"] == 1
    assert [item["type"] for item in frames[-1]["response"]["output"]] == ["function_call"]
    driver.create("Go on", previous_response_id=target)
    text = history(driver)
    assert "a.py b.txt" in text and text.endswith("Go on<|end|><|start|>assistant")


def test_steering_and_injected_input_count_in_the_queue_memory() -> None:
    memory = QueueMemory(max_bytes=1 << 20, max_bytes_per_key=700)
    driver = client(queue_memory=memory, principal="sk-a")
    target = driver.create("Hi")[0]["response"]["id"]
    steer = {"type": "response.steer", "previous_response_id": target, "input": "x" * 200}
    assert types(driver.send(steer)) == ["response.steer.accepted"]
    held = memory.of("sk-a")
    assert held > 200
    assert types(driver.send(steer)) == ["response.steer.accepted"]
    refused = driver.send(steer)
    assert refused[0]["error"]["code"] == "queue_memory_exceeded"
    assert refused[0]["steer"]["input"] == "x" * 200
    assert memory.of("sk-a") == 2 * held
    # The successor takes the steers: their bytes leave the queue.
    driver.finish()
    assert memory.of("sk-a") == 0
    driver.finish()

    other = parallel_client(queue_memory=memory, principal="sk-b")
    target, calls = waiting_call(other, two_calls())
    first, second = (call["call_id"] for call in calls)
    assert types(inject(other, target, output(first, "y" * 300))) == ["response.inject.created"]
    assert memory.of("sk-b") > 300
    full = inject(other, target, output(second, "z" * 400))
    assert full[0]["error"]["code"] == "queue_memory_exceeded"
    assert full[0]["input"] == [output(second, "z" * 400)]
    assert types(inject(other, target, output(second))) == ["response.inject.created"]
    assert memory.of("sk-b") == 0 and memory.used_bytes == 0


def test_steering_input_counts_in_the_connection_queue_bound() -> None:
    driver = client(limits=ConnectionLimits(max_queued_bytes=400))
    target = driver.create("Hi")[0]["response"]["id"]
    steer = {"type": "response.steer", "previous_response_id": target, "input": "x" * 200}
    assert types(driver.send(steer)) == ["response.steer.accepted"]
    assert driver.send(steer)[0]["error"]["code"] == "websocket_queue_limit_reached"
    # Held steers are released when the connection goes.
    memory = QueueMemory(max_bytes=1 << 20, max_bytes_per_key=1 << 20)
    lost = client(queue_memory=memory, principal="sk-c")
    target = lost.create("Hi")[0]["response"]["id"]
    lost.send({**steer, "previous_response_id": target})
    assert memory.used_bytes > 0
    lost.conn.connection_lost()
    assert memory.used_bytes == 0


def test_an_output_sent_on_the_call_item_is_held_until_the_turn_ends() -> None:
    """The client answers a call as soon as its item is done, before the model turn
    ended (ChatML samples its end-of-turn token after the call): the output is held,
    and the response resumes when the turn ends calling."""
    driver = parallel_client()
    calls = chatml().completion_tokens(calls=[("exec_command", '{"cmd":"ls"}')])
    target = driver.create("List files", tools=TOOLS)[0]["response"]["id"]
    key = min(driver.generating)
    assert driver.conn.engine_output(key, calls[:-1])  # all but the end of the turn
    (call,) = [f["item"] for f in driver.pump() if f["type"] == "response.output_item.done"]
    assert types(inject(driver, target, output(call["call_id"]))) == ["response.inject.created"]
    assert inject(driver, target, output(call["call_id"]))[0]["error"]["code"] == "invalid_input"
    assert not driver.conn.engine_output(key, calls[-1:])
    driver.conn.engine_done(key)
    assert driver.pump() == []  # no terminal event, no wait: the same response resumes
    assert not driver.waits and list(driver.generating) == [key + 1]
    text = chatml().tokenizer.decode(driver.generating[max(driver.generating)].prompt.tokens())
    assert text.index('"cmd"') < text.index("a.py b.txt")
    answer = chatml().completion_tokens(text="Done.")
    done = driver.finish(ids=answer)[-1]
    assert done["type"] == "response.completed" and done["response"]["id"] == target


def test_an_output_held_when_the_turn_is_interrupted_is_committed() -> None:
    """An acknowledged output is not dropped when the turn holding it ends otherwise:
    interrupted, the response keeps the output after its completed call, so it is
    continued without sending the output again."""
    driver = parallel_client()
    calls = chatml().completion_tokens(calls=[("exec_command", '{"cmd":"ls"}')])
    target = driver.create("List files", tools=TOOLS)[0]["response"]["id"]
    key = min(driver.generating)
    assert driver.conn.engine_output(key, calls[:-1])
    (call,) = [f["item"] for f in driver.pump() if f["type"] == "response.output_item.done"]
    assert types(inject(driver, target, output(call["call_id"]))) == ["response.inject.created"]
    frames = driver.send({"type": "response.interrupt", "response_id": target})
    assert types(frames)[0] == "response.interrupt.accepted"
    assert frames[-1]["response"]["incomplete_details"] == {"reason": "interrupted"}
    entry = driver.conn.cache.get(target)
    assert entry is not None and entry.checkpoint.fork().open_call_ids == []
    assert not driver.conn.busy
    more = driver.create("Thanks.", tools=TOOLS, previous_response_id=target)
    assert more[0]["type"] == "response.created"
    text = chatml().tokenizer.decode(driver.generating[max(driver.generating)].prompt.tokens())
    assert text.index('"cmd"') < text.index("a.py b.txt") < text.index("Thanks.")
