"""Before/after checks of issue 15 (items 3, 4 and 7) against `hotloop serve --engine
sim --api-keys sk-a,sk-b` on loopback, run by whichever hotloop is importable, so the
same script measures an older build:

    .venv/bin/python benches/bench_hardening.py
    git archive 8c2e08d python | tar -x -C /tmp/old
    cp python/hotloop/_core*.so /tmp/old/python/hotloop/
    PYTHONPATH=/tmp/old/python .venv/bin/python benches/bench_hardening.py

The server starts with a soft open-files limit of 1024 (a common default) and
`HOTLOOP_HEADER_TIMEOUT=2` (an older build ignores it); then 1,100 connections send
half a request each, a legitimate request follows, and the script counts the half-open
connections the server answered or closed within 4 s. Prints one JSON object.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import selectors
import socket
import time
from typing import Any

import httpx
import orjson
from hotloop.lab.proc import ServerProcess
from websockets.sync.client import connect
from websockets.sync.connection import Connection

AUTH = {"authorization": "Bearer sk-a"}
HALF_OPEN = 1100


def turn(ws: Connection, **body: Any) -> dict[str, Any]:
    ws.send(orjson.dumps({"type": "response.create", "model": "sim", **body}).decode())
    while True:
        event: dict[str, Any] = orjson.loads(ws.recv(30))
        if event["type"] in ("response.completed", "response.failed", "error"):
            return event


def post(base: str, **body: Any) -> httpx.Response:
    return httpx.post(base + "/v1/responses", json={"model": "sim", **body}, headers=AUTH)


def main() -> None:
    out: dict[str, Any] = {}
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))  # inherited
    os.environ["HOTLOOP_HEADER_TIMEOUT"] = "2"
    with ServerProcess.start(["--engine", "sim", "--api-keys", "sk-a,sk-b"]) as server:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this client's own
        base = f"http://127.0.0.1:{server.port}"
        ws_url = server.ws_url
        # Item 3: an HTTP response continued over a socket that then closes.
        parent = post(base, input="hi").json()["id"]
        with connect(ws_url, additional_headers=AUTH) as ws:
            turn(ws, input="x", previous_response_id=parent)
        out["3_http_continuations_after_the_socket_closed"] = [
            post(base, input="y", previous_response_id=parent).status_code for _ in range(2)
        ]
        # Item 3: two sockets continuing one stored response, one closes.
        parent = post(base, input="hi").json()["id"]
        try:
            with connect(ws_url, additional_headers=AUTH) as kept:
                with connect(ws_url, additional_headers=AUTH) as closing:
                    turn(closing, input="a", previous_response_id=parent)
                    turn(kept, input="b", previous_response_id=parent)
                result = turn(kept, input="c", previous_response_id=parent)["type"]
        except Exception as e:  # the old build drops the socket: report how
            result = f"{type(e).__name__}: {e}"[:80]
        out["3_the_other_socket_continues"] = result
        # Item 7: input_items limits, delete-then-continue, tenant labels.
        items = base + f"/v1/responses/{parent}/input_items?limit="
        out["7_limit_sup2"] = httpx.get(items + "%C2%B2", headers=AUTH).status_code
        out["7_limit_5000_digits"] = httpx.get(items + "9" * 5000, headers=AUTH).status_code
        with connect(ws_url, additional_headers=AUTH) as ws:
            created = turn(ws, input="keep", store=True)["response"]["id"]
            httpx.delete(base + f"/v1/responses/{created}", headers=AUTH)
            event = turn(ws, input="more", previous_response_id=created)
        out["7_continue_after_delete"] = (
            event["error"]["code"] if event["type"] == "error" else event["type"]
        )
        metrics = httpx.get(base + "/metrics").text
        out["7_metrics_label_is_sha256_of_key"] = (
            hashlib.sha256(b"sk-a").hexdigest()[:12] in metrics
        )
        # Item 4: half-open connections, then a legitimate request.
        held = []
        for _ in range(HALF_OPEN):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            held.append(sock)
        start = time.perf_counter()
        try:
            status = httpx.get(base + "/health", timeout=5).status_code
            out["4_legitimate_request"] = f"{status} in {time.perf_counter() - start:.2f} s"
        except httpx.HTTPError as e:
            out["4_legitimate_request"] = type(e).__name__
        # Within twice the header timeout, which of them did the server answer or close?
        watch = selectors.DefaultSelector()  # epoll: more than select's 1,024 fds
        for sock in held:
            watch.register(sock, selectors.EVENT_READ)
        closed = 0
        deadline = time.monotonic() + 4.0
        while closed < HALF_OPEN and time.monotonic() < deadline:
            for key, _ in watch.select(0.2):
                watch.unregister(key.fileobj)
                closed += 1
        watch.close()
        for sock in held:
            sock.close()
        out["4_half_open_closed_by_the_server"] = f"{closed}/{HALF_OPEN}"
        limits = open(f"/proc/{server.process.pid}/limits").read().splitlines()
        out["4_server_open_files_soft_hard"] = next(
            line.split()[3:5] for line in limits if line.startswith("Max open files")
        )
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
