"""Issue 21 (minor): one tenant's concurrent large `input_items` reads against another
tenant's `GET`. One `hotloop serve --engine sim --api-keys sk-a,sk-b` process per
setting of `--max-reads-per-key` (1000: as good as no bound, the code before; 2: the
default); `sk-a` stored a response of 100 input items of 60 KB (a 6 MB page),
`sk-b` a small one. `sk-b` GETs its response back to back, quiet and then while
`sk-a` runs 16 concurrent readers of the 6 MB page (threads of a process of their own:
in the victim's process they held its GIL, and the figure measured the client); prints
`sk-b`'s medians and their ratio per setting as one JSON line.

    .venv/bin/python benches/bench_input_items_reads.py [SECONDS]
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import sys
import threading
import time
from multiprocessing.synchronize import Event

import httpx
from hotloop.lab.proc import ServerProcess

READERS = 16
ITEM = "x" * 60_000  # 100 of them: a 6 MB page (15 MB exceeds the sim's context window)


def store(client: httpx.Client, key: str, items: int, text: str) -> str:
    body = {
        "model": "sim",
        "input": [{"role": "user", "content": text} for _ in range(items)],
        "store": True,
        "max_output_tokens": 16,
    }
    reply = client.post("/v1/responses", json=body, headers={"authorization": f"Bearer {key}"})
    reply.raise_for_status()
    return str(reply.json()["id"])


def victim_median(base: str, response_id: str, seconds: float) -> float:
    latencies = []
    with httpx.Client(base_url=base, headers={"authorization": "Bearer sk-b"}) as client:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            client.get(f"/v1/responses/{response_id}").raise_for_status()
            latencies.append(time.perf_counter() - start)
    return statistics.median(latencies)


def attacker(base: str, response_id: str, stop: Event) -> None:
    with httpx.Client(base_url=base, headers={"authorization": "Bearer sk-a"}, timeout=120) as c:
        while not stop.is_set():
            c.get(f"/v1/responses/{response_id}/input_items", params={"limit": 100})


def attackers(base: str, response_id: str, started: Event, stop: Event) -> None:
    threads = [
        threading.Thread(target=attacker, args=(base, response_id, stop)) for _ in range(READERS)
    ]
    for thread in threads:
        thread.start()
    started.set()
    for thread in threads:
        thread.join()


def run(reads_per_key: int, seconds: float) -> dict[str, float]:
    flags = [
        "--engine=sim",
        "--api-keys=sk-a,sk-b",
        f"--max-reads-per-key={reads_per_key}",
        f"--max-frame-bytes={64 << 20}",
    ]
    with ServerProcess.start(flags) as server:
        base = f"http://127.0.0.1:{server.port}"
        with httpx.Client(base_url=base, timeout=300) as client:
            big = store(client, "sk-a", 100, ITEM)
            small = store(client, "sk-b", 1, "hi")
        quiet = victim_median(base, small, seconds)
        context = multiprocessing.get_context("spawn")
        started, stop = context.Event(), context.Event()
        process = context.Process(target=attackers, args=(base, big, started, stop))
        process.start()
        started.wait()
        attacked = victim_median(base, small, seconds)
        stop.set()
        process.join()
    return {
        "quiet_ms": round(quiet * 1e3, 2),
        "attacked_ms": round(attacked * 1e3, 2),
        "ratio": round(attacked / quiet, 1),
    }


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    rows = {f"max_reads_per_key={n}": run(n, seconds) for n in (1000, 2)}
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
