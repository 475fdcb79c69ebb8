"""The capacity benchmark's workload and thin clients: sessions are the same for a seed
and have the shapes docs/benchmarks.md states, and one agent's turns over each client
(a WebSocket with `previous_response_id`, HTTP with the whole history) are answered and
timed by a real server; the CPU quota that makes a gateway the limit holds."""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time

import pytest
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimScript, SimTurn
from hotloop.lab.capacity import CONTEXTS, OUTPUT, CapacityRun, Target, Workload
from hotloop.lab.proc import CpuQuota
from hotloop.transport import App
from missing import cannot_set_up
from servers import serving, sim_engine


@pytest.fixture(scope="module")
def workload() -> Workload:
    return Workload(seed=3, turns=120)


def test_a_seed_gives_the_same_sessions(workload: Workload) -> None:
    again = Workload(seed=3, turns=120)
    assert again.script == workload.script
    for agent in range(4):
        first, second = workload.session(agent), again.session(agent)
        assert (first.start, first.history()) == (second.start, second.history())
        assert first.output(first.start) == second.output(second.start)


def test_sessions_have_the_stated_shapes(workload: Workload) -> None:
    shape = CONTEXTS["agentx"]
    sessions = [workload.session(agent) for agent in range(40)]
    contexts = [s.context(s.start) for s in sessions]
    # Resumed near the drawn context: between the cut's ends (plus one turn's overshoot).
    assert min(contexts) >= shape.low
    assert statistics.median(contexts) > 50_000
    outputs = sorted(turn.tokens for turn in workload.script)
    assert outputs[len(outputs) // 2] < 2 * OUTPUT.median < outputs[-1]


@pytest.mark.parametrize("mode", ["websocket", "http_full"])
def test_agents_turns_are_answered_and_timed(workload: Workload, mode: str) -> None:
    turns = tuple(
        SimTurn(reasoning=t.reasoning, calls=(("exec_command", t.arguments),))
        for t in workload.script
    )
    sessions = [workload.session(agent) for agent in range(2)]
    app = App.from_config(ServerConfig(engine="sim"), sim_engine(SimScript(turns=turns)))
    with serving(app) as url:
        target = Target(
            "hotloop",
            mode,
            url + "/v1",
            url.replace("http", "ws", 1) + "/v1/responses",
            None,
            "sim",
        )
        kept: list[dict[str, object]] = []
        run = CapacityRun(target, sessions, window=1.0, think_scale=0.01, on_turn=kept.append)
        point = asyncio.run(run.run())
    assert point.errors == 0, point.error_sample
    assert point.turns > 0
    assert all(turn["first_delta_at"] and turn["response_id"] for turn in kept)
    assert 0 < point.ttft_p50_ms <= point.ttft_max_ms


def test_a_cpu_quota_holds_a_busy_process_and_lets_it_go() -> None:
    """The capacity benchmark's `--gateway-quota`: a process that never sleeps, capped at
    a tenth of a core, is held by its quota (the kernel counts the time), and `close`
    puts it back where it was and removes the group. Needs root and a cgroup cpu
    controller: a skip on a developer's machine without them, a failure in CI."""
    if os.geteuid() != 0:
        cannot_set_up("a cgroup", "not root")
    try:
        CpuQuota(0.1).controller()
    except (OSError, RuntimeError) as e:
        cannot_set_up("a cgroup", str(e))
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    quota = CpuQuota(0.1)
    try:
        quota.limit([busy.pid])
        (group,) = quota.groups
        assert (group / "cgroup.procs").read_text().split() == [str(busy.pid)]
        deadline = time.monotonic() + 10
        while quota.throttled_ns() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert quota.throttled_ns() > 0
        quota.close()
        assert not group.exists()
        assert busy.poll() is None
    finally:
        quota.close()
        busy.kill()
        busy.wait()
