"""Server CPU and wall time of one large request, sent back to back on one socket
against `hotloop serve --engine sim` (the abuse suite's server): a 13.5 MB tool list
(500 function tools, refused as longer than the context after rendering) and a 400 KB
history (one user message). Server CPU is the whole process's, read from its CPU
clock around each request. Prints medians, one line per request kind.

    .venv/bin/python benches/bench_large_requests.py
"""

from __future__ import annotations

import os
import statistics
import time

import orjson
from hotloop.lab.abuse import ATTACKER, SERVER_ENV, SERVER_FLAGS, auth, tool_tools
from hotloop.lab.proc import ServerProcess
from websockets.sync.client import connect

TERMINAL = ("error", "response.completed", "response.failed")


def frame(**fields: object) -> str:
    return orjson.dumps(
        {"type": "response.create", "model": "sim", "store": False, **fields}
    ).decode()


def main() -> None:
    os.environ.update(SERVER_ENV)
    requests = [
        ("tool list 13.5 MB", frame(input="hi", tools=tool_tools()), 5),
        ("history 400 KB", frame(input="line of history text " * 20000), 15),
    ]
    with (
        ServerProcess.start(SERVER_FLAGS) as server,
        connect(server.ws_url, additional_headers=auth(ATTACKER), max_size=None) as ws,
    ):
        for name, text, count in requests:
            cpu, wall = [], []
            for _ in range(count):
                start, cpu_start = time.perf_counter(), server.cpu_ns()
                ws.send(text)
                while orjson.loads(ws.recv(60))["type"] not in TERMINAL:
                    pass
                cpu.append((server.cpu_ns() - cpu_start) / 1e6)
                wall.append((time.perf_counter() - start) * 1e3)
            print(
                f"{name}: server CPU {statistics.median(cpu):.1f} ms, "
                f"wall {statistics.median(wall):.1f} ms (medians of {count})"
            )


if __name__ == "__main__":
    main()
