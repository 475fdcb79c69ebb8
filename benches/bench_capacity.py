"""Many agents, one gateway: capacity at a time-to-first-token target, side by side in one
run (docs/benchmarks-capacity.md, "Capacity"):

    .venv/bin/python benches/bench_capacity.py --quick      # a few minutes
    .venv/bin/python benches/bench_capacity.py              # the full sweep
        [--agents 4,16,64,128] [--systems hotloop,agentic-api] [--modes websocket,http_full]
        [--window 30] [--think-scale 0.05] [--contexts agentx|agentperf] [--seed 0]
        [--target-ms 10] [--saturation 0.7] [--shared-cpus] [--phases-log DIR]
        [--baseline NAME=DIR] [--variant NAME=FLAGS] [--gateway-quota CORES]
        [--only SYSTEM=N,N] [--out FILE]

N agents replay coding sessions of the field's shape (`hotloop.lab.capacity`: contexts,
tool outputs, outputs and think times, seeded) against one fake vLLM
(`hotloop.lab.fake_vllm`, free, 1,000 tokens/s per agent), in front of which each
gateway runs in turn, one fresh process per point: hotloop over WebSocket
(`previous_response_id`, the new tool output only) and over HTTP with the whole history
every turn, agentic-api the same two ways (as docs/peers.md runs it), and `direct`: the
same clients posting the whole history to the fake's `/v1/responses` at the same
concurrency, the floor every gateway's added time to first token is measured from (p50
over p50, p99 over p99, max over max). A window holds at least `MIN_TURNS` turns: a
number of agents whose direct run held fewer is measured over a window that long. Every
system runs at every number of agents given (`--agents`); past the last, the number
doubles while some system still meets the target (added p99 at most `--target-ms`, no
error, nothing saturated, at least `KEPT_UP` of the direct path's turns/s at that N: a
gateway that falls behind times only the turns it lets through), up to 512, and only the
systems that met it at the number before run.

Per system, mode and number of agents: turns/s, time to first delta p50/p99/max and what
the gateway added, the gateway's CPU (its process tree, per turn and in cores), its
resident memory per agent (loaded, the mean of readings every half second over the
window, minus idle, idle read after one unmeasured agent sent its history and left, so
the start-up allocations of a gateway's first request are not counted per agent),
errors, and for hotloop where the turn waited (`hotloop_turn_phase_seconds`, p50 and p99
from the histogram's buckets) and the event loop's lag. Each gateway runs on a CPU of
its own, the client and the fake on the others (`cpu_split`; `--shared-cpus`: all on
all). The client (one process, one event loop, `hotloop.lab.thin_client`) and the fake
must not be what is measured: a point where either used more than `--saturation` of a
core (or both together more than that share of their CPUs), or where the client's own
loop lagged more than the target, is marked saturated, printed as such and left out of
the headline. The headline, per system and mode: turns per second per gateway core at
the largest number of agents that meets the target, and agents per core at the sessions'
own think times (turns/s per core times the mean think time, unscaled, plus the mean
turn).

`--baseline NAME=DIR` adds the hotloop whose package is in DIR as `hotloop@NAME`;
`--variant NAME=FLAGS` the same hotloop with more serve flags as `hotloop+NAME`.
`--gateway-quota CORES` caps each process of a gateway at that much CPU (a cgroup each,
`hotloop.lab.proc.CpuQuota`; root only), set after its warm-up: on a machine whose other
cores the client and the fake need, the gateway then reaches its limit first, and
`--variant 'w2=--workers 2'` measures what a second worker (a second capped process)
adds. Each point reports each process's share of the gateway's CPU (how evenly the
workers took the agents) and the time the quota held them.
`--phases-log DIR` runs hotloop at `--log-level debug` and keeps its logs (one line per
turn with its phases, `hotloop.phases`) and the clients' turns in DIR, for the profile.
Results: benches/results/capacity.json and capacity.png (or `--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop
from bench_peers import (
    API_KEY,
    MODEL,
    Process,
    add_hotloops,
    gateway_command,
    kind_of,
    peer_venv,
    started,
    tree_cpu_ns,
    tree_pids,
    upstream_command,
)
from hotloop.lab.capacity import CONTEXTS, THINK, CapacityRun, Point, Session, Target, Workload
from hotloop.lab.proc import CpuQuota, free_port, process_cpu_ns, rss_bytes

RATE = 1000.0
QUICK = {"agents": "16,64", "window": 15.0}
FULL = {"agents": "4,16,64,128", "window": 30.0}
MAX_AGENTS = 512
MIN_TURNS = 400
"""Turns a point's window must hold: a p99 of 110 turns (4 agents in 30 s) is the second
slowest turn, and read +0.8 to +3.9 ms added for the same hotloop from run to run. A
number of agents whose direct run holds fewer is measured again, every system with it,
over a window that long, at most `MAX_WINDOW_SCALE` times `--window` (a direct run that
served almost nothing, a broken fake, must not stretch the next window to hours)."""
MAX_WINDOW_SCALE = 8.0
PHASE_METRIC = "hotloop_turn_phase_seconds"
LAG_METRIC = "hotloop_event_loop_lag_seconds"
GC_METRIC = "hotloop_gc_pause_seconds"
TRIM_METRIC = "hotloop_heap_trim_seconds"
RSS_SAMPLE_SECONDS = 0.5
"""How often the gateway's resident memory is read over a window (the mean is reported)."""
WARM_UP_SETTLE_SECONDS = 0.5
"""After the warm-up agent leaves, before the idle RSS is read: its connection closes."""
SETTLE_SECONDS = 1.0
"""How long a gateway's process tree must stay the same before its quota is set."""
SETTLE_DEADLINE_SECONDS = 60.0
WARM_UP_WINDOW_SECONDS = 0.1
"""The warm-up agent's window (its figures are not kept): a turn or two after its first."""


def tree_rss(root: int) -> int:
    return sum(rss_bytes(pid) for pid in tree_pids(root))


def scrape(base: str) -> dict[str, float]:
    """hotloop's histogram buckets of the phases and the lag, and its garbage
    collections and heap trims (buckets, count and sum; a hotloop without them has
    none), by sample name."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as reply:
        text = reply.read().decode()
    return {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in text.splitlines())
        if name.startswith(
            (PHASE_METRIC + "_bucket", LAG_METRIC + "_bucket", GC_METRIC, TRIM_METRIC)
        )
    }


def quantiles(before: dict[str, float], after: dict[str, float], prefix: str) -> dict[str, float]:
    """p50 and p99 (ms, the upper bound of the bucket holding them) of the histogram
    samples starting with `prefix` observed between the two scrapes."""
    buckets = sorted(
        (float(name.split('le="')[1].split('"')[0]), after[name] - before.get(name, 0.0))
        for name in after
        if name.startswith(prefix)
    )
    total = buckets[-1][1] if buckets else 0.0
    found: dict[str, float] = {"count": total}
    for q in (50, 99):
        bound = next((b for b, count in buckets if count >= total * q / 100), float("inf"))
        found[f"p{q}_ms"] = bound * 1e3 if total else float("nan")
    return found


def phases(before: dict[str, float], after: dict[str, float], mode: str) -> dict[str, Any]:
    transport = "websocket" if mode == "websocket" else "http"
    names = ("queued", "prepare", "upstream_write", "upstream", "handover", "delta_out")
    found: dict[str, Any] = {
        name: quantiles(
            before,
            after,
            f'{PHASE_METRIC}_bucket{{transport="{transport}",phase="{name}",',
        )
        for name in names
    }
    found["event_loop_lag"] = quantiles(before, after, f"{LAG_METRIC}_bucket{{")
    for generation in range(3):
        label = f'{{generation="{generation}"}}'
        pauses = quantiles(before, after, f'{GC_METRIC}_bucket{{generation="{generation}",')
        total = f"{GC_METRIC}_sum{label}"
        pauses["sum_ms"] = 1e3 * (after.get(total, 0.0) - before.get(total, 0.0))
        found[f"gc_{generation}"] = pauses
    trims = quantiles(before, after, f"{TRIM_METRIC}_bucket{{")
    total = f"{TRIM_METRIC}_sum"
    trims["sum_ms"] = 1e3 * (after.get(total, 0.0) - before.get(total, 0.0))
    found["heap_trim"] = trims
    return found


class Readings:
    """The processes' figures at the window's open and close, read off the client's loop
    (in a thread) so that reading them does not delay the agents' events."""

    def __init__(
        self, gateway: Process | None, upstream: Process, quota: CpuQuota | None = None
    ) -> None:
        self.gateway = gateway
        self.upstream = upstream
        self.quota = quota
        self.idle_rss = tree_rss(gateway.process.pid) if gateway else 0
        self.at: dict[bool, dict[str, Any]] = {}
        self.rss: list[int] = []
        self.closing = threading.Event()
        self.sampler: threading.Thread | None = None

    def __call__(self, opening: bool) -> None:
        reading: dict[str, Any] = {"at": time.perf_counter(), "upstream": self.upstream.cpu_ns()}
        if self.gateway is not None:
            reading["gateway"] = tree_cpu_ns(self.gateway.process.pid)
            reading["processes"] = processes_cpu_ns(tree_pids(self.gateway.process.pid))
            if self.quota is not None:
                reading["throttled"] = self.quota.throttled_ns()
            if kind_of(self.gateway.name) == "hotloop":
                reading["metrics"] = scrape(f"http://127.0.0.1:{self.gateway.port}")
            if opening:
                # A daemon: a run that fails inside its window never closes it.
                self.sampler = threading.Thread(
                    target=self.sample, args=(self.gateway,), daemon=True
                )
                self.sampler.start()
            elif self.sampler is not None:
                self.closing.set()
                self.sampler.join()
        self.at[opening] = reading

    def sample(self, gateway: Process) -> None:
        """The gateway's RSS every `RSS_SAMPLE_SECONDS` of the window: one reading at its
        close would land anywhere in the cycle of hotloop's heap trim (every 10 s it
        frees the pooled request bodies and what glibc holds free), and read a different
        figure for the same memory."""
        while True:
            self.rss.append(tree_rss(gateway.process.pid))
            if self.closing.wait(RSS_SAMPLE_SECONDS):
                return

    def figures(self, point: Point, mode: str) -> dict[str, Any]:
        opened, closed = self.at[True], self.at[False]
        seconds = closed["at"] - opened["at"]
        found: dict[str, Any] = {
            "upstream_cpu_cores": (closed["upstream"] - opened["upstream"]) / 1e9 / seconds
        }
        if self.gateway is not None:
            cpu = (closed["gateway"] - opened["gateway"]) / 1e9
            found.update(
                gateway_cpu_cores=cpu / seconds,
                gateway_cpu_ms_per_turn=1e3 * cpu / point.turns if point.turns else None,
                rss_idle_mb=self.idle_rss / 1e6,
                rss_loaded_mb=statistics.mean(self.rss) / 1e6,
                rss_loaded_max_mb=max(self.rss) / 1e6,
                rss_samples=len(self.rss),
                rss_per_agent_mb=(statistics.mean(self.rss) - self.idle_rss) / 1e6 / point.agents,
            )
            # Each process's share of the gateway's CPU, largest first (those over 1%):
            # with `--workers`, how evenly the agents spread over the workers.
            spent = [
                ns - opened["processes"].get(pid, 0) for pid, ns in closed["processes"].items()
            ]
            shares = [ns / 1e9 / cpu for ns in spent] if cpu else []
            found["gateway_cpu_shares"] = sorted((s for s in shares if s > 0.01), reverse=True)
            if "throttled" in closed:
                found["throttled_ms"] = (closed["throttled"] - opened["throttled"]) / 1e6
            if "metrics" in closed:
                found["phases"] = phases(opened["metrics"], closed["metrics"], mode)
        return found


def measure(
    args: argparse.Namespace,
    workload: Workload,
    system: str,
    mode: str,
    agents: int,
    upstream: Process,
    venv: Path | None,
    window: float,
) -> dict[str, Any]:
    """One point: a fresh gateway (none for `direct`), `agents` agents, one window of
    `window` seconds."""
    sessions = [workload.session(i) for i in range(agents)]
    upstream_url = f"http://127.0.0.1:{upstream.port}"
    with tempfile.TemporaryDirectory(prefix="hotloop-capacity-") as scratch:
        if system == "direct":
            gateway = None
            target = Target(system, mode, upstream.base_url, upstream.ws_url, None, MODEL)
            point = run_point(args, target, sessions, Readings(None, upstream), window)
        else:
            port = free_port()
            kind = kind_of(system)
            command = gateway_command(kind, port, upstream_url, venv)
            env = None
            if kind == "hotloop":
                command += ["--max-connections-per-key", "0"]
                if args.phases_log:
                    command += ["--log-level", "debug", "--log-format", "json"]
                if system in args.baselines:
                    env = {"PYTHONPATH": args.baselines[system]}
                command += args.variants.get(system, [])
            with started(system, command, port, env, args.gateway_cpus) as gateway:
                target = Target(system, mode, gateway.base_url, gateway.ws_url, API_KEY, MODEL)
                warm_up(target, workload.session(MAX_AGENTS))
                quota = None
                if args.gateway_quota:
                    quota = CpuQuota(args.gateway_quota)
                    quota.limit(settled_tree(gateway.process.pid))
                try:
                    readings = Readings(gateway, upstream, quota)
                    point = run_point(args, target, sessions, readings, window)
                finally:
                    if quota is not None:
                        quota.close()
                if args.phases_log and system == "hotloop":
                    keep = Path(args.phases_log) / f"{system}-{mode}-{agents}.log"
                    keep.write_bytes(gateway.log.read_bytes())
        del scratch
    return point


def settled_tree(root: int) -> list[int]:
    """`root`'s process tree once two readings `SETTLE_SECONDS` apart agree (with
    `--workers`, uvicorn's supervisor starts the workers one after the other and says
    nothing when the last is up; a worker is up before it serves, so the warm-up's answer
    alone does not tell), within `SETTLE_DEADLINE_SECONDS`."""
    deadline = time.monotonic() + SETTLE_DEADLINE_SECONDS
    pids = sorted(tree_pids(root))
    while time.monotonic() < deadline:
        time.sleep(SETTLE_SECONDS)
        again = sorted(tree_pids(root))
        if again == pids:
            return pids
        pids = again
    raise RuntimeError(f"the gateway's processes kept changing for {SETTLE_DEADLINE_SECONDS} s")


def processes_cpu_ns(pids: list[int]) -> dict[int, int]:
    """Each live process's CPU time (one that exited since it was listed is left out)."""
    found = {}
    for pid in pids:
        try:
            found[pid] = process_cpu_ns(pid)
        except OSError:
            continue
    return found


def warm_up(target: Target, session: Session) -> None:
    """One agent that is not measured sends its history and leaves: what the gateway
    allocates once, at its first request (imports, tokenizer and body tables, thread
    pools, several MB), is then in the idle RSS, not counted against the agents."""
    uvloop.run(CapacityRun(target, [session], window=WARM_UP_WINDOW_SECONDS, think_scale=0.0).run())
    time.sleep(WARM_UP_SETTLE_SECONDS)


def run_point(
    args: argparse.Namespace,
    target: Target,
    sessions: list[Any],
    readings: Readings,
    window: float,
) -> dict[str, Any]:
    turns: list[dict[str, Any]] = []
    keep: Callable[[dict[str, Any]], None] | None = turns.append if args.phases_log else None
    run = CapacityRun(
        target,
        sessions,
        window=window,
        think_scale=args.think_scale,
        on_window=readings,
        on_turn=keep,
    )
    point = uvloop.run(run.run())
    point.server = readings.figures(point, target.mode)
    result = point.to_json()
    if args.phases_log:
        name = f"{target.system}-{target.mode}-{len(sessions)}.turns.json"
        (Path(args.phases_log) / name).write_text(json.dumps(turns))
    return result


def saturated(point: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Why this point measured the client or the fake rather than the gateway."""
    why = []
    client, fake = point["client_cpu_cores"], point["server"]["upstream_cpu_cores"]
    if client > args.saturation:
        why.append(f"client at {client:.2f} core")
    if fake > args.saturation:
        why.append(f"fake upstream at {fake:.2f} core")
    shared = len(args.client_cpus)
    if args.gateway_cpus is not None and client + fake > args.saturation * shared:
        why.append(f"client and fake at {client + fake:.2f} of their {shared} core(s)")
    if point["client_lag_p99_ms"] > args.target_ms:
        why.append(f"client event loop lag p99 {point['client_lag_p99_ms']:.1f} ms")
    return why


KEPT_UP = 0.95
"""The share of the direct path's turns/s at the same N a gateway must serve to hold its
agents: one that falls behind times only the turns it lets through."""


def added(points: list[dict[str, Any]]) -> None:
    """Each gateway point's added time to first token over `direct` at the same N, and
    whether it kept the direct path's turn rate."""
    floors = {p["agents"]: p for p in points if p["system"] == "direct"}
    for point in points:
        floor = floors.get(point["agents"])
        if floor is None or point["system"] == "direct":
            continue
        for q in ("p50", "p99", "max"):
            point[f"added_ttft_{q}_ms"] = point[f"ttft_{q}_ms"] - floor[f"ttft_{q}_ms"]
        point["floor_saturated"] = floor["saturated"]
        point["kept_up"] = point["turns_per_s"] >= KEPT_UP * floor["turns_per_s"]


def meets(point: dict[str, Any], args: argparse.Namespace) -> bool:
    """A gateway point that met the target at the direct path's turn rate, measured by a
    client and a fake that kept up."""
    return (
        point["system"] != "direct"
        and point["errors"] == 0
        and not point["saturated"]
        and not point.get("floor_saturated")
        and point.get("kept_up", False)
        and point.get("added_ttft_p99_ms", float("inf")) <= args.target_ms
    )


def headline(points: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Per system and mode: turns/s per gateway core at the largest N meeting the
    target, and agents per core at the sessions' own think times; and the smallest larger
    N it missed, with the direct path's turns/s there (the rate the gateway could not
    carry at the target: a bound on its capacity from above, where the largest N met
    bounds it from below)."""
    think = THINK.mean()
    floors = {p["agents"]: p["turns_per_s"] for p in points if p["system"] == "direct"}
    found: dict[str, Any] = {}
    for key in sorted({(p["system"], p["mode"]) for p in points if p["system"] != "direct"}):
        meeting = [p for p in points if (p["system"], p["mode"]) == key and meets(p, args)]
        if not meeting:
            found[" ".join(key)] = None
            continue
        best = max(meeting, key=lambda p: p["agents"])
        per_core = best["turns_per_s"] / best["server"]["gateway_cpu_cores"]
        missed = sorted(
            p["agents"]
            for p in points
            if (p["system"], p["mode"]) == key and p["agents"] > best["agents"]
        )
        found[" ".join(key)] = {
            "agents": best["agents"],
            "turns_per_s": best["turns_per_s"],
            "gateway_cpu_cores": best["server"]["gateway_cpu_cores"],
            "turns_per_s_per_core": per_core,
            "agents_per_core_at_session_think_times": per_core * (think + best["turn_mean_s"]),
            "added_ttft_p99_ms": best["added_ttft_p99_ms"],
            "missed_at_agents": missed[0] if missed else None,
            "missed_at_direct_turns_per_s": floors.get(missed[0]) if missed else None,
        }
    return found


def print_point(point: dict[str, Any]) -> None:
    server = point["server"]
    cpu = server.get("gateway_cpu_ms_per_turn")
    line = (
        f"{point['system']:>12} {point['mode']:<10} N={point['agents']:<4} "
        f"{point['turns_per_s']:6.1f} turns/s  ttft p50 {point['ttft_p50_ms']:6.1f} "
        f"p99 {point['ttft_p99_ms']:7.1f} max {point['ttft_max_ms']:7.1f} ms"
    )
    if "added_ttft_p99_ms" in point:
        line += f"  added {point['added_ttft_p50_ms']:+.1f} / {point['added_ttft_p99_ms']:+.1f}"
    if cpu is not None:
        line += (
            f"  gw {server['gateway_cpu_cores']:.2f} core {cpu:.2f} ms/turn "
            f"rss/agent {server['rss_per_agent_mb']:.2f} MB"
        )
    line += (
        f"  client {point['client_cpu_cores']:.2f} fake {server['upstream_cpu_cores']:.2f}"
        f"  ctx {point['context_mean_tokens'] / 1e3:.0f}k  errors {point['errors']}"
    )
    if point["saturated"]:
        line += "  SATURATED: " + ", ".join(point["saturated"])
    if not point.get("kept_up", True):
        line += "  FELL BEHIND the direct path's turn rate"
    print(line, file=sys.stderr, flush=True)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    points = results["points"]
    for key in sorted({(p["system"], p["mode"]) for p in points if p["system"] != "direct"}):
        series = sorted(
            (p for p in points if (p["system"], p["mode"]) == key and "added_ttft_p99_ms" in p),
            key=lambda p: p["agents"],
        )
        agents = [p["agents"] for p in series]
        left.plot(agents, [p["added_ttft_p99_ms"] for p in series], marker="o", label=" ".join(key))
        right.plot(
            agents,
            [p["server"]["gateway_cpu_ms_per_turn"] or 0 for p in series],
            marker="o",
            label=" ".join(key),
        )
    left.axhline(results["target_ms"], color="grey", linestyle="--", linewidth=1)
    left.set_yscale("symlog", linthresh=results["target_ms"])
    for axis, title in (
        (left, "added time to first token, p99 (ms)"),
        (right, "gateway CPU per turn (ms)"),
    ):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent agents")
        axis.set_title(title)
        axis.grid(alpha=0.3)
    left.legend(fontsize=8)
    machine = results["machine"]
    where = (
        f"all on {machine['cpus']} CPUs"
        if machine["shared"]
        else f"each gateway on a CPU of its own, of {machine['cpus']}"
    )
    figure.suptitle(
        f"{results['workload']['contexts']} sessions, {RATE:,.0f} tok/s per agent ({where})",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def cpu_split(shared: bool) -> tuple[frozenset[int] | None, frozenset[int]]:
    """The CPUs each gateway runs on, and those the client (this process) and the fake
    share: one CPU of this process's for the gateway, alone, the rest for them. In a
    deployment the upstream and the clients run on other hosts; sharing CPUs here, the
    fake woken by the request the gateway is writing took the gateway's CPU from it in
    the middle of the write: at 16 agents, every upstream write slower than 1.5 ms (a
    sixth of them, 2-4.5 ms) had an involuntary context switch (`getrusage`), and with
    the gateway on a CPU of its own the added TTFT went from +0.9 / +4.2 ms (p50 / p99)
    to +0.1 / +1.4, the floor unchanged (docs/benchmarks-capacity.md). With `shared` (or
    a single CPU): no split, everything on this process's CPUs."""
    allowed = frozenset(os.sched_getaffinity(0))
    if shared or len(allowed) < 2:
        return None, allowed
    gateway = frozenset({max(allowed)})
    rest = allowed - gateway
    os.sched_setaffinity(0, rest)  # the fake, started from here, inherits it
    return gateway, rest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 and 64 agents, 15 s windows")
    parser.add_argument("--agents", default=None, help="numbers of agents, comma-separated")
    parser.add_argument("--systems", default="hotloop,agentic-api")
    parser.add_argument("--modes", default="websocket,http_full")
    parser.add_argument("--window", type=float, default=None, help="seconds measured per point")
    parser.add_argument(
        "--think-scale",
        type=float,
        default=0.05,
        help="the sessions' think times are scaled by this (median 10 s -> 0.5 s)",
    )
    parser.add_argument("--contexts", choices=tuple(CONTEXTS), default="agentx")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-ms", type=float, default=10.0, help="added TTFT p99 target")
    parser.add_argument(
        "--saturation",
        type=float,
        default=0.7,
        help="client or fake CPU (cores) over this: saturated",
    )
    parser.add_argument(
        "--max-agents",
        type=int,
        default=MAX_AGENTS,
        help="do not double past this many agents (the given numbers only: their largest)",
    )
    parser.add_argument(
        "--shared-cpus",
        action="store_true",
        help="let the gateway share its CPUs with the client and the fake (cpu_split)",
    )
    parser.add_argument(
        "--gateway-quota",
        type=float,
        default=0.0,
        metavar="CORES",
        help="cap each of a gateway's processes at this much CPU (a cgroup each; root): "
        "the gateway, not the client or the fake, becomes the limit (workers' scaling)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="also run hotloop with these serve flags, as system hotloop+NAME "
        "(e.g. 'w2=--workers 2')",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="SYSTEM=N,N",
        help="run SYSTEM at these numbers of agents only (the others, and direct, at all): "
        "a fine sweep around where each system misses the target",
    )
    parser.add_argument("--phases-log", default="", help="keep per-turn logs here (profiling)")
    parser.add_argument("--out", default="benches/results/capacity.json")
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also run the hotloop whose package is in DIR (first on PYTHONPATH), as "
        "system hotloop@NAME, for a before/after in one run",
    )
    args = parser.parse_args()
    args.gateway_cpus, args.client_cpus = cpu_split(args.shared_cpus)
    if args.gateway_quota and os.geteuid() != 0:
        parser.error("--gateway-quota needs root (it makes a cgroup for each process)")
    add_hotloops(args)
    args.only = {
        system: {int(n) for n in counts.split(",")}
        for system, _, counts in (spec.partition("=") for spec in args.only)
    }
    preset = QUICK if args.quick else FULL
    args.agents = args.agents or preset["agents"]
    args.window = args.window or preset["window"]
    if args.phases_log:
        Path(args.phases_log).mkdir(parents=True, exist_ok=True)
    # Empty names dropped: `--systems ""` runs only the `--baseline`s, in their order.
    systems = [system for system in args.systems.split(",") if system]
    modes = args.modes.split(",")
    venv = peer_venv() if any(kind_of(s) != "hotloop" for s in systems) else None
    workload = Workload(args.seed, args.contexts)
    results: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "shared": args.gateway_cpus is None,
            "gateway_cpus": None if args.gateway_cpus is None else sorted(args.gateway_cpus),
            "client_and_fake_cpus": sorted(args.client_cpus),
        },
        "load_average_at_start": os.getloadavg(),
        "workload": {
            "seed": args.seed,
            "contexts": args.contexts,
            "think_scale": args.think_scale,
            "think_mean_s_unscaled": THINK.mean(),
            "tokens_per_second_per_agent": RATE,
        },
        "target_ms": args.target_ms,
        "window_s": args.window,
        "gateway_quota_cores": args.gateway_quota or None,
        "variants": {name: shlex.join(flags) for name, flags in args.variants.items()},
        "only": {system: sorted(counts) for system, counts in args.only.items()},
        "points": [],
    }
    counts = [int(n) for n in args.agents.split(",")]
    meeting = {(system, mode) for system in systems for mode in modes}
    with tempfile.TemporaryDirectory(prefix="hotloop-capacity-") as scratch:
        script = Path(scratch) / "script.json"
        script.write_text(json.dumps(workload.script_json()))
        port = free_port()
        with started("upstream", upstream_command(port, script, RATE, False), port) as upstream:
            while counts:
                agents = counts.pop(0)
                extending = agents > int(args.agents.split(",")[-1])
                points: list[dict[str, Any]] = []
                window = args.window
                for mode in modes:
                    for system in ["direct", *systems]:
                        if system == "direct" and mode != modes[0]:
                            continue
                        if extending and system != "direct" and (system, mode) not in meeting:
                            continue
                        if agents not in args.only.get(system, (agents,)):
                            continue
                        # The floor is the whole history over HTTP, whatever the mode.
                        client_mode = "http_full" if system == "direct" else mode
                        point = measure(
                            args, workload, system, client_mode, agents, upstream, venv, window
                        )
                        if system == "direct" and point["turns"] < MIN_TURNS:
                            scale = MIN_TURNS / max(1, point["turns"])
                            window = args.window * min(scale, MAX_WINDOW_SCALE)
                            point = measure(
                                args, workload, system, client_mode, agents, upstream, venv, window
                            )
                        point["saturated"] = saturated(point, args)
                        points.append(point)
                added(points)
                for point in points:
                    print_point(point)
                meeting = {(p["system"], p["mode"]) for p in points if meets(p, args)}
                if not counts and meeting and 2 * agents <= args.max_agents:
                    counts.append(2 * agents)
                results["points"] += points
    results["load_average_at_end"] = os.getloadavg()
    results["headline"] = headline(results["points"], args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    plot(results, out.with_suffix(".png"))
    print(json.dumps({"headline": results["headline"]}))


if __name__ == "__main__":
    main()
