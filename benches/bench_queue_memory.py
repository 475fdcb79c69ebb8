"""Server RSS per queued request byte: one socket starts a slow response, then queues
FRAMES `response.create` frames of FRAME_BYTES of input text (64 MiB in all, the
default per-connection queue); a last unknown-event frame's `error` reply proves every
frame before it was parsed and queued. Prints the server's RSS growth over the queued
bytes, for `hotloop serve --engine sim` in its own process.

    .venv/bin/python benches/bench_queue_memory.py [SOCKETS]
"""

from __future__ import annotations

import json
import os
import sys

import orjson
from hotloop.lab.proc import ServerProcess
from websockets.sync.client import connect

FRAMES = 16
FRAME_BYTES = 4 * 1024 * 1024 - 4096
FLAGS = [
    "--engine",
    "sim",
    "--api-keys",
    "sk-q",
    "--sim-tokens-per-second",
    "5",  # the first response holds its lane for the whole measurement
    "--sim-text",
    " ".join(["slow"] * 200),
]
# Only the per-connection queue bounds this measurement (environment variables, so
# that a build without the process-wide bounds runs it too, for before/after figures).
UNBOUNDED = {
    "HOTLOOP_MAX_QUEUED_BYTES_TOTAL": str(1 << 40),
    "HOTLOOP_MAX_QUEUED_BYTES_PER_KEY": str(1 << 40),
}


def main() -> None:
    os.environ.update(UNBOUNDED)
    sockets = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    frame = orjson.dumps(
        {"type": "response.create", "model": "sim", "store": False, "input": "q" * FRAME_BYTES}
    ).decode()
    with ServerProcess.start(FLAGS) as server:
        headers = {"authorization": "Bearer sk-q"}
        held = [connect(server.ws_url, additional_headers=headers) for _ in range(sockets)]
        for ws in held:
            ws.send(
                orjson.dumps({"type": "response.create", "model": "sim", "input": "hi"}).decode()
            )
            while orjson.loads(ws.recv(60))["type"] != "response.in_progress":
                pass
        before = server.rss_bytes()
        queued = 0
        for ws in held:
            for _ in range(FRAMES):
                ws.send(frame)
                queued += len(frame)
            ws.send('{"type": "response.nope"}')
            while (event := orjson.loads(ws.recv(120)))["type"] != "error":
                pass
            assert event["error"]["code"] == "unknown_event_type", event
        after = server.rss_bytes()
        for ws in held:
            ws.close()
    growth = after - before
    print(
        json.dumps(
            {
                "sockets": sockets,
                "queued_mib": round(queued / 2**20, 1),
                "rss_growth_mib": round(growth / 2**20, 1),
                "rss_per_queued_byte": round(growth / queued, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
