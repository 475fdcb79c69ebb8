"""The Codex CLI itself (npm `@openai/codex`, tests/codex, see `node_clients`) against a
live hotloop server over the WebSocket: `codex exec` with hotloop as its model provider
(`wire_api = "responses"`, `supports_websockets = true`) runs a whole tool loop. The sim
calls Codex's `exec_command` tool once; Codex runs the command on this machine, sends its
output back as the next turn over the same socket, and prints the sim's answer. Every
frame the server sent is checked against the SDK's models (`servers.Validating`).
tests/test_ws_codex.py replays Codex-shaped frames written by hand; this runs Codex."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest
from hotloop.cli import build_app
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimScript
from node_clients import installed
from servers import Validating, serving, sim_engine

MARK = "hotloop-codex-ok"
SCRIPT = SimScript(
    text="All done.",
    tool="exec_command",
    tool_calls=1,
    tool_arguments=f'{{"cmd":"echo {MARK}"}}',
)


@pytest.fixture(scope="module")
def codex() -> Path:
    return installed("codex") / "node_modules" / ".bin" / "codex"


def test_codex_runs_a_tool_loop_over_the_websocket(codex: Path, tmp_path: Path) -> None:
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    app = build_app(
        sim_engine(SCRIPT),
        ServerConfig(engine="sim", api_keys=("sk-codex",), data_dir=str(tmp_path / "data")),
    )
    checked = Validating(app)
    with serving(checked) as url:
        provider = (
            f'{{name="hotloop", base_url="{url}/v1", wire_api="responses", '
            'env_key="HOTLOOP_TEST_KEY", supports_websockets=true}'
        )
        done = subprocess.run(
            [
                str(codex),
                "exec",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "--model",
                "sim",
                "-c",
                "model_provider=hotloop",
                "-c",
                f"model_providers.hotloop={provider}",
                "Run the check.",
            ],
            cwd=work,
            env={**os.environ, "CODEX_HOME": str(home), "HOTLOOP_TEST_KEY": "sk-codex"},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        metrics = httpx.get(url + "/metrics", timeout=30).text
    assert checked.invalid == []
    assert done.returncode == 0, done.stdout + done.stderr
    # Codex ran the call hotloop streamed (its transcript goes to stderr), sent the
    # command's output back, and printed the answer that followed (stdout).
    assert f"echo {MARK}" in done.stderr and f"\n{MARK}\n" in done.stderr, done.stderr
    assert done.stdout.strip() == "All done."
    # Over the WebSocket: the call's turn and the answer's, the second continuing the
    # first from the connection's cache.
    assert sample(metrics, 'hotloop_turns_total{transport="websocket",outcome="completed"}') >= 2
    assert sample(metrics, 'hotloop_prompt_tokens_total{source="cache"}') > 0


def sample(metrics: str, name: str) -> float:
    (line,) = [line for line in metrics.splitlines() if line.startswith(name + " ")]
    return float(line.split()[-1])
