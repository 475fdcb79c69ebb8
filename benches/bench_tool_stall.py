"""One tenant's huge tool list against another tenant's turns (issue 15, item 5).

Against `hotloop serve --engine sim` in its own process: a victim runs short turns over
one WebSocket while, on another, an attacker sends a ~13.5 MB tool list (250 function
tools of 600 properties) back to back. Reported: the victim's median and worst turn
time without the attack and during it (one run, the same server), and how long the
attacker waits for each answer. Before the fix the list was parsed and rendered on the
event loop (about 1.2 s of stall each); now it is parsed in a worker thread and refused
there by its size (`array_above_max_bytes`), before any tool is looked at.

    .venv/bin/python benches/bench_tool_stall.py [--turns 40]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

import orjson
from hotloop.lab.proc import ServerProcess
from websockets.sync.client import ClientConnection, connect

TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}


def huge_tool_frame(tools: int = 250, properties: int = 600) -> str:
    def tool(t: int) -> dict[str, Any]:
        props = {
            f"argument_{i}": {"type": "string", "description": f"argument {i} of tool {t}"}
            for i in range(properties)
        }
        return {
            "type": "function",
            "name": f"tool_{t}",
            "parameters": {"type": "object", "properties": props, "required": list(props)},
        }

    body = {"type": "response.create", "model": "sim", "store": False, "input": "hi"}
    return orjson.dumps({**body, "tools": [tool(t) for t in range(tools)]}).decode()


def turn(ws: ClientConnection, frame: str) -> tuple[float, str]:
    """Send `frame`, read to its terminal event: seconds taken and the terminal type."""
    start = time.perf_counter()
    ws.send(frame)
    while (event := orjson.loads(ws.recv(timeout=120)))["type"] not in TERMINAL:
        pass
    kind = event["type"] if event["type"] != "error" else event["error"]["code"]
    return time.perf_counter() - start, kind


def victim_turns(url: str, turns: int) -> list[float]:
    frame = orjson.dumps(
        {"type": "response.create", "model": "sim", "store": False, "input": "hi"}
    ).decode()
    with connect(url) as ws:
        turn(ws, frame)  # the first turn renders the format's prefix
        return [turn(ws, frame)[0] for _ in range(turns)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=40)
    args = parser.parse_args()
    huge = huge_tool_frame()
    print(f"attacker frame: {len(huge) / 1e6:.1f} MB")
    flags = ["--engine", "sim", "--sim-tokens-per-second", "100000"]
    with ServerProcess.start(flags) as server, connect(server.ws_url, max_size=None) as attacker:
        quiet = victim_turns(server.ws_url, args.turns)
        stop = threading.Event()
        answered = threading.Event()
        answers: list[tuple[float, str]] = []

        def attack() -> None:
            while not stop.is_set():
                answers.append(turn(attacker, huge))
                answered.set()

        thread = threading.Thread(target=attack)
        thread.start()
        answered.wait()  # the attack is under way once its first answer came back
        attacked = victim_turns(server.ws_url, args.turns)
        stop.set()
        thread.join()
    for name, times in (("quiet", quiet), ("under attack", attacked)):
        median, worst = statistics.median(times) * 1e3, max(times) * 1e3
        print(f"victim turn, {name}: median {median:.1f} ms, worst {worst:.1f} ms")
    waits = [seconds for seconds, _ in answers]
    print(
        f"attacker: {len(answers)} frames answered ({answers[0][1]}), "
        f"median {statistics.median(waits) * 1e3:.0f} ms each"
    )


if __name__ == "__main__":
    main()
