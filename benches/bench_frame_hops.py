"""Frame to engine call for a 32-64 KB continuation frame over a real WebSocket: parsed
in one worker thread and rendered in another (before: the parse's offload began at
`OFFLOAD_BYTES`) against parsed on the event loop and rendered in a worker thread
(after: it begins at `PARSE_OFFLOAD_BYTES`), rounds interleaved in one run:

    .venv/bin/python benches/bench_frame_hops.py [--rounds 7] [--turns 10] [--kb 48]

The server runs in this process (uvicorn in a thread, the protocols `hotloop serve`
runs, the sim engine), so the time is taken from the client's send to the engine's
`generate` call on one clock. Each turn continues the last (`previous_response_id`)
with a user message of `--kb` KB (a tool output's size). Reported: the median and
90th percentile microseconds of each mode, the medians' ratio, the load average; then
one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import orjson
import uvicorn
from hotloop._core import ChatFormat
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimEngine, SimSession, SimSpeed
from hotloop.lab.threaded import serving
from hotloop.protocol import parsing
from hotloop.protocol.parsing import OFFLOAD_BYTES, PARSE_OFFLOAD_BYTES
from hotloop.transport import App, frames
from hotloop.transport.admission import AdmittingHttpProtocol
from hotloop.transport.frames import FrameSendingProtocol
from websockets.sync.client import connect

PARSE_FROM = {"before": OFFLOAD_BYTES, "after": PARSE_OFFLOAD_BYTES}
"""Where each mode's parse leaves the event loop."""
ENDS = ("response.completed", "response.incomplete", "error")
LINE = "line of a long file, as read by the agent\n"


def parse_from(size: int) -> None:
    parsing.PARSE_OFFLOAD_BYTES = size
    frames.PARSE_OFFLOAD_BYTES = size  # type: ignore[attr-defined]


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    args.add_argument("--rounds", type=int, default=7)
    args.add_argument("--turns", type=int, default=10)
    args.add_argument("--kb", type=int, default=48)
    options = args.parse_args()
    size = options.kb * 1024
    assert OFFLOAD_BYTES <= size < PARSE_OFFLOAD_BYTES, "a frame between the two bounds"

    called: list[int] = []
    generate = SimSession.generate

    def timed(self: SimSession, *a: Any, **k: Any) -> Any:
        called.append(time.perf_counter_ns())
        return generate(self, *a, **k)

    SimSession.generate = timed  # type: ignore[method-assign]
    engine = SimEngine(ChatFormat.harmony(), model="sim", speed=SimSpeed(1e6, ttft=0.0))
    app = App.from_config(ServerConfig(engine="sim"), engine)
    config = uvicorn.Config(
        app, loop="uvloop", ws=FrameSendingProtocol, http=AdmittingHttpProtocol, log_level="warning"
    )
    times: dict[str, list[float]] = {mode: [] for mode in PARSE_FROM}
    with serving(config) as port:
        url = f"ws://127.0.0.1:{port}/v1/responses"
        for _ in range(options.rounds):
            for mode, bound in PARSE_FROM.items():
                parse_from(bound)
                with connect(url, max_size=None) as ws:
                    previous = None
                    for turn in range(options.turns):
                        output = f"turn {turn}\n" + LINE * (size // len(LINE))
                        event = {
                            "type": "response.create",
                            "model": "sim",
                            "max_output_tokens": 16,
                            "previous_response_id": previous,
                            "input": [{"role": "user", "content": output}],
                        }
                        frame = orjson.dumps(event).decode()
                        called.clear()
                        start = time.perf_counter_ns()
                        ws.send(frame)
                        while True:
                            reply = orjson.loads(ws.recv(60))
                            if reply["type"] in (
                                "response.completed",
                                "response.incomplete",
                                "error",
                            ):
                                break
                        assert reply["type"] != "error", reply
                        previous = reply["response"]["id"]
                        times[mode].append((called[0] - start) / 1000)
        parse_from(PARSE_OFFLOAD_BYTES)
    medians = {mode: statistics.median(values) for mode, values in times.items()}
    p90s = {mode: statistics.quantiles(values, n=10)[-1] for mode, values in times.items()}
    load = os.getloadavg()[0]
    for mode, median in medians.items():
        print(
            f"{mode}: frame to engine call {median:.0f} us median, {p90s[mode]:.0f} us p90"
            f" ({len(times[mode])} turns)"
        )
    ratio = medians["before"] / medians["after"]
    print(f"before / after: {ratio:.2f}x, load average {load:.1f}")
    print(
        json.dumps(
            {"kb": options.kb, "median_us": medians, "p90_us": p90s, "ratio": ratio, "load": load}
        )
    )


if __name__ == "__main__":
    main()
