"""`hotloop bench`: the agent-loop benchmark, the concurrency sweep, and re-plotting.

    hotloop bench agent   # rollout x {65, 1000, 4000} tok/s x {http_full, http_previous,
                          # websocket, long_running}, plus the peer; writes
                          # benches/results/agent.json + PNGs
    hotloop bench agent --format smollm2   # the same in SmolLM2's ChatML, against the
                          # open-model peer; writes agent_smollm2.json + PNGs
    hotloop bench agent --format qwen3     # Qwen3's own template, against vLLM's path
    hotloop bench load    # 10..500 agents on one process and on --workers 2
    hotloop bench plot    # redraw the PNGs from the JSON files
    hotloop bench serve --baseline harmony [hotloop serve flags]   # a server whose
                          # engine is fed the peer's prompt (hotloop.lab.baseline)

Each configuration gets a fresh `hotloop serve --engine sim` on a free loopback port, so
runs do not share caches; the server is stopped after it. Results go to
`benches/results/` by default.

This module owns the command line (the `hotloop.commands` entry point `bench`, which
`hotloop` loads only to run it) and the sequencing of runs; measuring is in `agent`,
`load` and `report`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hotloop.lab import MODES
from hotloop.lab.peer import RENDERERS, SIM_FORMAT
from hotloop.lab.rollout import Rollout, build_rollout

if TYPE_CHECKING:
    from hotloop.lab.agent import AgentRun
    from hotloop.lab.load import LoadPoint
    from hotloop.lab.proc import ServerProcess
    from hotloop.lab.report import SimParameters

# The clients, plots and progress bars need the `bench` extra; `hotloop serve` must not,
# so they are imported when a benchmark runs, not when the command line is built.
# `--format`: the sim's chat format, and the peer that renders the same prompt in it (a
# peer in another format would feed the engine ids the replay script does not know).
PEERS = {"harmony": "harmony", "smollm2": "open-model", "qwen3": "qwen3"}

T = TypeVar("T")
MODEL = "sim"
API_KEY = "bench"


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": os.getloadavg(),
    }


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a client on uvloop where it exists: the client's own overhead stays small."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    result: T = uvloop.run(coroutine)
    return result


def _progress(total: int, description: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=description, unit="turn", file=sys.stderr, leave=False)


def _sim_flags(
    sim: SimParameters,
    script: Path | None,
    sim_format: str = "harmony",
    api_keys: tuple[str, ...] = (API_KEY,),
) -> list[str]:
    flags = [
        "--engine",
        "sim",
        "--sim-format",
        sim_format,
        "--model",
        MODEL,
        "--api-keys",
        ",".join(api_keys),
        "--sim-tokens-per-second",
        f"{sim.tokens_per_second:g}",
        "--sim-ttft",
        f"{sim.ttft:g}",
        "--sim-prefill-tokens-per-second",
        f"{sim.prefill_tokens_per_second:g}",
    ]
    if script is not None:
        flags += ["--sim-script", str(script)]
    return flags


async def _agent_run(
    server: ServerProcess, rollout: Rollout, mode: str, tool_time: float, label: str
) -> AgentRun:
    from hotloop.lab.agent import Agent, open_transport

    transport = await open_transport(mode, server.base_url, server.ws_url, API_KEY)
    bar = _progress(len(rollout.steps) + 1, label)
    try:
        agent = Agent(
            rollout,
            mode,
            transport,
            model=MODEL,
            tool_time=tool_time,
            server_cpu_ns=server.cpu_ns,
            on_turn=lambda turn: bar.update(1),
        )
        return await agent.run()
    finally:
        bar.close()
        await transport.close()


def agent_results_name(sim_format: str) -> str:
    """The stem of an agent run's files under `--out`: `agent` for harmony (the default),
    `agent_<format>` otherwise, so runs in different formats sit side by side."""
    return "agent" if sim_format == "harmony" else f"agent_{sim_format}"


def run_agent(args: argparse.Namespace) -> dict[str, Any]:
    from hotloop.lab.report import plot_agent_runs

    baseline = PEERS[args.format] if args.baseline is None else args.baseline
    peers = [p for p in baseline.split(",") if p]
    others = [peer for peer in peers if SIM_FORMAT.get(peer, args.format) != args.format]
    if others:
        raise SystemExit(
            f"hotloop bench: with --format {args.format} the peer is {PEERS[args.format]}, "
            f"not {', '.join(others)}"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rollout = build_rollout(args.seed, tool_calls=args.tool_calls)
    with tempfile.TemporaryDirectory(prefix="hotloop-bench-") as scratch:
        script = Path(scratch) / "sim_script.json"
        script.write_text(json.dumps(rollout.sim_script(args.format)))
        results = _agent_speeds(args, rollout, script, peers)
    name = agent_results_name(args.format)
    (out / f"{name}.json").write_text(json.dumps(results, indent=1))
    plot_agent_runs(results, out, name)
    return results


def _agent_speeds(
    args: argparse.Namespace, rollout: Rollout, script: Path, peers: list[str]
) -> dict[str, Any]:
    from hotloop.lab.proc import BASELINE, HOTLOOP, ServerProcess
    from hotloop.lab.report import SimParameters, summarise, usage_of

    modes = args.modes.split(",")
    if "long_running" in modes and "websocket" not in modes:
        # Its usage comes once, for the whole response: its ideal is the chain's.
        raise SystemExit("hotloop bench: long_running is measured against websocket; run both")
    results: dict[str, Any] = {
        "machine": _machine(),
        "format": args.format,
        "rollout": {
            "seed": rollout.seed,
            "project": rollout.project,
            "tool_calls": len(rollout.steps),
            "tool_output_bytes": rollout.tool_output_bytes,
            "corpus": rollout.corpus,
        },
        "tool_time_s": args.tool_time,
        "speeds": [],
    }
    for speed in _floats(args.speeds):
        sim = SimParameters(speed, args.sim_ttft, args.sim_prefill)
        entry: dict[str, Any] = {"tokens_per_second": speed, "sim": vars(sim), "runs": {}}
        configurations = [("", m) for m in modes] + [
            (peer, m) for peer in peers for m in args.baseline_modes.split(",")
        ]
        for peer, mode in configurations:
            flags = _sim_flags(sim, script, args.format)
            command: tuple[str, ...] = HOTLOOP
            if peer:
                flags += ["--baseline", peer]
                command = BASELINE
            label = f"{speed:g} tok/s {f'peer:{peer} ' if peer else ''}{mode}"
            with ServerProcess.start(flags, command=command) as server:
                run = _run(_agent_run(server, rollout, mode, args.tool_time, label))
            summary = summarise(run, sim, usage_of(entry["runs"], mode))
            name = f"peer_{peer}_{mode}" if peer else mode
            entry["runs"][name] = {"summary": summary, **run.to_json()}
            print(
                f"{label:40s} wall {summary['wall_s']:7.2f}s  ideal {summary['ideal_s']:7.2f}s  "
                f"x{summary['ratio_to_ideal']:.3f}  server cpu/turn "
                f"{summary['server_cpu_per_turn_ms_median']:.2f} ms  ttft p50 "
                f"{summary['ttft_p50_ms']:.1f} ms  client cpu {summary['client_cpu_s']:.2f}s",
                file=sys.stderr,
            )
        entry["targets"] = _targets(entry)
        results["speeds"].append(entry)
    return results


def _targets(entry: dict[str, Any]) -> dict[str, Any]:
    runs = entry["runs"]
    found: dict[str, Any] = {}
    if "websocket" in runs and "long_running" in runs:
        chain, long = runs["websocket"]["summary"], runs["long_running"]["summary"]
        found["long_running_over_websocket"] = long["wall_s"] / chain["wall_s"]
        found["long_running_server_cpu_per_turn_over_websocket"] = (
            long["server_cpu_per_turn_ms_median"] / chain["server_cpu_per_turn_ms_median"]
        )
    if "websocket" in runs:
        found["websocket_ratio_to_ideal"] = runs["websocket"]["summary"]["ratio_to_ideal"]
        if "http_full" in runs:
            ws = runs["websocket"]["summary"]["wall_s"]
            full = runs["http_full"]["summary"]["wall_s"]
            # "40% faster" read as speed: http_full takes >= 1.4x the WebSocket time.
            found["http_full_over_websocket"] = full / ws
            found["websocket_time_saved_vs_http_full"] = 1 - ws / full
        for name, run in runs.items():
            if name.startswith("peer_"):
                found[f"{name}_over_websocket"] = (
                    run["summary"]["wall_s"] / runs["websocket"]["summary"]["wall_s"]
                )
    return found


def run_load(args: argparse.Namespace) -> dict[str, Any]:
    from hotloop.lab.load import crossing
    from hotloop.lab.proc import ServerProcess
    from hotloop.lab.report import SimParameters, plot_load

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rollouts = [build_rollout(seed, tool_calls=args.tool_calls) for seed in range(args.rollouts)]
    sim = SimParameters(args.sim_speed, args.sim_ttft, args.sim_prefill)
    results: dict[str, Any] = {
        "machine": _machine(),
        "sim": vars(sim),
        "tool_time_s": args.tool_time,
        "window_s": args.window,
        "series": [],
    }
    for workers in _ints(args.workers):
        points: list[LoadPoint] = []
        for agents in _ints(args.agents):
            # one key per agent, as agents of different users: under one key the
            # per-key connection cap (--max-connections-per-key) would refuse the rest
            keys = tuple(f"{API_KEY}-{n}" for n in range(agents))
            flags = _sim_flags(sim, None, api_keys=keys) + _load_script()
            with ServerProcess.start(flags, workers=workers) as server:
                point = _load_point(server, rollouts, keys, workers, args)
            points.append(point)
            print(
                f"workers={workers} agents={agents:4d}: {point.turns_per_s:7.1f} turns/s "
                f"{point.tokens_per_s:9.0f} tok/s  ttft p50 {point.ttft_p50_ms:6.1f} ms "
                f"p99 {point.ttft_p99_ms:7.1f} ms  server {point.server_cpu_cores:.2f} cores  "
                f"rss/conn {point.rss_per_connection_kb:7.0f} KB  errors {point.errors}",
                file=sys.stderr,
            )
        results["series"].append(
            {
                "workers": workers,
                "points": [p.to_json() for p in points],
                "p99_ttft_passes_50ms_at_agents": crossing(points),
            }
        )
    (out / "load.json").write_text(json.dumps(results, indent=1))
    plot_load(results, out)
    return results


def _load_point(
    server: ServerProcess,
    rollouts: list[Rollout],
    keys: tuple[str, ...],
    workers: int,
    args: argparse.Namespace,
) -> LoadPoint:
    from hotloop.lab.load import LoadRun

    bar = _progress(0, f"workers={workers} agents={len(keys)}")
    try:
        run = LoadRun(
            server,
            rollouts,
            keys,
            workers=workers,
            window=args.window,
            tool_time=args.tool_time,
            model=MODEL,
            on_turn=lambda: bar.update(1),
        )
        return _run(run.run())
    finally:
        bar.close()


def _load_script() -> list[str]:
    """Under load the sim always calls the shell tool with a typical command (about 60
    output tokens with its preamble): which call it makes does not change the server's
    work, and agents answer whatever call they get."""
    arguments = json.dumps({"cmd": "sed -n '1,200p' email/message.py", "workdir": "."})
    return [
        "--sim-tool",
        "exec_command",
        "--sim-tool-calls",
        "1000000",
        "--sim-tool-arguments",
        arguments,
    ]


def run_plot(args: argparse.Namespace) -> None:
    from hotloop.lab.report import plot_agent_runs, plot_load

    out = Path(args.out)
    for sim_format in PEERS:
        name = agent_results_name(sim_format)
        if (out / f"{name}.json").is_file():
            plot_agent_runs(json.loads((out / f"{name}.json").read_text()), out, name)
    if (out / "load.json").is_file():
        plot_load(json.loads((out / "load.json").read_text()), out)


def configure(bench: argparse.ArgumentParser) -> None:
    """`bench`'s subcommands and their arguments (`hotloop.cli.LAB_COMMANDS`)."""
    kinds = bench.add_subparsers(dest="bench_command", required=True)

    agent = kinds.add_parser("agent", help="one agent rollout in every client mode")
    agent.add_argument("--speeds", default="65,1000,4000", help="sim tokens/s, comma-separated")
    agent.add_argument(
        "--modes",
        default="http_full,http_previous,websocket,long_running",
        help=f"client modes to run, comma-separated (of {', '.join(MODES)})",
    )
    agent.add_argument("--tool-calls", type=int, default=50, help="tool calls in the rollout")
    agent.add_argument(
        "--seed", type=int, default=2, help="which rollout (2 reads asyncio's sources)"
    )
    agent.add_argument("--tool-time", type=float, default=0.0, help="seconds per tool call")
    agent.add_argument(
        "--format",
        choices=tuple(PEERS),
        default="harmony",
        help="the sim engine's chat format (harmony: gpt-oss; smollm2: ChatML; qwen3: "
        "Qwen3's own template and vocabulary)",
    )
    agent.add_argument(
        "--baseline",
        default=None,
        help="peer flavours to run too (default: the format's own peer, harmony or "
        "open-model; '' for none)",
    )
    agent.add_argument(
        "--baseline-modes", default="http_full,websocket", help="client modes run against the peer"
    )

    load = kinds.add_parser("load", help="concurrent agents, one WebSocket each")
    load.add_argument("--agents", default="10,100,500", help="agent counts, comma-separated")
    load.add_argument("--workers", default="1,2", help="server process counts, comma-separated")
    load.add_argument("--window", type=float, default=20.0, help="seconds measured per point")
    load.add_argument(
        "--tool-time", type=float, default=2.0, help="seconds each agent thinks between turns"
    )
    load.add_argument("--tool-calls", type=int, default=40, help="tool calls per rollout")
    load.add_argument("--rollouts", type=int, default=4, help="distinct rollouts shared by agents")
    # 1,000 tokens/s per agent with 2 s of tool time between turns: each agent streams
    # about 30 tokens/s on average, so 500 agents ask two cores for about 15k tokens/s.
    load.add_argument("--sim-speed", type=float, default=1000.0, help="sim tokens/s per agent")

    kinds.add_parser("plot", help="redraw the PNGs from the results JSON")

    serve = kinds.add_parser(
        "serve",
        help="run `hotloop serve` with a stateless peer's prompt work on every turn, the "
        "engine fed the peer's prompt (every `hotloop serve` flag is taken too)",
        allow_abbrev=False,
    )
    serve.add_argument(
        "--baseline",
        required=True,
        choices=tuple(RENDERERS),
        help="the peer: harmony is openai-harmony, template jinja2 + tiktoken, open-model "
        "jinja2 + Hugging Face tokenizers (with --sim-format smollm2), qwen3 vLLM's path "
        "for Qwen3 (with --sim-format qwen3)",
    )

    # Under load the engine's own latency is kept small (fast prefill, 10 ms to first
    # token), so time to first token shows the server's queueing, not the model's.
    for parser, ttft, prefill in ((agent, 0.02, 20000.0), (load, 0.01, 1e7)):
        parser.add_argument(
            "--sim-ttft", type=float, default=ttft, help="sim time to first token, seconds"
        )
        parser.add_argument(
            "--sim-prefill", type=float, default=prefill, help="sim prefill tokens/s"
        )
    for parser in (agent, load, kinds.choices["plot"]):
        parser.add_argument(
            "--out", default="benches/results", help="directory of the JSON results and plots"
        )


def main(args: argparse.Namespace, rest: list[str]) -> None:
    """Run `hotloop bench`; `rest` is the line's arguments none of its own flags took
    (for `serve`, `hotloop serve`'s)."""
    if args.bench_command == "serve":
        from hotloop.lab.baseline import run

        run(args.baseline, rest)
        return
    if rest:
        raise SystemExit(f"hotloop bench: unrecognized arguments: {' '.join(rest)}")
    if args.bench_command == "agent":
        run_agent(args)
    elif args.bench_command == "load":
        run_load(args)
    else:
        run_plot(args)
