"""CI's quick side-by-side check (`make bench-ci`): hotloop and agentic-api over WebSocket
in front of one free fake vLLM at 4,000 tokens/s, a short agent conversation, two
interleaved rounds (benches/bench_peers.py's `--quick`). Only ratios measured in the same
run are asserted, each bound about twice the highest value measured
(docs/benchmarks-core.md, "CI microbenchmarks"):

- hotloop's whole-process CPU per turn is at most 1.6x agentic-api's (measured 0.51-0.86x);
- hotloop's loop time over ideal is at most 1.25x agentic-api's (measured 1.01-1.08x).
"""

from __future__ import annotations

import argparse
import json

from bench_peers import agent_rollout, peer_venv, run_configuration, write_script


def test_hotloop_beside_agentic_api(tmp_path: object) -> None:
    args = argparse.Namespace(
        systems="hotloop,agentic-api",
        modes="websocket",
        rounds=2,
        baselines={},
        variants={},
    )
    rollout = agent_rollout(seed=0, tool_calls=12, history_tokens=15_000)
    script = write_script(rollout, str(tmp_path))
    result = run_configuration(args, rollout, script, 4000.0, False, peer_venv())
    hotloop = result["systems"]["hotloop websocket"]
    agentic = result["systems"]["agentic-api websocket"]
    cpu = hotloop["gateway_cpu_ms_per_turn"] / agentic["gateway_cpu_ms_per_turn"]
    loop = hotloop["loop_over_ideal"] / agentic["loop_over_ideal"]
    # One JSON line, on a line of its own (pytest -q prints a progress dot before it):
    # `make figures` keeps it in benches/results/ratios.json.
    print("\n" + json.dumps({"cpu_per_turn_ratio": cpu, "loop_over_ideal_ratio": loop, **result}))
    assert cpu <= 1.6, f"hotloop's CPU per turn is {cpu:.2f}x agentic-api's"
    assert loop <= 1.25, f"hotloop's loop time over ideal is {loop:.2f}x agentic-api's"
