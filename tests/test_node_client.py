"""openai-node's `ResponsesWS` (npm `openai` + `ws`) against a live server: a two-turn
WebSocket continuation. The npm packages are in tests/node (see `node_clients`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hotloop.config import ServerConfig
from hotloop.transport import App
from node_clients import installed, run
from servers import serving, sim_engine


@pytest.fixture(scope="module")
def node_client() -> Path:
    return installed("node") / "two_turns.mjs"


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    config = ServerConfig(engine="sim", api_keys=("sk-node",), data_dir=str(tmp_path))
    with serving(App.from_config(config, sim_engine())) as base:
        yield base + "/v1"


def test_responses_ws_two_turn_continuation(node_client: Path, url: str) -> None:
    result: dict[str, Any] = run(node_client, url, "sk-node")
    assert result["first"].startswith("resp_") and result["second"].startswith("resp_")
    assert result["first"] != result["second"]
    assert result["text"] == "Done."
    assert result["cached_tokens"] > 0
