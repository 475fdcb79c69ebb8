"""Steering and injection on real engines: the `Connection` hands its prompts to the
llama engine with SmolLM2 (llama.cpp's own counters say what it evaluated) and to the
upstream engine over a fake vLLM (the ids it was sent). A steer's successor and a resumed
long-running response extend the tokens the engine already holds: only the new tokens
are evaluated."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from connection_driver import run_on
from engine_conversation import small_llama
from fake_upstreams import FakeUpstream, Script, serving
from hotloop._core import ChatFormat, Prompt, Tokenizer
from hotloop.engines.base import EngineSession, Sampling
from hotloop.engines.llama import SMOLLM2_DEFAULT_SYSTEM, LlamaEngine, LlamaSession, TurnStats
from hotloop.engines.upstream import UpstreamConfig, UpstreamEngine, UpstreamSession
from hotloop.lab.llama_server import LlamaServer
from hotloop.native_deps import ensure_llama_server, smollm2_gguf_path
from hotloop.protocol import CacheBudget, Connection, ConnectionCache
from test_protocol_connection import TOOLS

# Two worked examples in the history, so that the 135M model answers the next request
# with a call too (greedy decoding: the same call every run).


def example(n: int, path: str, listing: str) -> list[dict[str, Any]]:
    return [
        {"type": "message", "role": "user", "content": f"List the files in {path}."},
        {
            "type": "function_call",
            "call_id": f"call_{n}",
            "name": "exec_command",
            "arguments": orjson.dumps({"cmd": f"ls {path}"}).decode(),
        },
        {"type": "function_call_output", "call_id": f"call_{n}", "output": listing},
        {"type": "message", "role": "assistant", "content": f"The folders are {listing}."},
    ]


EXAMPLES = [
    *example(1, "/home", "alice and bob"),
    *example(2, "/var", "log and lib"),
    {"type": "message", "role": "user", "content": "List the files in /tmp."},
]


def connection(chat_format: ChatFormat, context_window: int) -> Connection:
    return Connection(
        chat_format=chat_format,
        context_window=context_window,
        model="m",
        cache=ConnectionCache(1 << 30, CacheBudget(1 << 30)),
        inject=True,
    )


def send(conn: Connection, event: dict[str, Any]) -> None:
    conn.receive_text(orjson.dumps(event))


def create(conn: Connection, input: Any, max_output_tokens: int, **fields: Any) -> None:
    """A greedy request: the model answers the same every run."""
    body = {
        "model": "sim",
        "input": input,
        "temperature": 0,
        "max_output_tokens": max_output_tokens,
    }
    send(conn, {"type": "response.create", **body, **fields})


@pytest.fixture
async def llama() -> AsyncIterator[LlamaEngine]:
    async with small_llama() as engine:
        yield engine


class Counted:
    """A llama session's turns as the engine counted them: its own bookkeeping and
    llama.cpp's prompt-eval counter (`n_p_eval`) over each generation."""

    def __init__(self, engine: LlamaEngine) -> None:
        self.engine = engine
        self.session: LlamaSession = engine.session()
        self.turns: list[TurnStats] = []
        self.prompt_evals: list[int] = []
        self._before = engine.perf()[0]

    async def ended(self) -> None:
        await self.session.settled()
        assert self.session.last_turn is not None
        self.turns.append(self.session.last_turn)
        after = self.engine.perf()[0]
        self.prompt_evals.append(after - self._before)
        self._before = after

    def only_new_tokens(self, earlier: TurnStats, later: TurnStats) -> None:
        """`later` reused everything `earlier` left in the KV (its prompt and the ids it
        sampled but the last, which is never fed back) and evaluated the rest alone."""
        assert later.reused_tokens == earlier.prompt_tokens + earlier.sampled_tokens - 1
        assert later.evaluated_tokens == later.prompt_tokens - later.reused_tokens
        assert self.prompt_evals[-1] == later.evaluated_tokens


@pytest.mark.model
async def test_a_steer_successor_evaluates_only_the_steering_tokens(llama: LlamaEngine) -> None:
    counted = Counted(llama)
    conn = connection(llama.chat_format, llama.context_window)
    create(conn, "Tell me about the city of Paris.", 24)
    started = conn.actions()
    created = next(action for action in started if isinstance(action, bytes))
    target = orjson.loads(created)["response"]["id"]
    send(conn, {"type": "response.steer", "previous_response_id": target, "input": "Be brief."})
    frames = await run_on(conn, counted.session, counted.ended, started)
    kinds = [frame["type"] for frame in frames]
    assert kinds.count("response.created") == 2 and "response.steer.accepted" in kinds
    successor = [f for f in frames if f["type"] == "response.created"][1]["response"]
    assert successor["previous_response_id"] == target
    assert frames[-1]["response"]["id"] == successor["id"]
    first, second = counted.turns
    counted.only_new_tokens(first, second)
    assert second.evaluated_tokens < 20  # "Be brief." in its user turn, and the header
    await counted.session.close()


@pytest.mark.model
async def test_an_injected_tool_output_resumes_the_same_sequence(llama: LlamaEngine) -> None:
    counted = Counted(llama)
    conn = connection(llama.chat_format, llama.context_window)
    create(conn, EXAMPLES, 64, tools=TOOLS)
    frames = await run_on(conn, counted.session, counted.ended)
    calls = [
        f["item"]
        for f in frames
        if f["type"] == "response.output_item.done" and f["item"]["type"] == "function_call"
    ]
    text = "".join(f["delta"] for f in frames if f["type"] == "response.output_text.delta")
    assert calls, text  # the model called the tool, and waits
    assert frames[-1]["type"] == "response.output_item.done"
    target = frames[0]["response"]["id"]
    output = {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "x.log"}
    send(conn, {"type": "response.inject", "response_id": target, "input": [output]})
    frames = await run_on(conn, counted.session, counted.ended)
    assert frames[0]["type"] == "response.inject.created"
    assert frames[-1]["response"]["id"] == target
    assert frames[-1]["type"] in ("response.completed", "response.incomplete")
    first, second = counted.turns[:2]
    counted.prompt_evals = counted.prompt_evals[:2]
    counted.only_new_tokens(first, second)
    await counted.session.close()


async def test_the_upstream_is_sent_the_parked_prompt_extended() -> None:
    harmony = ChatFormat.harmony()
    call = harmony.completion_tokens(calls=[("exec_command", '{"cmd":"ls"}')])
    async with serving(FakeUpstream("vllm", Script(reply=call))) as (vllm,):
        engine = UpstreamEngine(
            UpstreamConfig(dialect="vllm", replicas=(vllm.url,), model="m", context_window=1 << 16),
            harmony,
        )
        await engine.start()
        session: EngineSession = engine.session()
        conn = connection(harmony, 1 << 16)
        send(
            conn, {"type": "response.create", "model": "sim", "input": "List files", "tools": TOOLS}
        )
        frames = await run_on(conn, session)
        call_id = frames[-1]["item"]["call_id"]
        vllm.script = Script(reply=harmony.completion_tokens(text="One file."))
        output = {"type": "function_call_output", "call_id": call_id, "output": "a.py"}
        send(
            conn,
            {
                "type": "response.inject",
                "response_id": frames[0]["response"]["id"],
                "input": [output],
            },
        )
        frames = await run_on(conn, session)
        assert frames[-1]["type"] == "response.completed"
        parked, resumed = (request["prompt"] for request in vllm.requests)
        # Byte for byte the parked prompt and the sampled call, then only the new tokens.
        assert resumed[: len(parked) + len(call)] == parked + call
        new = harmony.tokenizer.decode(resumed[len(parked) + len(call) :])
        assert new == (
            "<|start|>functions.exec_command to=assistant<|channel|>commentary"
            "<|message|>a.py<|end|><|start|>assistant"
        )
        await session.close()
        await engine.close()


class Recorded:
    """A session whose prompts and llama-server timings are kept, generation by
    generation."""

    def __init__(self, session: UpstreamSession) -> None:
        self.session = session
        self.prompts: list[list[int]] = []
        self.timings: list[dict[str, Any]] = []

    async def generate(
        self, prompt: Prompt, sampling: Sampling, route_key: str | None
    ) -> AsyncIterator[list[int]]:
        self.prompts.append(prompt.tokens())
        stream = self.session.generate(prompt, sampling, route_key)
        try:
            async for ids in stream:
                yield ids
        finally:
            # The connection stops reading at the model's stop token; the stream's last
            # event, with llama-server's timings, follows it at once: read it too.
            async for _ in stream:
                pass

    async def ended(self) -> None:
        assert self.session.last_timings is not None
        self.timings.append(dict(self.session.last_timings))


@pytest.mark.model
async def test_llama_server_serves_the_resumed_prompt_from_its_cache() -> None:
    # The real llama-server (its `cache_n`): an injected output resumes the slot that
    # holds the parked prompt and the sampled call; only the output's turn is evaluated.
    server = LlamaServer(ensure_llama_server(), smollm2_gguf_path(), n_ctx=4096, threads=1)
    await server.start()
    tokenizer = Tokenizer.from_gguf(str(smollm2_gguf_path()))
    smollm2 = ChatFormat.chatml(tokenizer, default_system=SMOLLM2_DEFAULT_SYSTEM)
    config = UpstreamConfig(
        dialect="llamacpp", replicas=(server.url,), model="m", context_window=4096
    )
    engine = UpstreamEngine(config, smollm2)
    await engine.start()
    try:
        recorded = Recorded(engine.session())
        conn = connection(smollm2, 4096)
        create(conn, EXAMPLES, 64, tools=TOOLS)
        frames = await run_on(conn, recorded, recorded.ended)  # type: ignore[arg-type]
        calls = [
            f["item"]
            for f in frames
            if f["type"] == "response.output_item.done" and f["item"]["type"] == "function_call"
        ]
        assert calls  # the model called the tool, and waits
        output = {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "x"}
        target = frames[0]["response"]["id"]
        send(conn, {"type": "response.inject", "response_id": target, "input": [output]})
        frames = await run_on(conn, recorded, recorded.ended)  # type: ignore[arg-type]
        assert frames[-1]["response"]["id"] == target
        parked, resumed = recorded.prompts[:2]
        first, second = recorded.timings[:2]
        assert resumed[: len(parked)] == parked
        assert first["cache_n"] == 0 and first["prompt_n"] == len(parked)
        # Served from the slot: the parked prompt and the call the model sampled (but its
        # last id, never decoded); evaluated: the output's tool turn and the next header.
        assert second["cache_n"] == len(parked) + first["predicted_n"] - 1
        assert second["cache_n"] + second["prompt_n"] == len(resumed)
        await recorded.session.close()
    finally:
        await engine.close()
        await server.stop()
