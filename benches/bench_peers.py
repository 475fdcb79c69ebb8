"""hotloop beside the open gateways (docs/benchmarks-gateways.md, "Side by side"), in one run:

    .venv/bin/python benches/bench_peers.py [--speeds 1000,4000] [--upstreams free,render]
        [--rounds 3] [--tool-calls 40] [--history-tokens 60000] [--resume-tokens 0]
        [--systems hotloop,agentic-api,smg] [--baseline NAME=DIR] [--variant NAME=FLAGS]
        [--variant-modes websocket] [--modes websocket,http_full,chat]

Set-up: agentic-api 0.9.0 and smg 1.13.0 are installed into their own virtualenv under
the per-user cache (`~/.cache/hotloop/peers/`, never into hotloop's). One fake vLLM per
speed and upstream kind (`hotloop.lab.fake_vllm`: token-id `/v1/completions` for
hotloop, stateless `/v1/responses` and `/v1/chat/completions` for the peers, paced;
`render`: it renders and tokenizes the whole input of a responses or chat request as
vLLM's gpt-oss path does, `free`: it does not), every gateway in front of it, and a
40-call agent rollout sized to about 60k tokens (`hotloop.lab.rollout`; with
`--resume-tokens N` its first request also resends an earlier session of about N tokens,
before the task) replayed against each gateway in each mode it serves (`websocket`,
`http_full`, `http_previous`, and `chat`: the whole history every turn on
`/v1/chat/completions`, which smg passes through to the upstream's) and by the client
straight to the upstream's `/v1/responses` and `/v1/chat/completions` (`floor`: what the
model alone costs), rounds interleaved.

Per system and mode, medians over the rounds: loop time / ideal (the ideal: the sampled
tokens at the set speed), time to first token over the last 10 turns and its excess over
the floor's, the gateway's CPU per turn (its process tree's threads,
/proc/PID/task/*/schedstat; also over the turns after the first, which renders what a
resumed session resends) and the upstream's, and the median time from a turn's last
token to its terminal event (`tail`: the store's commit over `http_previous`). Results:
benches/results/peers.json (or `--out`). `--baseline NAME=DIR` adds another hotloop
(its package directory first on PYTHONPATH) as `hotloop@NAME`, for before/after figures
in one run; `--variant NAME=FLAGS` the same hotloop with more serve flags, as
`hotloop+NAME` (in the modes `--variant-modes` names, default all). CI's quick check
(benches/test_peers_ratios.py, `make bench-ci`) runs one small configuration of this.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import uvloop
from hotloop._core import ChatFormat
from hotloop.lab.agent import Agent, AgentRun, open_transport
from hotloop.lab.proc import HOTLOOP, Loopback, free_port, serve_command, stop_process
from hotloop.lab.rollout import Rollout, build_rollout

PEER_PACKAGES = ("agentic-api==0.9.0", "smg==1.13.0")
PEER_VENV = Path.home() / ".cache" / "hotloop" / "peers" / "venv-agentic-0.9.0-smg-1.13.0"
MODEL = "sim"
API_KEY = "bench"
MODES = {
    "floor": ("http_full", "chat"),
    "hotloop": ("websocket", "http_full", "http_previous", "chat"),
    "agentic-api": ("websocket", "http_full", "http_previous"),
    # smg's WebSocket mode needs gRPC workers: with HTTP ones the upgrade gets 405. Its
    # /v1/chat/completions is a pass-through to the upstream's.
    "smg": ("http_full", "http_previous", "chat"),
}
FLOOR = "floor http_full"
"""The client's own request, run whatever `--modes` says: every time to first token is
also read over it (over `floor MODE` where that ran too)."""
LAST_TURNS = 10
COLUMNS = (
    "loop_over_ideal",
    "ttft_ms",
    "ttft_over_floor_ms",
    "gateway_cpu_ms_per_turn",
    "upstream_cpu_ms_per_turn",
    "tail_ms",
)


def peer_venv() -> Path:
    """The peers' own virtualenv, created and filled on first use."""
    python = PEER_VENV / "bin" / "python"
    marker = PEER_VENV / "installed.txt"
    if marker.exists() and marker.read_text().split() == list(PEER_PACKAGES):
        return PEER_VENV
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(PEER_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
    marker.write_text("\n".join(PEER_PACKAGES))
    return PEER_VENV


def tree_pids(root: int) -> list[int]:
    """`root` and its descendants, from /proc (each process's parent is field 4)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, ()))
    return found


def tree_cpu_ns(root: int) -> int:
    """CPU time of every live thread in `root`'s process tree (schedstat: nanoseconds)."""
    total = 0
    for pid in tree_pids(root):
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except OSError:
                continue  # the thread exited while we read
    return total


@dataclass
class Process(Loopback):
    """A server under test: its process, its base URL, and its scratch directory."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    scratch: tempfile.TemporaryDirectory[str]
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = Path(self.scratch.name) / "log"

    def cpu_ns(self) -> int:
        return tree_cpu_ns(self.process.pid)


@contextmanager
def started(
    name: str,
    command: list[str],
    port: int,
    env: dict[str, str] | None = None,
    cpus: frozenset[int] | None = None,
) -> Iterator[Process]:
    """Run `command` until the block ends; yields once `port` accepts connections.
    `cpus`: the only CPUs it runs on (its threads too); None: those of this process."""
    scratch = tempfile.TemporaryDirectory(prefix=f"hotloop-peers-{name}-")
    log = open(Path(scratch.name) / "log", "wb")
    process = subprocess.Popen(
        [part.replace("{scratch}", scratch.name) for part in command],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
    )
    server = Process(name, process, port, scratch)
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited: {server.log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not listen on {port}") from None
                time.sleep(0.1)  # a start-up poll, in a benchmark: nothing to wait on
        yield server
    finally:
        stop_process(process)
        log.close()
        scratch.cleanup()


def upstream_command(port: int, script: Path, rate: float, render: bool) -> list[str]:
    command = [sys.executable, "-m", "hotloop.lab.fake_vllm", "--port", str(port)]
    command += ["--script", str(script), "--rate", f"{rate:g}"]
    return command + (["--render"] if render else [])


def add_hotloops(args: argparse.Namespace) -> None:
    """The hotloops `--variant NAME=FLAGS` (`hotloop+NAME`: more serve flags,
    `args.variants`) and `--baseline NAME=DIR` (`hotloop@NAME`: the package in DIR,
    `args.baselines`) name, appended to `args.systems`."""
    args.variants = {}
    for spec in args.variant:
        name, _, flags = spec.partition("=")
        args.variants[f"hotloop+{name}"] = shlex.split(flags)
        args.systems += f",hotloop+{name}"
    args.baselines = {}
    for spec in args.baseline:
        name, _, path = spec.partition("=")
        args.baselines[f"hotloop@{name}"] = path
        args.systems += f",hotloop@{name}"


def kind_of(system: str) -> str:
    """`hotloop` for its baselines (`hotloop@NAME`) and variants (`hotloop+NAME`)."""
    return re.split(r"[@+]", system)[0]


def gateway_command(system: str, port: int, upstream: str, venv: Path | None) -> list[str]:
    if system == "hotloop":
        flags = ["--engine", "upstream", "--upstream-dialect", "vllm"]
        flags += ["--upstream-replicas", upstream, "--upstream-served-model", MODEL]
        flags += ["--model", MODEL, "--api-keys", API_KEY, "--data-dir", "{scratch}"]
        flags += ["--upstream-context-window", str(1 << 20)]
        return serve_command(port, *flags, command=HOTLOOP)
    assert venv is not None
    if system == "agentic-api":
        return [
            str(venv / "bin" / "agentic-server"),
            "--llm-api-base",
            f"{upstream}/v1",
            "--gateway-host",
            "127.0.0.1",
            "--gateway-port",
            str(port),
            "--db-url",
            "sqlite://{scratch}/agentic.db",
        ]
    return [
        str(venv / "bin" / "smg"),
        "launch",
        "--backend",
        "openai",
        "--worker-urls",
        upstream,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(free_port()),
        "--history-backend",
        "memory",
    ]


def agent_rollout(seed: int, tool_calls: int, history_tokens: int) -> Rollout:
    """The rollout for `seed`, its tool outputs sized so that the conversation ends near
    `history_tokens` (the peers' measurement: 3-7 KB outputs, about 60k tokens at 40
    calls): each cut to a size varied by the seed, a short one continued with the
    rollout's other outputs (real text, as the tokenizer sees it)."""
    rollout = build_rollout(seed, tool_calls=tool_calls)
    rng = random.Random(seed)
    # About 4.3 bytes a token in these outputs; the task and replies take the rest.
    mean = max(1, int(history_tokens * 4.3) // len(rollout.steps) - 500)
    pool = "\n".join(step.output for step in rollout.steps)
    steps = []
    for step in rollout.steps:
        size = int(mean * rng.uniform(0.6, 1.4))
        steps.append(replace(step, output=(step.output + "\n" + pool)[:size]))
    return replace(rollout, steps=tuple(steps))


def write_script(rollout: Rollout, directory: str) -> Path:
    """The fake vLLM's replay script for `rollout`, written into `directory`."""
    script = Path(directory) / "script.json"
    script.write_text(json.dumps(rollout.sim_script()))
    return script


def ideal_seconds(rollout: Rollout, rate: float) -> float:
    """The sampled tokens of the whole conversation at `rate`: the model's own time."""
    format_ = ChatFormat.harmony()
    tokens = sum(
        len(
            format_.completion_tokens(
                reasoning=s.reasoning, calls=[(s.call.name, s.call.arguments)]
            )
        )
        for s in rollout.steps
    )
    return (tokens + len(format_.completion_tokens(text=rollout.answer))) / rate


async def converse(rollout: Rollout, mode: str, server: Process) -> AgentRun:
    transport = await open_transport(mode, server.base_url, server.ws_url, API_KEY)
    try:
        agent = Agent(rollout, mode, transport, model=MODEL, server_cpu_ns=server.cpu_ns)
        return await agent.run()
    finally:
        await transport.close()


def measure(rollout: Rollout, mode: str, server: Process, upstream: Process) -> dict[str, float]:
    upstream_start = upstream.cpu_ns()
    run = uvloop.run(converse(rollout, mode, server))
    turns = len(run.turns)
    last = run.turns[-LAST_TURNS:]
    return {
        "wall_s": run.wall,
        "turns": turns,
        "ttft_ms": statistics.median(t.ttft for t in last) * 1e3,
        "tail_ms": statistics.median(t.tail for t in run.turns) * 1e3,
        "gateway_cpu_ms_per_turn": run.server_cpu_ns / turns / 1e6,
        "gateway_cpu_ms_per_later_turn": (
            sum(t.server_cpu_ns for t in run.turns[1:]) / max(1, turns - 1) / 1e6
        ),
        "upstream_cpu_ms_per_turn": (upstream.cpu_ns() - upstream_start) / turns / 1e6,
        "input_tokens_last": run.turns[-1].input_tokens,
    }


def run_configuration(
    args: argparse.Namespace,
    rollout: Rollout,
    script: Path,
    rate: float,
    render: bool,
    venv: Path | None,
) -> dict[str, Any]:
    """Every system and mode in front of one upstream, rounds interleaved; medians."""
    systems = ["floor", *args.systems.split(",")]
    with ExitStack() as stack:
        port = free_port()
        upstream = stack.enter_context(
            started("upstream", upstream_command(port, script, rate, render), port)
        )
        upstream_url = f"http://127.0.0.1:{port}"
        servers = {"floor": upstream}
        for system in systems[1:]:
            port = free_port()
            env = None
            if system in args.baselines:
                env = {"PYTHONPATH": args.baselines[system]}
            command = gateway_command(kind_of(system), port, upstream_url, venv)
            command += args.variants.get(system, [])
            servers[system] = stack.enter_context(started(system, command, port, env))
        samples: dict[str, list[dict[str, float]]] = {}
        for _ in range(args.rounds):
            for system in systems:
                for mode in MODES[kind_of(system)]:
                    key = f"{system} {mode}"
                    if args.modes and mode not in args.modes.split(",") and key != FLOOR:
                        continue
                    if system in args.variants and args.variant_modes:
                        if mode not in args.variant_modes.split(","):
                            continue
                    sample = measure(rollout, mode, servers[system], upstream)
                    samples.setdefault(key, []).append(sample)
                    print(
                        f"  {rate:g} tok/s {'render' if render else 'free'} {key}: {sample}",
                        file=sys.stderr,
                    )
    ideal = ideal_seconds(rollout, rate)
    results: dict[str, Any] = {"ideal_s": ideal, "systems": {}}
    for key, runs in samples.items():
        medians = {name: statistics.median(r[name] for r in runs) for name in runs[0]}
        medians["loop_over_ideal"] = medians["wall_s"] / ideal
        results["systems"][key] = medians
    for key, medians in results["systems"].items():
        floor = results["systems"].get(f"floor {key.rsplit(' ', 1)[1]}", results["systems"][FLOOR])
        medians["ttft_over_floor_ms"] = medians["ttft_ms"] - floor["ttft_ms"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speeds", default="1000,4000")
    parser.add_argument("--upstreams", default="free,render")
    parser.add_argument("--systems", default="hotloop,agentic-api,smg")
    parser.add_argument("--modes", default="", help="only these modes (default: all served)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tool-calls", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--history-tokens", type=int, default=60_000, help="at the end")
    parser.add_argument(
        "--resume-tokens",
        type=int,
        default=0,
        help="an earlier session of about this many tokens, resent by the first request",
    )
    parser.add_argument("--out", default="benches/results/peers.json")
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also run the hotloop whose package is in DIR (put first on PYTHONPATH), "
        "as system hotloop@NAME",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="also run this hotloop with these serve flags, as system hotloop+NAME "
        '(e.g. durable="--store-durability process-crash")',
    )
    parser.add_argument(
        "--variant-modes",
        default="",
        help="run the variants only in these modes (e.g. websocket for a WebSocket setting)",
    )
    args = parser.parse_args()
    add_hotloops(args)
    rollout = agent_rollout(args.seed, args.tool_calls, args.history_tokens)
    if args.resume_tokens:
        earlier = agent_rollout(args.seed + 1, args.tool_calls, args.resume_tokens)
        rollout = replace(rollout, prior=tuple(earlier.history_items(len(earlier.steps))))
    needs_peers = any(not s.startswith("hotloop") for s in args.systems.split(","))
    venv = peer_venv() if needs_peers else None
    results: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "load_average_at_start": os.getloadavg(),
        "rollout": {
            "seed": args.seed,
            "tool_calls": len(rollout.steps),
            "resume_tokens": args.resume_tokens,
        },
        "configurations": [],
    }
    with tempfile.TemporaryDirectory(prefix="hotloop-peers-") as scratch:
        script = write_script(rollout, scratch)
        for rate in [float(s) for s in args.speeds.split(",")]:
            for kind in args.upstreams.split(","):
                entry = run_configuration(args, rollout, script, rate, kind == "render", venv)
                entry.update(tokens_per_second=rate, upstream=kind)
                results["configurations"].append(entry)
    results["load_average_at_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    for entry in results["configurations"]:
        print(f"\n{entry['tokens_per_second']:g} tok/s, upstream {entry['upstream']}")
        header = ("loop/ideal", "ttft ms", "+floor", "gw cpu/turn", "up cpu/turn", "tail ms")
        print(f"{'system mode':<28}" + "".join(f"{name:>13}" for name in header))
        for key, m in entry["systems"].items():
            values = [m[name] for name in COLUMNS]
            print(f"{key:<28}" + "".join(f"{value:>13.3f}" for value in values))


if __name__ == "__main__":
    main()
