"""The benchmarks' Chat Completions client (`hotloop.lab.agent`, mode `chat`) replays a
rollout with the whole history every turn, as chat messages: against the fake vLLM's
own `/v1/chat/completions` (bench_peers.py's floor) and against hotloop in front of that
fake, every call the server made is the rollout's and the usage is read; hotloop's
prompt is the WebSocket conversation's, token for token (the resent reasoning and calls
render as the model's own output), and after the first turn the upstream's prefix cache
serves as much of it as of the WebSocket turn's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import uvicorn
from hotloop.engines.sim import SimScript
from hotloop.lab.agent import Agent, AgentRun, chat_messages, open_transport
from hotloop.lab.fake_vllm import FakeVllm
from hotloop.lab.proc import ServerProcess
from hotloop.lab.rollout import build_rollout
from hotloop.lab.threaded import serving

ROLLOUT = build_rollout(1, tool_calls=5)


def test_items_become_the_messages_a_chat_client_sends() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    items = [
        {"type": "message", "role": "user", "content": "Go."},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Look."}]},
        call,
        {**call, "call_id": "c2"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": "two"},
        {"type": "message", "role": "assistant", "content": [{"text": "Done."}]},
    ]
    calls = [
        {"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for c in ("c1", "c2")
    ]
    assert chat_messages(items) == [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": None, "tool_calls": calls, "reasoning_content": "Look."},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "assistant", "content": "Done."},
    ]


async def _replay(mode: str, base_url: str, ws_url: str = "") -> AgentRun:
    transport = await open_transport(mode, base_url, ws_url, "bench")
    try:
        return await Agent(ROLLOUT, mode, transport, model="sim").run()
    finally:
        await transport.close()


def test_a_chat_agent_replays_the_rollout_straight_and_through_hotloop(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(ROLLOUT.sim_script()))
    fake = FakeVllm(SimScript.load(str(script)), 1e5, render=False)
    with serving(uvicorn.Config(fake, lifespan="off", log_level="warning")) as port:
        upstream = f"http://127.0.0.1:{port}"
        direct = asyncio.run(_replay("chat", f"{upstream}/v1"))
        flags = ["--engine", "upstream", "--upstream-dialect", "vllm"]
        flags += ["--upstream-replicas", upstream, "--upstream-served-model", "sim"]
        flags += ["--model", "sim", "--api-keys", "bench"]
        with ServerProcess.start(flags) as server:
            chat = asyncio.run(_replay("chat", server.base_url))
            websocket = asyncio.run(_replay("websocket", server.base_url, server.ws_url))
    for run in (direct, chat, websocket):
        assert len(run.turns) == len(ROLLOUT.steps) + 1
        assert all(turn.replayed for turn in run.turns[:-1])
        assert all(turn.output_tokens > 0 for turn in run.turns)
    assert [t.input_tokens for t in chat.turns] == [t.input_tokens for t in websocket.turns]
    # The upstream's prefix cache serves the chat loop as much as the WebSocket one.
    cached = [t.cached_tokens for t in chat.turns[1:]]
    assert cached == [t.cached_tokens for t in websocket.turns[1:]]
    assert all(cached)
