"""openai-node's `ResponsesWS` (npm `openai` + `ws`) against a live server: a two-turn
WebSocket continuation. The npm packages are installed into tests/node/node_modules
(git-ignored) by the fixture; node must be on PATH."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from hotloop.cli import build_app
from hotloop.config import ServerConfig
from servers import serving, sim_engine

NODE_DIR = Path(__file__).parent / "node"


@pytest.fixture(scope="module")
def node_client() -> Path:
    assert shutil.which("node") and shutil.which("npm"), "node and npm are required"
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=NODE_DIR,
            check=True,
        )
    return NODE_DIR / "two_turns.mjs"


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    config = ServerConfig(engine="sim", api_keys=("sk-node",), data_dir=str(tmp_path))
    with serving(build_app(sim_engine(), config)) as base:
        yield base + "/v1"


def test_responses_ws_two_turn_continuation(node_client: Path, url: str) -> None:
    run = subprocess.run(
        ["node", str(node_client), url, "sk-node"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    result = orjson.loads(run.stdout.strip().splitlines()[-1])
    assert result["first"].startswith("resp_") and result["second"].startswith("resp_")
    assert result["first"] != result["second"]
    assert result["text"] == "Done."
    assert result["cached_tokens"] > 0
