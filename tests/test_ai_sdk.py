"""The Vercel AI SDK (npm `ai` + `@ai-sdk/open-responses`, tests/aisdk) against a live
server over HTTP: `generateText` and `streamText`, each with a tool the sim calls once
before answering, so each runs two steps (the call; its result sent back as history)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimScript
from hotloop.transport import App
from node_clients import installed, run
from servers import serving, sim_engine

SCRIPT = SimScript(
    text="It is sunny.", tool="get_weather", tool_calls=1, tool_arguments='{"location":"Paris"}'
)


@pytest.fixture(scope="module")
def script() -> Path:
    return installed("aisdk") / "tool_loop.mjs"


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    config = ServerConfig(engine="sim", api_keys=("sk-aisdk",), data_dir=str(tmp_path))
    with serving(App.from_config(config, sim_engine(SCRIPT))) as base:
        yield base + "/v1"


def test_generate_and_stream_text_with_a_tool(script: Path, url: str) -> None:
    result: dict[str, Any] = run(script, url, "sk-aisdk")
    generated, streamed = result["generated"], result["streamed"]
    assert generated["toolCalls"] == ["get_weather"]
    assert generated["steps"] == 2 and generated["text"] == "It is sunny."
    assert generated["finishReason"] == "stop" and generated["inputTokens"] > 0
    assert streamed["steps"] == 2 and streamed["text"] == "It is sunny."
    assert streamed["finishReason"] == "stop" and streamed["deltas"] > 0
    # The SDK ran the tool once per loop with the arguments the model sent.
    assert result["calls"] == ["Paris", "Paris"]
