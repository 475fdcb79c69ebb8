"""Server time per HTTP turn, from a request to the engine call, with and without
`previous_response_id`, against a real `hotloop serve --engine sim` process on loopback:

    .venv/bin/python benches/bench_http_turn.py [--turns 40] [--user-bytes 2048]

One conversation of `--turns` user turns of about 2 KB each, sent twice:

- `previous_response_id` (`store: true`): each request carries only the new user message
  and continues the stored response from the server's cache;
- full history (`store: false`): each request carries every earlier item again, as a
  stateless client sends it.

The server's own figure is read from its `/metrics` after every turn (one at a time):
the growth of `hotloop_turn_overhead_seconds_sum{transport="http"}` is that turn's time
from receiving the request to the first engine call. Printed: the median over all turns
and over the last 10 of each mode, their ratio, and a JSON line (`make figures` keeps it
in benches/results/http_turn.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import httpx
from bench_ws_turn import text
from hotloop.lab.proc import ServerProcess

OVERHEAD = 'hotloop_turn_overhead_seconds_sum{transport="http"}'
FLAGS = ["--engine", "sim", "--sim-ttft", "0", "--sim-tokens-per-second", "100000"]


def overhead_sum(client: httpx.Client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(OVERHEAD):
            return float(line.split()[-1])
    return 0.0


def conversation(client: httpx.Client, turns: int, size: int, previous: bool) -> list[float]:
    """Milliseconds of server time before the engine call, per turn."""
    history: list[dict[str, Any]] = []
    last_id: str | None = None
    times = []
    for n in range(turns):
        message = {"type": "message", "role": "user", "content": text(size, n * 31)}
        body: dict[str, Any] = {"model": "sim", "max_output_tokens": 16}
        if previous:
            body |= {"model": "sim", "input": [message], "store": True}
            if last_id is not None:
                body["previous_response_id"] = last_id
        else:
            body |= {"model": "sim", "input": [*history, message], "store": False}
        before = overhead_sum(client)
        reply = client.post("/v1/responses", json=body)
        reply.raise_for_status()
        times.append((overhead_sum(client) - before) * 1e3)
        response = reply.json()
        last_id = response["id"]
        said = "".join(
            part["text"]
            for item in response["output"]
            if item["type"] == "message"
            for part in item["content"]
        )
        history += [message, {"type": "message", "role": "assistant", "content": said}]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--user-bytes", type=int, default=2048)
    args = parser.parse_args()
    with ServerProcess.start(FLAGS) as server:
        base = f"http://127.0.0.1:{server.port}"
        with httpx.Client(base_url=base, timeout=60) as client:
            runs = {
                mode: conversation(client, args.turns, args.user_bytes, mode == "previous")
                for mode in ("previous", "full")
            }
    figures: dict[str, float] = {}
    for mode, times in runs.items():
        whole, last = statistics.median(times), statistics.median(times[-10:])
        figures |= {f"{mode}_p50_ms": whole, f"{mode}_last10_p50_ms": last}
        print(
            f"{mode:>8}: server time before the engine call, median {whole:.3f} ms, "
            f"last 10 turns {last:.3f} ms"
        )
    ratio = figures["full_last10_p50_ms"] / figures["previous_last10_p50_ms"]
    figures["full_over_previous_last10"] = ratio
    print(f"full history / previous_response_id, last 10 turns: {ratio:.1f}x")
    print(json.dumps({"turns": args.turns, "user_bytes": args.user_bytes, **figures, "runs": runs}))


if __name__ == "__main__":
    main()
