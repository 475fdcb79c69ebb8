"""What `hotloop serve --log-level debug` must never write: Authorization headers
(API keys) and frame or body contents (user data), and what it must not flood: one
invalid-UTF-8 frame, which any client can send, costs at most one line, no traceback.
Against a real `hotloop serve` process, reading its log."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest
from servers import HANG_GUARD, served_process
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

SECRET = "sk-do-not-log-7f3a9c"
MARKER = "user-content-marker-51d0"


def test_debug_logs_carry_no_secret_no_content_no_traceback(tmp_path: Path) -> None:
    args = ["--api-keys", SECRET, "--data-dir", str(tmp_path), "--log-level", "debug"]
    auth = {"authorization": f"Bearer {SECRET}"}
    with served_process(args) as server:
        reply = httpx.post(
            server.url + "/v1/responses",
            json={"model": "sim", "input": MARKER},
            headers=auth,
            timeout=HANG_GUARD,
        )
        assert reply.status_code == 200
        ws_url = server.url.replace("http://", "ws://") + "/v1/responses"
        with connect(ws_url, additional_headers=auth) as ws:
            event = {"type": "response.create", "model": "sim", "input": MARKER}
            ws.send(orjson.dumps(event).decode())
            while orjson.loads(ws.recv(HANG_GUARD))["type"] != "response.completed":
                pass
        for _ in range(5):
            with connect(ws_url, additional_headers=auth) as ws:
                ws.send(b"\xff\xfe not utf-8", text=True)
                with pytest.raises(ConnectionClosed) as closed:
                    ws.recv(HANG_GUARD)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
        server.stop()
    log = "".join(server.log)
    assert SECRET not in log
    assert MARKER not in log
    assert "Traceback" not in log
    assert sum("UTF-8" in line for line in server.log) <= 5
