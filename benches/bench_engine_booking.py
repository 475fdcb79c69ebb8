"""Engine work booked per path (issue 21 defect 2): one `hotloop serve --engine sim`
process on loopback streaming 50 tokens a second; per path, a key of its own sends
REQUESTS requests of about 17,500 prompt tokens and leaves once tokens stream (WebSocket,
SSE: after the first delta; plain HTTP: after a fixed wait, nothing streams back), and
a fourth key asks `/v1/responses/compact` 2 x REQUESTS times. Prints, per key, what
`GET /v1/usage` booked and the server's `hotloop_turns_total`.

    .venv/bin/python benches/bench_engine_booking.py [REQUESTS]
"""

from __future__ import annotations

import json
import socket
import sys
import time

import httpx
import orjson
from hotloop.lab.proc import ServerProcess
from websockets.sync.client import connect

KEYS = {"websocket": "sk-ws", "sse": "sk-sse", "http": "sk-http", "compact": "sk-cmp"}
FLAGS = [
    "--engine",
    "sim",
    "--api-keys",
    ",".join(KEYS.values()),
    "--sim-text",
    " ".join(f"word{i}" for i in range(500)),
    "--sim-tokens-per-second",
    "50",
    "--sim-ttft",
    "0",
]
GUARD = 60.0
PROMPT = " ".join(f"w{i % 997}" for i in range(8_700))


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def websocket(base: str) -> None:
    url = base.replace("http://", "ws://") + "/v1/responses"
    with connect(url, additional_headers=auth(KEYS["websocket"]), max_size=None) as ws:
        ws.send(orjson.dumps({"type": "response.create", "model": "sim", "input": PROMPT}).decode())
        while "response.output_text.delta" not in str(ws.recv(GUARD)):
            pass


def sse(base: str) -> None:
    body = {"model": "sim", "input": PROMPT, "stream": True}
    with httpx.stream(
        "POST", base + "/v1/responses", json=body, headers=auth(KEYS["sse"]), timeout=GUARD
    ) as reply:
        for line in reply.iter_lines():
            if "response.output_text.delta" in line:
                break


def plain(base: str) -> None:
    body = orjson.dumps({"model": "sim", "input": PROMPT})
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as client:
        client.sendall(
            b"POST /v1/responses HTTP/1.1\r\nhost: hotloop\r\ncontent-type: application/json\r\n"
            + f"authorization: Bearer {KEYS['http']}\r\n".encode()
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        time.sleep(0.5)  # the prompt is prefilled and tokens stream meanwhile


def compact(base: str) -> None:
    reply = httpx.post(
        base + "/v1/responses/compact",
        json={"model": "sim", "input": PROMPT},
        headers=auth(KEYS["compact"]),
        timeout=GUARD,
    )
    assert reply.status_code == 200, reply.text


def booked(base: str, expected: dict[str, int]) -> dict[str, dict[str, int]]:
    """Per path, what `GET /v1/usage` booked for its key, once every key has booked the
    responses it sent (the last disconnects reach the server after the client has gone:
    asked again until then), or, for code that books nothing, what it has after GUARD."""
    deadline = time.monotonic() + GUARD
    while True:
        usage = {
            path: httpx.get(base + "/v1/usage", headers=auth(KEYS[path]), timeout=GUARD).json()
            for path in KEYS
        }
        done = all(usage[path]["responses"] >= n for path, n in expected.items())
        if done or time.monotonic() > deadline:
            fields = ("responses", "input_tokens", "output_tokens")
            return {path: {k: usage[path][k] for k in fields} for path in KEYS}
        time.sleep(0.05)


def main() -> None:
    requests = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    with ServerProcess.start(FLAGS) as server:
        base = f"http://127.0.0.1:{server.port}"
        prompt = httpx.post(
            base + "/v1/responses/input_tokens",
            json={"model": "sim", "input": PROMPT},
            headers=auth(KEYS["http"]),
            timeout=GUARD,
        ).json()["input_tokens"]
        for _ in range(requests):
            websocket(base)
            sse(base)
            plain(base)
            compact(base)
            compact(base)
        row: dict[str, object] = {"prompt_tokens": prompt, "requests": requests}
        row.update(booked(base, {path: requests for path in KEYS} | {"compact": 2 * requests}))
        row["turns"] = [
            line
            for line in httpx.get(base + "/metrics", timeout=GUARD).text.splitlines()
            if line.startswith("hotloop_turns_total{")
        ]
    print(json.dumps(row))


if __name__ == "__main__":
    main()
