"""Queued bytes held after refused steered continuations (issue 21 defect 6), against
`hotloop serve --engine sim` (its sim calls a tool on every turn) in its own process, at
the default queue bounds: SOCKETS sockets of one key each get a response that stopped
for tool output, steer it once (the steer stays queued for the continuation), then send
REFUSALS continuations of 10,000 tool outputs (about 1 MB) that the steer takes past the
core's 10,000-item limit. Prints what each refusal said, and the server's
`hotloop_queued_request_bytes` with the sockets idle and open: the steers' bytes only,
or every refused continuation's too.

    .venv/bin/python benches/bench_steer_refusal_leak.py [SOCKETS [REFUSALS]]
"""

from __future__ import annotations

import json
import sys
from typing import Any

import httpx
import orjson
from hotloop.lab.proc import ServerProcess
from websockets.sync.client import ClientConnection, connect

KEY = "sk-leak"
FLAGS = [
    *("--engine", "sim", "--api-keys", KEY),
    *("--sim-tool", "exec_command", "--sim-tool-calls", "1000"),
]
GUARD = 60.0
MIB = 1024 * 1024


def send(ws: ClientConnection, **event: Any) -> None:
    ws.send(orjson.dumps(event).decode())


def waiting_with_a_steer(ws: ClientConnection) -> tuple[str, str]:
    """A response that stopped for tool output, steered once: (its id, the call id)."""
    send(ws, type="response.create", model="sim", input="list the files")
    while (event := orjson.loads(ws.recv(GUARD)))["type"] != "response.completed":
        pass
    response = event["response"]
    call = next(item for item in response["output"] if item["type"] == "function_call")
    send(ws, type="response.steer", previous_response_id=response["id"], input="only .py")
    while orjson.loads(ws.recv(GUARD))["type"] != "response.steer.pending":
        pass
    return response["id"], call["call_id"]


def queued_bytes(base: str) -> int:
    for line in httpx.get(base + "/metrics", timeout=GUARD).text.splitlines():
        if line.startswith("hotloop_queued_request_bytes "):
            return int(float(line.split()[-1]))
    raise RuntimeError("no hotloop_queued_request_bytes")


def main() -> None:
    sockets = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    refusals = int(sys.argv[2]) if len(sys.argv) > 2 else 80
    codes: dict[str, int] = {}
    with ServerProcess.start(FLAGS) as server:
        base = f"http://127.0.0.1:{server.port}"
        headers = {"authorization": f"Bearer {KEY}"}
        opened = [connect(server.ws_url, additional_headers=headers) for _ in range(sockets)]
        for ws in opened:
            target, call_id = waiting_with_a_steer(ws)
            output = {"type": "function_call_output", "call_id": call_id, "output": "x" * 90}
            frame = orjson.dumps(
                {
                    "type": "response.create",
                    "model": "sim",
                    "previous_response_id": target,
                    "input": [output] * 10_000,
                }
            ).decode()
            for _ in range(refusals):
                ws.send(frame)
                code = orjson.loads(ws.recv(GUARD))["error"]["code"]
                codes[code] = codes.get(code, 0) + 1
        held = queued_bytes(base)
        for ws in opened:
            ws.close()
    print(json.dumps({"sockets": sockets, "refusals": codes, "queued_mib": round(held / MIB, 1)}))


if __name__ == "__main__":
    main()
