"""A stored long-running response (protocol.md section 8) keeps how its input and output
interleave: the tool outputs injected between its model turns, steering input accepted
while it waited, and outputs it acknowledged but held when it ended. Rebuilt from the
store (a restart, another node), it gives back exactly the tokens the warm connection
held, with the calls its outputs answered closed, and `input_items` lists the injected
input after the request's.

The responses are made by a real `Connection` (sans-I/O), committed through the real
`Ledger` into a real SQLite store, and rebuilt by `Ledger.restore`; the server tests at
the end do the same over a socket, across a restart and across a dropped socket."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from connection_driver import ANSWER, FORMAT, ConnectionDriver, sim_connection
from hotloop._core import ChatFormat, Checkpoint, Conversation, parse_request
from hotloop.config import ServerConfig
from hotloop.engines.sim import SIM_FORMATS, from_config
from hotloop.ledger import Ledger
from hotloop.protocol import CacheBudget, ConnectionCache, Finished
from hotloop.protocol.compaction import Compactor
from hotloop.store import ModelTurn, StoredResponse
from hotloop.store.records import RecordError, prepare
from hotloop.transport import App
from openai.types.responses import ResponseItemList
from servers import HANG_GUARD, Validating, serving, sim_engine
from test_protocol_connection import CALL, TOOLS, Recorder
from test_protocol_inject import chatml, inject, output, two_calls, types
from test_sdk_inject import SCRIPT, TERMINAL
from test_store_replay import RecordingEngine
from websockets.sync.client import connect


def durable_driver(chat_format: ChatFormat) -> ConnectionDriver:
    cache = ConnectionCache(1 << 30, CacheBudget(1 << 30))
    connection = sim_connection(cache, Recorder(), chat_format, inject=True, durable=True)
    return ConnectionDriver(connection)


def ledger(tmp_path: Path, sim_format: str) -> Ledger:
    engine = from_config(ServerConfig(engine="sim", sim_format=sim_format))
    return Ledger(engine, cache_memory_bytes=1 << 30, max_cached_bytes=1 << 30, data_dir=tmp_path)


def committed(driver: ConnectionDriver) -> tuple[Finished, list[dict[str, Any]]]:
    """The response the driver is committing, and its terminal frames once committed."""
    (work,) = driver.persisting.values()
    return work.finished, driver.commit(work.key)


def last_call(frames: list[dict[str, Any]]) -> dict[str, Any]:
    (call,) = [f["item"] for f in frames if f["type"] == "response.output_item.done"]
    assert call["type"] == "function_call", call
    return call


def tokens(checkpoint: Checkpoint) -> list[int]:
    return checkpoint.fork().prompt().tokens()


async def rebuilt(ledger: Ledger, finished: Finished) -> Checkpoint:
    await ledger.persist(finished)
    restored = await ledger.restore(finished.response_id, None)
    assert restored is not None
    checkpoint, root = restored
    assert root == finished.response_id
    return checkpoint


async def input_item_types(ledger: Ledger, response_id: str) -> list[str]:
    assert ledger.store is not None
    page = await ledger.store.list_input_items(response_id, None, order="asc", limit=100)
    assert page is not None
    return [item.get("role") or item["type"] for item in page.data]


@pytest.mark.parametrize("sim_format", SIM_FORMATS)
async def test_injected_outputs_and_steering_replay_to_the_warm_tokens(
    tmp_path: Path, sim_format: str
) -> None:
    """Harmony and ChatML (the core's item formats) and Qwen3's own template."""
    fmt = SIM_FORMATS[sim_format]()
    call_ids = fmt.completion_tokens(calls=[("exec_command", '{"cmd": "ls"}')])
    driver = durable_driver(fmt)
    target = driver.create("List files", tools=TOOLS)[0]["response"]["id"]
    call = last_call(driver.finish(ids=call_ids))
    steer = {"type": "response.steer", "previous_response_id": target, "input": "Only .py"}
    assert types(driver.send(steer)) == ["response.steer.accepted", "response.steer.pending"]
    inject(driver, target, output(call["call_id"]))
    second = last_call(driver.finish(ids=call_ids))
    inject(driver, target, output(second["call_id"], "c.py"))
    driver.finish(ids=fmt.completion_tokens(text="Two files."))
    finished, frames = committed(driver)
    assert frames[-1]["type"] == "response.completed"
    assert len(finished.segments) == 3

    books = ledger(tmp_path, sim_format)
    await books.start()
    try:
        checkpoint = await rebuilt(books, finished)
        assert finished.checkpoint is not None
        assert tokens(checkpoint) == tokens(finished.checkpoint)
        assert checkpoint.fork().open_call_ids == []
        assert books.metrics.store_rerenders.value == 0
        # The request's input, then the outputs and the steering input in the order
        # they were committed inside the response.
        assert await input_item_types(books, target) == [
            "user",
            "function_call_output",
            "user",
            "function_call_output",
        ]
    finally:
        await books.close()


async def test_another_format_rerenders_the_turns_with_the_outputs_between(
    tmp_path: Path,
) -> None:
    """Rebuilt from text (the stored ids belong to another format): the same text, and
    the injected outputs still answer their calls."""
    driver = durable_driver(FORMAT)
    target = driver.create("List files", tools=TOOLS)[0]["response"]["id"]
    call = driver.finish(ids=CALL)[-1]["item"]
    inject(driver, target, output(call["call_id"]))
    driver.finish(ids=ANSWER)
    finished, _ = committed(driver)

    books = ledger(tmp_path, "harmony")
    await books.start()
    try:
        await books.persist(finished)
        assert books.store is not None
        chain = await books.store.load_chain(target, None)
        assert chain is not None
        conversation = Conversation(FORMAT, context_window=1 << 20)
        rerenders: list[None] = []
        chain.replay(conversation, Compactor.ephemeral(), "another", lambda: rerenders.append(None))
        assert len(rerenders) == 2  # both model turns
        assert conversation.open_call_ids == []
        assert finished.checkpoint is not None
        warm = tokens(finished.checkpoint)
        assert FORMAT.tokenizer.decode(conversation.prompt().tokens()) == FORMAT.tokenizer.decode(
            warm
        )
    finally:
        await books.close()


async def test_outputs_held_when_the_response_ends_are_kept(tmp_path: Path) -> None:
    """Two parallel calls, one answered, then the idle timeout: the acknowledged output
    is committed after the model turn, so the rebuilt response waits for the other call
    only, and a continuation answers just that one."""
    fmt = chatml()
    driver = durable_driver(fmt)
    target = driver.create("List files", tools=TOOLS)[0]["response"]["id"]
    frames = driver.finish(ids=two_calls())
    first, second = [f["item"] for f in frames if f["type"] == "response.output_item.done"]
    assert types(inject(driver, target, output(first["call_id"]))) == ["response.inject.created"]
    (key,) = driver.waits
    driver.conn.wait_expired(key)
    driver.pump()
    finished, frames = committed(driver)
    assert frames[-1]["response"]["incomplete_details"] == {"reason": "idle_timeout"}

    books = ledger(tmp_path, "smollm2")
    await books.start()
    try:
        checkpoint = await rebuilt(books, finished)
        assert finished.checkpoint is not None
        assert checkpoint.fork().open_call_ids == [second["call_id"]]
        # Continued with the other output, both give the engine the same prompt.
        body = {"model": "sim", "input": [output(second["call_id"], "/src")], "tools": TOOLS}
        prompts = []
        for start in (checkpoint, finished.checkpoint):
            conversation = start.fork()
            conversation.extend(parse_request(orjson.dumps(body)))
            prompts.append(conversation.prompt().tokens())
        assert prompts[0] == prompts[1]
        assert await input_item_types(books, target) == ["user", "function_call_output"]
    finally:
        await books.close()
    # The warm connection continues it with the other output only.
    more = driver.create([output(second["call_id"])], tools=TOOLS, previous_response_id=target)
    assert more[0]["type"] == "response.created"


def test_model_turns_that_do_not_fit_the_record_are_refused() -> None:
    response = orjson.dumps({"id": "resp_x", "output": [{"type": "message"}]})
    record = StoredResponse(
        id="resp_x",
        owner=None,
        previous_response_id=None,
        created_at=0,
        response=response,
        input_items=b'[{"role":"user","content":"hi"}]',
        output_token_ids=[1, 2, 3],
        model_turns=(ModelTurn(1, 2, 0), ModelTurn(1, 3, 5)),
    )
    with pytest.raises(RecordError, match="more input items"):
        prepare(record)


def test_a_long_running_response_survives_a_restart(tmp_path: Path) -> None:
    """Over a real socket: a stored long-running response with an injected output is
    continued on its socket (warm), then again over HTTP on a restarted server (rebuilt
    from the store): the engine gets the same prompt ids, nothing rendered again from
    text, and `input_items` lists the injected output."""
    config = ServerConfig(engine="sim", data_dir=str(tmp_path), inject=True)
    warm = RecordingEngine(sim_engine(SCRIPT))
    with serving(checked := Validating(App.from_config(config, warm))) as base:
        with connect(base.replace("http://", "ws://") + "/v1/responses") as ws:
            ws.send(create(input="List files", tools=TOOLS))
            created = orjson.loads(ws.recv())
            target = created["response"]["id"]
            while (event := orjson.loads(ws.recv()))["type"] != "response.output_item.done":
                pass
            answer = output(event["item"]["call_id"])
            injection = {"type": "response.inject", "response_id": target, "input": [answer]}
            ws.send(orjson.dumps(injection).decode())
            assert until_terminal(ws)["type"] == "response.completed"
            then = {
                "model": "sim",
                "input": "Thanks.",
                "tools": TOOLS,
                "previous_response_id": target,
            }
            ws.send(create(**then))
            assert until_terminal(ws)["type"] == "response.completed"
    assert checked.invalid == []
    assert len(warm.prompts) == 3  # the two model turns of the response, the continuation

    rebuilt = RecordingEngine(sim_engine(SCRIPT))
    with serving(App.from_config(config, rebuilt)) as base:
        reply = httpx.post(base + "/v1/responses", json={"model": "sim", **then}, timeout=60)
        assert reply.status_code == 200, reply.text
        metrics = httpx.get(base + "/metrics").text
        assert "hotloop_store_rebuilds_total 1" in metrics
        assert "hotloop_store_rerenders_total 0" in metrics
        items = httpx.get(f"{base}/v1/responses/{target}/input_items?order=asc").json()
        ResponseItemList.model_validate(items, strict=True)
        assert [item["type"] for item in items["data"]] == ["message", "function_call_output"]
        assert items["data"][1]["call_id"] == answer["call_id"]
    assert rebuilt.prompts == warm.prompts[2:]


def create(**fields: Any) -> str:
    return orjson.dumps({"type": "response.create", "model": "sim", **fields}).decode()


def until_terminal(ws: Any) -> dict[str, Any]:
    event: dict[str, Any] = orjson.loads(ws.recv())
    while event["type"] not in TERMINAL:
        event = orjson.loads(ws.recv())
    return event


def test_a_dropped_socket_leaves_a_waiting_response_continuable(tmp_path: Path) -> None:
    """The socket drops while the response waits for tool output: the response is
    committed as it stands, and the client continues it from a new connection with the
    call's output."""
    config = ServerConfig(engine="sim", data_dir=str(tmp_path), inject=True)
    with serving(App.from_config(config, sim_engine(SCRIPT))) as base:
        url = base.replace("http://", "ws://") + "/v1/responses"
        with connect(url) as dropped:
            dropped.send(create(input="List files", tools=TOOLS))
            target = orjson.loads(dropped.recv())["response"]["id"]
            while (event := orjson.loads(dropped.recv()))["type"] != "response.output_item.done":
                pass
            call = event["item"]
            # No close frame: the network dropped (and the client does not wait to close).
            dropped.socket.shutdown(socket.SHUT_RDWR)
            dropped.socket.close()
        # The commit runs after the disconnect: a client that reconnects at once may
        # have to ask again (bounded: only a broken run reaches the guard).
        deadline = time.monotonic() + HANG_GUARD
        while (stored := httpx.get(f"{base}/v1/responses/{target}")).status_code == 404:
            assert time.monotonic() < deadline, "never committed"
        stored_response = stored.json()
        assert stored_response["status"] == "incomplete"
        assert stored_response["incomplete_details"] == {"reason": "connection_closing"}
        with connect(url) as ws:
            ws.send(create(input=[output(call["call_id"])], previous_response_id=target))
            assert until_terminal(ws)["type"] == "response.completed"
