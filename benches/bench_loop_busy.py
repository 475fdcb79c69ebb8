"""How long one callback holds the server's event loop while a tenant attacks: one
`hotloop serve --engine sim --api-keys sk-a,sk-b` process on loopback (the abuse suite's,
`hotloop.lab.abuse`), ATTACK run REPEATS times for SECONDS each while the victim runs
turns, then the server's `hotloop_event_loop_busy_seconds` histogram: the loop thread's
CPU per 50 ms window. A window above 0.05 s is one callback that held the loop (and every
other connection) that long; the abuse suite fails on windows above 0.1 s.

    .venv/bin/python benches/bench_loop_busy.py [ATTACK [REPEATS [SECONDS]]]

(default: tool_list, 8 times 4 s: 160 tool lists of 13.5 MB; figures:
docs/hardening.md).
"""

from __future__ import annotations

import os
import sys

import httpx
from hotloop.lab.abuse import SERVER_ENV, SERVER_FLAGS, run_scenario
from hotloop.lab.proc import ServerProcess

METRIC = "hotloop_event_loop_busy_seconds"


def main() -> None:
    attack = sys.argv[1] if len(sys.argv) > 1 else "tool_list"
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 4.0
    os.environ.update(SERVER_ENV)
    with ServerProcess.start(SERVER_FLAGS) as server:
        base = f"http://127.0.0.1:{server.port}"
        for n in range(repeats):
            ran, victim = run_scenario(base, server.process.pid, attack, seconds)
            print(f"{attack} #{n}: {ran.report.get('sent', '-')} sent, stalls {ran.stalls}")
            assert not victim.failures, victim.failures
        metrics = httpx.get(base + "/metrics", timeout=60).text.splitlines()
    buckets = {}
    for line in metrics:
        if line.startswith(METRIC + "_bucket"):
            bound = line.split('le="')[1].split('"')[0]
            buckets[bound] = int(line.split()[-1])
        elif line.startswith(METRIC + "_sum"):
            cpu = float(line.split()[-1])
    total = buckets["+Inf"]
    print(f"{total} windows, event-loop CPU {cpu:.2f} s")
    print(f"  over 0.05 s: {total - buckets['0.05']}")
    print(f"  over 0.1 s:  {total - buckets['0.1']}")


if __name__ == "__main__":
    main()
