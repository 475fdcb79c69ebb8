"""Compaction for real: SmolLM2 (8k context) through the embedded llama engine, served
over WebSocket. A chain of long turns whose inputs alone overflow the context (counted
by `/responses/input_tokens`, which refuses it with `context_length_exceeded` as a turn
would be) completes every turn with `context_management`: it compacts whenever a prompt
passes the threshold, the engine writing the summary. Then `/responses/compact` and its
item sent back as input over a new chain."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hotloop.config import ServerConfig
from hotloop.engines.llama import LlamaConfig, LlamaEngine
from hotloop.transport import App
from sdk_events import validate
from servers import serving
from websockets.sync.client import ClientConnection, connect

pytestmark = pytest.mark.model

TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}
# About 1,100 SmolLM2 tokens of varied text per turn: eight turns pass 8k.
FACTS = " ".join(
    f"Log line {i}: the build step {i % 7} finished in {i * 13 % 97} seconds on worker {i % 5}."
    for i in range(60)
)
TURNS = 9
THRESHOLD = 3000


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    engine = LlamaEngine(LlamaConfig(n_ctx=8192, max_sequences=4, n_threads=2, seed=1))
    config = ServerConfig(
        engine="llama",
        data_dir=str(tmp_path_factory.mktemp("llama")),
        # SmolLM2 writes about 15 tokens/s on one thread: short summaries keep it quick.
        compaction_summary_tokens=48,
    )
    with serving(App.from_config(config, engine)) as url:
        yield url


def socket(base: str) -> ClientConnection:
    return connect(base.replace("http://", "ws://") + "/v1/responses", max_size=None)


def turn(ws: ClientConnection, **fields: Any) -> list[dict[str, Any]]:
    ws.send(
        orjson.dumps(
            {"type": "response.create", "model": "smollm2", "max_output_tokens": 8, **fields}
        ).decode()
    )
    events = []
    while True:
        events.append(validate(ws.recv()))
        if events[-1]["type"] in TERMINAL:
            return events


def message(i: int) -> str:
    return f"Turn {i}. {FACTS} Reply OK."


def chain(ws: ClientConnection, **fields: Any) -> list[list[dict[str, Any]]]:
    """Up to TURNS long turns, each continuing the last; stops at the first failure."""
    turns: list[list[dict[str, Any]]] = []
    previous = None
    for i in range(TURNS):
        events = turn(ws, input=message(i), previous_response_id=previous, **fields)
        turns.append(events)
        if events[-1]["type"] == "error" or events[-1]["response"]["status"] == "failed":
            break
        previous = events[-1]["response"]["id"]
    return turns


def test_the_chain_overflows_the_context_without_compaction(base: str) -> None:
    # Without compaction the chain holds at least every turn's input: counted as one
    # prompt, the model's own format and tokenizer refuse it, as the turn that crossed
    # the line would be refused (no need to spend the engine on knowing that).
    history = [{"role": "user", "content": message(i)} for i in range(TURNS)]
    reply = httpx.post(
        base + "/v1/responses/input_tokens",
        json={"model": "SmolLM2-135M-Instruct", "input": history},
        timeout=60,
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "context_length_exceeded"


def test_context_management_keeps_the_chain_going(base: str) -> None:
    management = [{"type": "compaction", "compact_threshold": THRESHOLD}]
    with socket(base) as ws:
        turns = chain(ws, context_management=management)
    terminals = [events[-1] for events in turns]
    assert len(turns) == TURNS
    assert all(t["type"] in ("response.completed", "response.incomplete") for t in terminals)
    compacted = [
        events
        for events in turns
        if any(e["type"] == "response.compaction.compacting" for e in events)
    ]
    assert compacted, "no turn passed the threshold"
    for events in compacted:
        output = events[-1]["response"]["output"]
        assert output[0]["type"] == "compaction"
    # After a compaction the prompt restarts small: no turn's prompt approaches 8k.
    last = terminals[-1]["response"]["usage"]
    assert last["input_tokens"] < 2 * THRESHOLD + 1500


def test_compact_then_a_new_chain(base: str) -> None:
    conversation = [
        {"role": "user", "content": "My project is called Bluebird and ships on Friday."},
        {"role": "assistant", "content": "Noted: Bluebird ships on Friday."},
    ]
    reply = httpx.post(
        base + "/v1/responses/compact",
        json={"model": "SmolLM2-135M-Instruct", "input": conversation},
        timeout=300,
    )
    assert reply.status_code == 200, reply.text
    (item,) = reply.json()["output"]
    follow = [item, {"role": "user", "content": "What ships on Friday?"}]
    with socket(base) as ws:
        events = turn(ws, input=follow)
    response = events[-1]["response"]
    # SmolLM2 answers within the 8 tokens it is given, or is cut there.
    assert response["status"] in ("completed", "incomplete") and response["output"]
    counted = httpx.post(
        base + "/v1/responses/input_tokens",
        json={"model": "SmolLM2-135M-Instruct", "input": follow},
        timeout=60,
    )
    assert response["usage"]["input_tokens"] == counted.json()["input_tokens"]
