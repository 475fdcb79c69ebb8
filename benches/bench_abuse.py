"""The victim tenant's turn latency while another tenant attacks (the abuse suite's
scenarios, `hotloop.lab.abuse`): one `hotloop serve --engine sim --api-keys sk-a,sk-b`
process on loopback, a quiet baseline first, then each attack for SECONDS while `sk-b`
runs turns back to back; prints one row per scenario (victim turns, p50, p99, the
server's peak RSS, what the attacker did) and a JSON line.

    .venv/bin/python benches/bench_abuse.py [SECONDS [ATTACK ...]]
"""

from __future__ import annotations

import json
import os
import sys

from hotloop.lab.abuse import ATTACKS, MIB, SERVER_ENV, SERVER_FLAGS, run_scenario
from hotloop.lab.proc import ServerProcess


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 6.0
    os.environ.update(SERVER_ENV)
    rows = []
    with ServerProcess.start(SERVER_FLAGS) as server:
        base = f"http://127.0.0.1:{server.port}"
        for attack in [None, *(sys.argv[2:] or sorted(ATTACKS))]:
            ran, victim = run_scenario(base, server.process.pid, attack, seconds)
            row = {
                "attack": ran.attack,
                "turns": len(ran.latencies),
                "seconds": round(ran.seconds, 1),
                "p50_ms": round(ran.p50 * 1e3, 1),
                "p99_ms": round(ran.p99 * 1e3, 1),
                "peak_rss_mib": round(ran.peak_rss / MIB),
                "loop_stalls": ran.stalls,
                "failures": len(ran.failures),
                "lost": len(victim.lost()),
                "attacker": {k: v for k, v in ran.report.items() if k != "latencies"},
            }
            if "latencies" in ran.report:
                ordered = sorted(ran.report["latencies"])
                row["attacker_median_ms"] = round(ordered[len(ordered) // 2] * 1e3, 1)
            rows.append(row)
            print(
                f"{row['attack']:>22}: {row['turns']:4d} turns in {row['seconds']:4.1f} s, "
                f"p50 {row['p50_ms']:7.1f} ms, "
                f"p99 {row['p99_ms']:7.1f} ms, peak RSS {row['peak_rss_mib']:4d} MiB, "
                f"loop stalls {'n/a' if ran.stalls is None else ran.stalls}, "
                f"failures {row['failures']}, "
                f"lost {row['lost']}",
                flush=True,
            )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
