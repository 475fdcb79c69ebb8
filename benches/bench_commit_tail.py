"""The commit tail over HTTP (issue 23): the time from the last token to
`response.completed` at the client, for streamed turns sent with
`previous_response_id` (`store: true`: the response is committed before its terminal
event), against real `hotloop serve --engine sim` processes on loopback, one per
durability setting, rounds interleaved:

    .venv/bin/python benches/bench_commit_tail.py [--turns 40] [--rounds 3]
        [--baseline NAME=DIR]

`--baseline NAME=DIR` adds the same servers run from another hotloop package (DIR first
on PYTHONPATH), for before/after figures measured in the same run. The engine streams
at 100,000 tokens/s, so the tail is the server's own: the last delta, the response
finished, committed and acknowledged. Prints the median tail per server and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from contextlib import ExitStack
from typing import Any

import httpx
from hotloop.lab.proc import ServerProcess

FLAGS = ["--engine", "sim", "--sim-ttft", "0", "--sim-tokens-per-second", "100000"]
DURABILITIES = ("power-loss", "process-crash")


def tail(client: httpx.Client, body: dict[str, Any]) -> tuple[float, str]:
    """Milliseconds from the last delta to `response.completed`, and the response id."""
    last_delta = completed = 0.0
    response_id = ""
    with client.stream("POST", "/v1/responses", json=body | {"stream": True}) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"].endswith(".delta"):
                last_delta = time.perf_counter()
            elif event["type"] == "response.completed":
                completed = time.perf_counter()
                response_id = event["response"]["id"]
    return (completed - last_delta) * 1e3, response_id


def conversation(client: httpx.Client, turns: int) -> list[float]:
    tails = []
    previous: str | None = None
    for n in range(turns):
        body: dict[str, Any] = {
            "model": "sim",
            "max_output_tokens": 16,
            "store": True,
            "input": [{"type": "message", "role": "user", "content": f"step {n}: " + "x" * 2000}],
        }
        if previous is not None:
            body["previous_response_id"] = previous
        took, previous = tail(client, body)
        tails.append(took)
    return tails


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", action="append", default=[], metavar="NAME=DIR")
    args = parser.parse_args()
    trees: dict[str, dict[str, str] | None] = {"hotloop": None}
    for spec in args.baseline:
        name, directory = spec.split("=", 1)
        trees[f"hotloop@{name}"] = dict(os.environ, PYTHONPATH=directory)
    tails: dict[str, list[float]] = {}
    with ExitStack() as stack:
        clients = {}
        for tree, env in trees.items():
            for durability in DURABILITIES:
                server = stack.enter_context(
                    ServerProcess.start([*FLAGS, "--store-durability", durability], env=env)
                )
                name = f"{tree} {durability}"
                clients[name] = stack.enter_context(
                    httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=60)
                )
                tails[name] = []
        for _ in range(args.rounds):
            for name, client in clients.items():
                tails[name] += conversation(client, args.turns)
    medians = {name: round(statistics.median(times), 3) for name, times in tails.items()}
    for name, median in medians.items():
        print(f"{name:>32}: last delta -> response.completed, median {median:.3f} ms")
    print(json.dumps({"turns": args.turns, "rounds": args.rounds, "median_ms": medians}))


if __name__ == "__main__":
    main()
