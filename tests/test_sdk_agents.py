"""openai-agents over WebSocket mode: an Agent with a function tool runs against the
sim engine's tool script; the tool runs exactly as often as the script calls it."""

from __future__ import annotations

from agents import Agent, function_tool, set_tracing_disabled
from agents.responses_websocket_session import responses_websocket_session
from hotloop.engines.sim import SimScript
from servers import hotloop_server

CALLS = 3


async def test_agent_with_function_tool_completes() -> None:
    set_tracing_disabled(True)
    ran: list[tuple[int, int]] = []

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        ran.append((a, b))
        return a + b

    script = SimScript(
        text="The sum is 3.", tool="add", tool_calls=CALLS, tool_arguments='{"a":1,"b":2}'
    )
    with hotloop_server(script) as url:
        agent = Agent(name="adder", instructions="Use the tool.", tools=[add], model="sim")
        async with responses_websocket_session(api_key="sk-any", base_url=url + "/v1") as ws:
            result = await ws.run(agent, "add 1 and 2, three times")
    assert ran == [(1, 2)] * CALLS
    assert result.final_output == "The sum is 3."
