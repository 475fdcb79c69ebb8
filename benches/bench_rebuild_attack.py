"""Another tenant's turn latency while one tenant continues a long stored chain from new
sockets over and over (issue 21 defect 9: each continuation rebuilds the chain from the
store; the rebuild ran on the event loop). One `hotloop serve --engine sim` process on
loopback with a SQLite store: tenant `sk-a` stores a chain of about TOKENS tokens with
warm-ups (`generate: false`), then, in a process of its own, opens a socket per
continuation (a warm-up again: no engine time, only the rebuild); tenant `sk-b` runs
turns back to back (`hotloop.lab.abuse.Victim`), first alone, then during the attack.
Prints the victim's medians, their ratio, and the attacker's rebuilds.

    .venv/bin/python benches/bench_rebuild_attack.py [SECONDS [TOKENS]]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
from hotloop.lab.abuse import (
    ATTACKER,
    GUARD,
    SERVER_ENV,
    SERVER_FLAGS,
    Victim,
    auth,
    create,
    until_terminal,
    ws_url,
)
from hotloop.lab.proc import ServerProcess
from websockets.sync.client import connect

# Tokens of one warm-up's input: a few MB of text per frame, well under the limits.
TOKENS_PER_WARM_UP = 50_000


def store_chain(base: str, tokens: int) -> str:
    """Tenant `sk-a`'s stored chain of about `tokens` tokens; the id of its head."""
    words = " ".join(f"w{i % 997}" for i in range(TOKENS_PER_WARM_UP // 2))
    counted = httpx.post(
        base + "/v1/responses/input_tokens",
        json={"model": "sim", "input": words},
        headers=auth(ATTACKER),
        timeout=GUARD,
    ).json()["input_tokens"]
    head: str | None = None
    with connect(ws_url(base), additional_headers=auth(ATTACKER), max_size=None) as ws:
        for _ in range(max(1, tokens // counted)):
            ws.send(create(input=words, generate=False, store=True, previous_response_id=head))
            event = until_terminal(ws)
            assert event["type"] == "response.completed", event
            head = event["response"]["id"]
    assert head is not None
    return head


def attack(base: str, head: str, seconds: float) -> None:
    """Continue `head` from a new socket, over and over, for `seconds`."""
    rebuilds, spent = 0, []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        start = time.perf_counter()
        with connect(ws_url(base), additional_headers=auth(ATTACKER), max_size=None) as ws:
            ws.send(create(input="go on", generate=False, store=False, previous_response_id=head))
            event = until_terminal(ws)
            assert event["type"] == "response.completed", event
        spent.append(time.perf_counter() - start)
        rebuilds += 1
    spent.sort()
    print(json.dumps({"rebuilds": rebuilds, "median_ms": spent[len(spent) // 2] * 1e3}))


def median_ms(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[len(ordered) // 2] * 1e3


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 6.0
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
    with ServerProcess.start(SERVER_FLAGS, env={**os.environ, **SERVER_ENV}) as server:
        base = f"http://127.0.0.1:{server.port}"
        head = store_chain(base, tokens)
        quiet = Victim(base)
        end = time.monotonic() + seconds
        quiet.run(lambda: time.monotonic() < end)
        attacker = subprocess.Popen(
            [sys.executable, __file__, "--attack", base, head, str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        attacked = Victim(base)
        attacked.run(lambda: attacker.poll() is None)
        out, _ = attacker.communicate(timeout=GUARD)
        report = json.loads(out.strip().splitlines()[-1])
    row = {
        "victim_quiet_p50_ms": round(median_ms(quiet.latencies), 1),
        "victim_attacked_p50_ms": round(median_ms(attacked.latencies), 1),
        "ratio": round(median_ms(attacked.latencies) / median_ms(quiet.latencies), 2),
        "victim_turns": len(attacked.latencies),
        "rebuilds": report["rebuilds"],
        "rebuild_median_ms": round(report["median_ms"], 1),
    }
    print(json.dumps(row))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--attack":
        attack(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        main()
