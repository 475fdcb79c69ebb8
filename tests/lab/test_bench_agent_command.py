"""`hotloop bench agent` end to end, small: live servers, the sim in SmolLM2's ChatML,
hotloop's WebSocket mode and the open-model peer in the same run."""

import argparse
import json
from pathlib import Path

import pytest
from hotloop.cli import argument_parser
from hotloop.lab.command import run_agent, run_plot

TOOL_CALLS = 5


def _agent_args(out: Path, *flags: str) -> argparse.Namespace:
    return argument_parser(lab=True).parse_args(
        ["bench", "agent", "--tool-calls", str(TOOL_CALLS), "--out", str(out), *flags]
    )


def test_open_model_peer_runs_beside_hotloop_in_smollm2(tmp_path: Path) -> None:
    args = _agent_args(
        tmp_path,
        "--format",
        "smollm2",
        "--speeds",
        "50000",
        "--sim-ttft",
        "0.001",
        "--sim-prefill",
        "1e7",
        "--modes",
        "websocket",
        "--baseline-modes",
        "http_full,websocket",
    )
    run_agent(args)
    results = json.loads((tmp_path / "agent_smollm2.json").read_text())
    assert results["format"] == "smollm2"
    (speed,) = results["speeds"]
    runs = speed["runs"]
    assert set(runs) == {"websocket", "peer_open-model_http_full", "peer_open-model_websocket"}
    for name, run in runs.items():
        summary = run["summary"]
        # Every turn ran and the sim replayed every recorded call: the peer's ids carried
        # the conversation the script knows.
        assert summary["turns"] == TOOL_CALLS + 1, name
        assert summary["replayed_calls"] == TOOL_CALLS, name
        assert run["turns"][-1]["output_tokens"] > 0, name
    # The server reports the prompt it fed the engine: the peer's equals hotloop's, turn
    # by turn, whether the client sent the whole history or only the new tool output.
    prompts = {name: [t["input_tokens"] for t in run["turns"]] for name, run in runs.items()}
    assert prompts["peer_open-model_http_full"] == prompts["websocket"]
    assert prompts["peer_open-model_websocket"] == prompts["websocket"]
    assert "peer_open-model_http_full_over_websocket" in speed["targets"]
    plots = [tmp_path / f"agent_smollm2_{kind}.png" for kind in ("ratio_to_ideal", "per_turn")]
    assert all(plot.stat().st_size > 0 for plot in plots)
    assert not (tmp_path / "agent.json").exists()
    # `hotloop bench plot` redraws them from the JSON, under the same names.
    for plot in plots:
        plot.unlink()
    run_plot(argument_parser(lab=True).parse_args(["bench", "plot", "--out", str(tmp_path)]))
    assert all(plot.stat().st_size > 0 for plot in plots)


def test_a_peer_in_another_format_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="the peer is open-model, not harmony"):
        run_agent(_agent_args(tmp_path, "--format", "smollm2", "--baseline", "harmony"))


def test_long_running_mode_replays_the_rollout_in_one_response(tmp_path: Path) -> None:
    flags = ("--speeds", "50000", "--sim-ttft", "0.001", "--sim-prefill", "1e7", "--baseline", "")
    run_agent(_agent_args(tmp_path, *flags, "--modes", "websocket,long_running"))
    (speed,) = json.loads((tmp_path / "agent.json").read_text())["speeds"]
    chain, long = speed["runs"]["websocket"], speed["runs"]["long_running"]
    assert long["summary"]["turns"] == TOOL_CALLS + 1
    assert long["summary"]["replayed_calls"] == TOOL_CALLS
    # One response: its usage, reported at its end, adds up the chain's turns, and the
    # prompt tokens not served from the cache are the same: nothing was rendered again.
    assert long["turns"][-1]["input_tokens"] == sum(t["input_tokens"] for t in chain["turns"])
    assert (
        long["summary"]["new_prompt_tokens_per_turn"]
        == chain["summary"]["new_prompt_tokens_per_turn"]
    )
    assert long["summary"]["ideal_s"] == chain["summary"]["ideal_s"]
    assert "long_running_over_websocket" in speed["targets"]
    with pytest.raises(SystemExit, match="run both"):
        run_agent(_agent_args(tmp_path, *flags, "--modes", "long_running"))
