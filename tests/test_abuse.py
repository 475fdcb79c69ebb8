"""The abuse suite: one tenant (`sk-a`) attacks a real `hotloop serve --engine sim
--api-keys sk-a,sk-b` process on loopback while the victim tenant (`sk-b`) runs turns,
one attack at a time, each bounded in time and work (`hotloop.lab.abuse`).

For every attack: all of the victim's turns complete, every response it saw
acknowledged (store=true) is readable afterwards, the server's RSS stays under
`RSS_BOUND`, and the victim's median turn stays under `SLOWDOWN` times its median in the
same server's quiet baseline (nobody attacking, run first): a ratio measured in one run,
generous enough for a loaded shared machine, never an absolute time. The p99 and the
event-loop stalls the server's `hotloop_event_loop_busy_seconds` counted are printed,
not asserted (`benches/bench_abuse.py` prints the same figures for the docs). That a
13.5 MB tool list cannot hold the event loop is proven by events, not by the clock:
tests/test_offload.py records on which thread every large frame is parsed, decoded and
rendered (never the loop's).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hotloop.lab.abuse import (
    ATTACKS,
    SERVER_ENV,
    SERVER_FLAGS,
    STALL,
    Scenario,
    Victim,
    run_scenario,
)
from hotloop.lab.proc import ServerProcess

pytestmark = pytest.mark.abuse

SECONDS = 4.0
MIB = 1024 * 1024
# Measured peak on the 2-core dev machine: see docs/hardening.md.
RSS_BOUND = 1024 * MIB
SLOWDOWN = 10.0
"""The victim's median under an attack, as a multiple of its quiet median, from which
on it noticed: an order of magnitude. On the shared 2-core machine at load average
11-13 the attacks measured up to 7.2x (full_queues; 1.0-4.4x in other runs), tool_list
2.3-4.2x; on the idle machine 1.1x and 2.8x (docs/hardening.md)."""


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with pytest.MonkeyPatch.context() as env:
        for name, value in SERVER_ENV.items():
            env.setenv(name, value)
        with ServerProcess.start(SERVER_FLAGS) as running:
            yield running


@pytest.fixture(scope="module")
def scenarios(server: ServerProcess) -> dict[str | None, tuple[Scenario, Victim]]:
    """Each scenario runs once, on first use; the tests read its results."""
    return {}


@pytest.fixture(scope="module")
def quiet(server: ServerProcess, scenarios: dict[str | None, tuple[Scenario, Victim]]) -> Scenario:
    """The victim alone on the server, before any attack: what its turns take here."""
    ran, _ = scenario(None, server, scenarios)
    assert ran.failures == []
    return ran


def scenario(
    name: str | None, server: ServerProcess, scenarios: dict[str | None, tuple[Scenario, Victim]]
) -> tuple[Scenario, Victim]:
    """`name`'s run (None: the quiet baseline), the first time it is asked for."""
    if name not in scenarios:
        base = f"http://127.0.0.1:{server.port}"
        scenarios[name] = run_scenario(base, server.process.pid, name, SECONDS)
        ran, _ = scenarios[name]
        print(
            f"\n{name or 'quiet'}: victim {len(ran.latencies)} turns, p50 {ran.p50 * 1e3:.1f} ms, "
            f"p99 {ran.p99 * 1e3:.1f} ms; server peak RSS {ran.peak_rss / MIB:.0f} MiB; "
            f"event-loop stalls over {STALL} s of CPU: {ran.stalls}; "
            f"attacker {ran.report}"
        )
    return scenarios[name]


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_the_victim_does_not_notice(
    attack: str,
    server: ServerProcess,
    scenarios: dict[str | None, tuple[Scenario, Victim]],
    quiet: Scenario,
) -> None:
    ran, victim = scenario(attack, server, scenarios)
    assert ran.failures == []
    assert len(ran.latencies) >= 3
    assert victim.lost() == []
    assert ran.peak_rss < RSS_BOUND
    assert server.process.poll() is None
    slowdown = ran.p50 / quiet.p50
    assert slowdown < SLOWDOWN, (
        f"the victim's median went from {quiet.p50 * 1e3:.1f} ms alone to "
        f"{ran.p50 * 1e3:.1f} ms under {attack} ({slowdown:.1f}x)"
    )


def test_the_attacks_were_answered(
    server: ServerProcess, scenarios: dict[str | None, tuple[Scenario, Victim]]
) -> None:
    """Each attack did what it says, and the server refused what it had to."""
    reports = {name: scenario(name, server, scenarios)[0].report for name in ATTACKS}
    assert reports["slowloris"]["answered"].get("408", 0) > 0
    refused = reports["full_queues"]["refused"]
    assert (
        refused.get("queue_memory_exceeded", 0) + refused.get("websocket_queue_limit_reached", 0)
        == 8
    )
    assert reports["malformed"]["errors"] > 0 and reports["malformed"]["closed_1007"] > 0
    assert reports["churn"]["rounds"] > 0
    assert reports["disconnect_mid_stream"]["dropped"] > 0
    assert reports["tool_list"]["sent"] > 0


def test_the_server_runs_at_its_hard_open_files_limit(server: ServerProcess) -> None:
    with open(f"/proc/{server.process.pid}/limits") as limits:
        line = next(line for line in limits if line.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    assert soft == hard
