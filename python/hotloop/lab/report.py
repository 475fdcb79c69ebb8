"""Turning measured runs into the figures docs/benchmarks-*.md quote: the ideal time of a run,
summaries (medians and ratios), the results JSON and the PNG plots.

The ideal of a run is what the simulated engine alone would take for the same
conversation: for each turn its time to first token, the prefill of the tokens that are
new to the engine (the turn's input minus the previous prompt and output), and the decode
of the output; plus the tool time between turns. A server that costs nothing reaches it.

This module owns the arithmetic and the drawing; it runs nothing.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotloop.lab.agent import AgentRun, TurnRecord


@dataclass(frozen=True)
class SimParameters:
    """The simulated engine's speed, as the server was started with it."""

    tokens_per_second: float
    ttft: float
    prefill_tokens_per_second: float

    def turn_time(self, new_tokens: int, output_tokens: int) -> float:
        decode = max(output_tokens - 1, 0) / self.tokens_per_second
        return self.ttft + new_tokens / self.prefill_tokens_per_second + decode


def new_tokens(turns: list[TurnRecord]) -> list[int]:
    """Prompt tokens of each turn that extend neither the previous prompt nor its output:
    what any engine must prefill, however good the server's cache."""
    found, seen = [], 0
    for turn in turns:
        found.append(max(turn.input_tokens - seen, 0))
        seen = turn.input_tokens + turn.output_tokens
    return found


def added_ttft_ms(
    turns: list[TurnRecord], sim: SimParameters, usage: list[TurnRecord] | None = None
) -> list[float]:
    """What the server added before each turn's first token, in ms: the measured time to
    first token (over the real socket or HTTP) minus the engine's own (its time to first
    token plus the prefill of the turn's new tokens, from `usage`'s turns: see
    `summarise`)."""
    return [
        1e3 * (t.ttft - sim.ttft - new / sim.prefill_tokens_per_second)
        for t, new in zip(turns, new_tokens(usage or turns), strict=True)
    ]


def ideal_time(run: AgentRun, sim: SimParameters, usage: list[TurnRecord] | None = None) -> float:
    turns = usage or run.turns
    inference = sum(
        sim.turn_time(new, turn.output_tokens)
        for new, turn in zip(new_tokens(turns), turns, strict=True)
    )
    return inference + run.tool_time * (len(turns) - 1)


def usage_of(runs: dict[str, Any], mode: str) -> list[TurnRecord] | None:
    """The turns whose usage stands for `mode`'s in one speed's recorded runs: a
    long-running response reports its usage once, at its end, so its turns carry none
    and the chain's (`websocket`, the same conversation turn for turn) serve."""
    if mode != "long_running" or "websocket" not in runs:
        return None
    return [TurnRecord(**t) for t in runs["websocket"]["turns"]]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: p99 of 50 values is the maximum)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def summarise(
    run: AgentRun, sim: SimParameters, usage: list[TurnRecord] | None = None
) -> dict[str, Any]:
    """`usage`: the turns whose usage stands for `run`'s when its own carry none (see
    `usage_of`): the ideal time and each turn's prefill come from them. Without it a
    long-running response's added time to first token kept the whole prefill of each
    turn (125 ms of it at the median in the run of f935583)."""
    ideal = ideal_time(run, sim, usage)
    ttfts = [t.ttft for t in run.turns]
    cpu_ms = [t.server_cpu_ns / 1e6 for t in run.turns]
    return {
        "mode": run.mode,
        "turns": len(run.turns),
        "wall_s": run.wall,
        "ideal_s": ideal,
        "ratio_to_ideal": run.wall / ideal if ideal else 0.0,
        "overhead_s": run.wall - ideal,
        "ttft_p50_ms": 1e3 * statistics.median(ttfts),
        "ttft_p99_ms": 1e3 * percentile(ttfts, 99),
        "added_ttft_p50_ms": statistics.median(added_ttft_ms(run.turns, sim, usage)),
        "server_cpu_per_turn_ms_median": statistics.median(cpu_ms),
        "server_cpu_per_turn_ms_mean": statistics.fmean(cpu_ms),
        "server_cpu_s": run.server_cpu_ns / 1e9,
        "client_cpu_s": run.client_cpu_ns / 1e9,
        "final_context_tokens": run.turns[-1].input_tokens,
        "request_mb": sum(t.request_bytes for t in run.turns) / 1e6,
        "replayed_calls": sum(t.replayed for t in run.turns),
        # Prompt tokens that did not come from the rendered-token cache, per round trip:
        # what a prefix-caching engine evaluates.
        "new_prompt_tokens_per_turn": sum(t.input_tokens - t.cached_tokens for t in run.turns)
        / len(run.turns),
    }


def plot_agent_runs(results: dict[str, Any], out: Path, name: str = "agent") -> list[Path]:
    """Two figures from an agent-loop results document (see `hotloop bench agent`):
    `<name>_ratio_to_ideal.png` and `<name>_per_turn.png`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    speeds = sorted(results["speeds"], key=lambda s: s["tokens_per_second"])
    labels = [f"{s['tokens_per_second']:g} tok/s" for s in speeds]
    modes = list(speeds[0]["runs"])

    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / (len(modes) + 1)
    for i, mode in enumerate(modes):
        ratios = [s["runs"][mode]["summary"]["ratio_to_ideal"] for s in speeds]
        ax.bar([x + i * width for x in range(len(speeds))], ratios, width, label=mode)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="ideal")
    ax.set_xticks([x + width * (len(modes) - 1) / 2 for x in range(len(speeds))], labels)
    ax.set_ylabel("end-to-end time / ideal (inference + tools)")
    sim_format = results.get("format", "harmony")
    ax.set_title(
        f"Agent loop, {results['rollout']['tool_calls']} tool calls ({sim_format}): time vs ideal"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out / f"{name}_ratio_to_ideal.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    fastest = speeds[-1]
    sim = SimParameters(**fastest["sim"])
    fig, (cpu, ttft) = plt.subplots(1, 2, figsize=(13, 4.8))
    for mode in modes:
        turns = [TurnRecord(**t) for t in fastest["runs"][mode]["turns"]]
        usage = usage_of(fastest["runs"], mode)
        context = [t.input_tokens / 1000 for t in usage or turns]
        cpu.plot(context, [t.server_cpu_ns / 1e6 for t in turns], marker=".", label=mode)
        added = added_ttft_ms(turns, sim, usage)
        ttft.plot(context, added, marker=".", label=mode)
    cpu.set_ylabel("server CPU per turn (ms)")
    cpu.set_yscale("log")
    ttft.set_ylabel("time to first token above the engine's own (ms)")
    for ax in (cpu, ttft):
        ax.set_xlabel("conversation length (thousand prompt tokens)")
        ax.legend(fontsize=8)
    fig.suptitle(
        f"Per turn as the conversation grows ({sim_format}, {fastest['tokens_per_second']:g} tok/s)"
    )
    fig.tight_layout()
    written.append(out / f"{name}_per_turn.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def plot_load(results: dict[str, Any], out: Path) -> list[Path]:
    """TTFT percentiles and throughput against the number of concurrent agents."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for series in results["series"]:
        points = series["points"]
        agents = [p["agents"] for p in points]
        label = f"workers={series['workers']}"
        left.plot(agents, [p["ttft_p50_ms"] for p in points], marker="o", label=f"p50, {label}")
        left.plot(agents, [p["ttft_p99_ms"] for p in points], marker="^", label=f"p99, {label}")
        right.plot(agents, [p["turns_per_s"] for p in points], marker="o", label=label)
    left.axhline(50, color="red", linewidth=0.8, linestyle="--", label="50 ms")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("concurrent agents (one WebSocket each)")
        ax.legend(fontsize=8)
    left.set_yscale("log")
    left.set_ylabel("time to first token (ms)")
    right.set_ylabel("turns per second")
    fig.suptitle("Concurrency: one server, sim engine")
    fig.tight_layout()
    path = out / "load.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]
