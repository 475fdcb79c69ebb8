"""WebSocket mode spoken by the real openai SDK: `client.responses.connect()` sync and
async, `AsyncResponsesWebSocketSession` lanes with a warm-up and a fork, and a tool
loop with `function_call_output`. Every frame the server sends is validated strictly
with the SDK's models by the server fixture."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hotloop.engines.sim import SimScript
from openai import AsyncOpenAI, OpenAI
from openai.lib.responses_websocket import (
    AsyncResponsesWebSocketSession,
    ResponsesWebSocketLimits,
)
from sdk_events import validate
from servers import hotloop_server
from shell_tool import TOOLS

TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}
SCRIPT = SimScript(
    text="All done.", tool="exec_command", tool_calls=2, tool_arguments='{"cmd":"ls"}'
)
LIMITS = ResponsesWebSocketLimits(
    max_lanes=8,
    max_events_per_lane=4096,
    max_events=8192,
    max_bytes_per_lane=1 << 24,
    max_bytes=1 << 25,
)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with hotloop_server(SCRIPT, api_keys=("sk-test",)) as url:
        yield url + "/v1"


def test_sync_connect_tool_loop(base_url: str) -> None:
    client = OpenAI(base_url=base_url, api_key="sk-test")
    with client.responses.connect() as conn:
        previous: str | None = None
        pending: list[Any] = [{"type": "message", "role": "user", "content": "list files"}]
        calls = 0
        while True:
            conn.response.create(
                model="sim",
                input=pending,
                tools=TOOLS,
                store=False,
                stream=True,
                **({"previous_response_id": previous} if previous else {}),
            )
            while True:
                raw = conn.recv_bytes()
                event = validate(raw)
                if event["type"] in TERMINAL:
                    break
            assert event["type"] == "response.completed", event
            response = conn.parse_event(raw).response  # type: ignore[union-attr]
            previous = response.id
            fc = [item for item in response.output if item.type == "function_call"]
            if not fc:
                break
            calls += 1
            assert fc[0].name == "exec_command" and fc[0].arguments == '{"cmd":"ls"}'
            pending = [{"type": "function_call_output", "call_id": fc[0].call_id, "output": "a b"}]
            usage = response.usage
            assert usage is not None
        assert calls == 2
        assert response.output_text == "All done."
        assert usage.input_tokens_details.cached_tokens > 0


async def test_async_connect_continuation(base_url: str) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key="sk-test")
    async with client.responses.connect() as conn:
        await conn.response.create(model="sim", input="hello", store=False)
        ids = []
        for _ in range(2):
            async for event in conn:
                if event.type in TERMINAL:
                    break
            assert event.type == "response.completed"
            ids.append(event.response.id)
            await conn.response.create(
                model="sim",
                input=[{"type": "message", "role": "user", "content": "more"}],
                previous_response_id=event.response.id,
            )
        async for event in conn:
            if event.type in TERMINAL:
                break
        assert event.type == "response.completed"
        assert event.response.previous_response_id == ids[1]


async def test_session_lanes_warm_up_and_fork(base_url: str) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key="sk-test")
    async with client.responses.connect() as conn:
        async with AsyncResponsesWebSocketSession(conn, limits=LIMITS) as session:
            main = session.lane("main")
            side = session.lane("side")
            await main.send(
                {
                    "type": "response.create",
                    "model": "sim",
                    "input": [{"type": "message", "role": "developer", "content": "Be terse."}],
                    "tools": TOOLS,
                    "generate": False,
                }
            )
            warm = await main.get_final_response()
            assert warm.status == "completed" and warm.output == []
            # Two lanes continue the warm-up concurrently: the second is a fork.
            for lane in (main, side):
                await lane.send(
                    {
                        "type": "response.create",
                        "model": "sim",
                        "input": "go",
                        "tools": TOOLS,
                        "previous_response_id": warm.id,
                    }
                )
            first, forked = await asyncio.gather(
                main.get_final_response(), side.get_final_response()
            )
            for response in (first, forked):
                assert response.status == "completed"
                assert response.previous_response_id == warm.id
                assert response.usage is not None
                assert response.usage.input_tokens_details.cached_tokens > 0
            await session.default.send(
                {"type": "response.create", "model": "sim", "input": "default lane"}
            )
            assert (await session.default.get_final_response()).status == "completed"
