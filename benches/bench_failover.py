"""Several nodes behind HAProxy, measured on loopback (`hotloop.lab.cluster`), in one run:

    .venv/bin/python benches/bench_failover.py [--runs 3] [--out benches/results/failover.json]

- Fault runs (`hotloop.lab.failover.run_scenario`): six agents, 20-turn `store=true`
  conversations, three nodes sharing a PostgreSQL database (`--sqlite`: one SQLite
  file), three faults per run of each kind (SIGKILL, SIGSTOP, drain, each node
  rejoining; PostgreSQL stopped for 6-7 s). Reported per kind: acknowledged responses lost (must be
  0), failed responses, conversations finished, prompts identical to an undisturbed run,
  and the failover time, from the fault to the first delta of the retried turn
  (p50/p99 over all retried turns of all runs).
- Continuation latency: a conversation with 10k or 130k tokens of history continued
  with a short turn on the node that served it (warm cache) and on another node
  (rebuilt from the store), time to the first delta, medians.
- Prefix-cache hits after a node change: agents whose every turn goes to another node,
  on the simulated vLLM replicas: the share of prompt tokens that extended what that
  replica had already processed, with rendezvous routing and with per-process pinning.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from hotloop.lab.cluster import Cluster, ClusterConfig
from hotloop.lab.failover import Agent, Outcome, replica_prompts, run_scenario

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi".split()


def history_text(tokens: int) -> str:
    """About `tokens` o200k tokens of varied words (a word and a number: ~2 tokens)."""
    return " ".join(f"{WORDS[k % len(WORDS)]}{k % 1013}" for k in range(tokens // 2))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def fault_runs(cluster: Cluster, runs: int) -> dict[str, Any]:
    options: dict[str, Any] = {"tool_time": 0.2, "store": cluster.postgres}
    control = await run_scenario(cluster, "none", tag="control", **options)
    report: dict[str, Any] = {}
    faults = ("kill", "hang", "drain") + (("store",) if cluster.postgres else ())
    for fault in faults:
        outcomes: list[Outcome] = []
        # In an outage the agents wait out a node's wait for a database connection (5 s),
        # so they see the failure instead of their own timeout.
        stall = {"stall_timeout": 8.0} if fault == "store" else {}
        for seed in range(runs):
            outcomes.append(
                await run_scenario(
                    cluster, fault, tag=f"{fault}-{seed}", seed=seed, **options, **stall
                )
            )
        failover = [t for o in outcomes for t in o.failover]
        report[fault] = {
            "runs": runs,
            "faults": sum(len(o.faults_at) for o in outcomes),
            "acknowledged": sum(len(r.acknowledged) for o in outcomes for r in o.results),
            "acknowledged_lost": sum(len(o.lost) for o in outcomes),
            "failed_responses": sum(len(o.failed) for o in outcomes),
            "conversations_finished": sum(r.turns_done == 20 for o in outcomes for r in o.results),
            "conversations": sum(len(o.results) for o in outcomes),
            "prompts_identical_to_control": sum(o.sequences == control.sequences for o in outcomes),
            "retried_turns": len(failover),
            "failover_p50_s": percentile(failover, 0.5),
            "failover_p99_s": percentile(failover, 0.99),
            "detection_s": [d for o in outcomes for d in o.detection],
            # The kinds of failure the agents saw (code and the message's first word).
            "failures": sorted({" ".join(f.split()[:2]) for o in outcomes for f in o.failed}),
        }
        print(fault, json.dumps(report[fault]), flush=True)
    return report


async def first_delta(url: str, body: dict[str, Any]) -> float:
    """Seconds from sending a streamed request to its first delta event."""
    start = time.perf_counter()
    async with (
        httpx.AsyncClient(timeout=300.0) as http,
        http.stream("POST", f"{url}/v1/responses", json={**body, "stream": True}) as reply,
    ):
        async for line in reply.aiter_lines():
            if line.startswith("data: ") and b'"type":"response.output_text.delta"' in (
                line.encode()
            ):
                return time.perf_counter() - start
    raise RuntimeError(f"no delta from {url}")


async def continuation(cluster: Cluster, history_tokens: int, samples: int) -> dict[str, Any]:
    """Warm (same node) against rebuilt (other node) continuations of `samples` chains."""
    node1, node2 = cluster.node_url("node1"), cluster.node_url("node2")
    text = history_text(history_tokens)
    async with httpx.AsyncClient(timeout=300.0) as http:
        roots = []
        for i in range(samples):
            reply = await http.post(
                f"{node1}/v1/responses",
                json={"model": "sim", "input": f"{i}: {text}", "store": True},
            )
            reply.raise_for_status()
            roots.append(reply.json()["id"])
        # Until every chain is readable on node2 (the store's commit), bounded.
        for root in roots:
            for _ in range(600):
                if (await http.get(f"{node2}/v1/responses/{root}")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
    same, other = [], []
    for root in roots:
        turn = {"model": "sim", "input": "Continue.", "previous_response_id": root}
        same.append(await first_delta(node1, turn))
        other.append(await first_delta(node2, turn))
    return {
        "history_tokens": history_tokens,
        "samples": samples,
        "same_node_ms": 1000 * statistics.median(same),
        "other_node_ms": 1000 * statistics.median(other),
    }


async def cache_hits_after_node_changes(cluster: Cluster, tag: str) -> dict[str, Any]:
    """Agents whose every turn goes to the other node; the replicas' cache hits on the
    turns after the first (a hit: the whole previous prompt of the conversation was in
    that replica's prefix cache)."""
    hops = [cluster.node_url(name) for name in cluster.nodes]
    agents = [
        Agent(
            cluster.url,
            f"hop{i}",
            turns=10,
            hops=hops[i % 2 :] + hops[: i % 2],
            output_bytes=2048,
        )
        for i in range(6)
    ]
    results = await asyncio.gather(*(agent.run() for agent in agents))
    keys = {key for result in results for key in result.keys}
    by_conversation: dict[str, list[dict[str, Any]]] = {}
    for record in await replica_prompts(cluster.replica_urls):
        if record["session"] in keys:
            turns = by_conversation.setdefault(record["session"], [])
            if not turns or turns[-1]["hash"] != record["hash"]:  # a retry sends it again
                turns.append(record)
    later = [
        (before, after)
        for turns in by_conversation.values()
        for before, after in itertools.pairwise(turns)
    ]
    return {
        "routing": tag,
        "finished": sum(r.turns_done == 10 for r in results),
        "turns_after_a_node_change": len(later),
        "history_hits": sum(after["cached"] >= before["tokens"] for before, after in later)
        / max(1, len(later)),
        "prefill_tokens_per_turn": statistics.mean(a["tokens"] - a["cached"] for _, a in later)
        if later
        else None,
        "cached_share": sum(a["cached"] for _, a in later)
        / max(1, sum(a["tokens"] for _, a in later)),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument(
        "--sqlite", action="store_true", help="one SQLite data directory, not PostgreSQL"
    )
    parser.add_argument("--out", type=Path, default=Path("benches/results/failover.json"))
    args = parser.parse_args()
    report: dict[str, Any] = {}
    postgres = not args.sqlite
    with Cluster(ClusterConfig(postgres=postgres)) as cluster:
        report["faults"] = await fault_runs(cluster, args.runs)
    big = ClusterConfig(
        nodes=2,
        replicas=1,
        tool_calls=0,
        postgres=postgres,
        node_flags=("--upstream-context-window", "262144"),
    )
    with Cluster(big) as cluster:
        report["continuation"] = [
            await continuation(cluster, tokens, args.samples) for tokens in (10_000, 130_000)
        ]
    print(json.dumps(report["continuation"]), flush=True)
    report["prefix_cache"] = []
    for routing in ("rendezvous", "pinned"):
        config = ClusterConfig(
            nodes=2, replicas=2, tool_calls=9, routing=routing, postgres=postgres
        )
        with Cluster(config) as cluster:
            report["prefix_cache"].append(await cache_hits_after_node_changes(cluster, routing))
    print(json.dumps(report["prefix_cache"]), flush=True)
    args.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    asyncio.run(main())
