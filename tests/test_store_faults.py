"""Faults against the real server (`hotloop serve --engine sim`, a subprocess on
loopback), bounded in count and time: nothing a client was told is complete is ever
lost, and a store that cannot commit fails responses instead of acknowledging them.

- SIGKILL 0-50 ms after clients saw `response.completed` for 200 `store=true` responses
  over HTTP (JSON and SSE) and WebSocket: after a restart all of them are readable.
- Another process holds the SQLite lock until a response fails: commits retry for the
  busy timeout, then fail the response (`store_unavailable`), never acknowledge it;
  `/health` is 503 until a write commits.
- A full disk (a small tmpfs): responses fail until space returns, then it recovers.
- PostgreSQL stopped mid-run: the same, and service recovers when it returns.
- A tenant's record the store cannot read back (issue 15 item 1) costs another tenant
  nothing: all of its acknowledged responses are stored.
- A damaged database at startup: a clear message and a non-zero exit, no traceback.
"""

from __future__ import annotations

import random
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hotloop_process import HANG_GUARD, HotloopProcess, acknowledged, http_turn, ws_turn
from missing import cannot_set_up
from pg_server import PostgresServer, started_server
from websockets.exceptions import WebSocketException
from websockets.sync.client import connect

FAST = ["--engine=sim", "--sim-ttft", "0", "--sim-tokens-per-second", "5000", "--log-level", "info"]
TARGET = 200


def unreadable(server: HotloopProcess, ids: list[str], key: str | None = None) -> list[str]:
    headers = {} if key is None else {"authorization": f"Bearer {key}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=HANG_GUARD) as client:
        return [rid for rid in ids if client.get(f"/v1/responses/{rid}").status_code != 200]


class Load:
    """Clients sending `store=true` responses until told to stop or the server dies;
    `acked` holds every id a client saw completed."""

    def __init__(self, server: HotloopProcess, target: int) -> None:
        self.server = server
        self.target = target
        self.acked: list[str] = []
        self.reached = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(kind,), daemon=True)
            for kind in ("ws", "ws", "ws", "http", "sse")
        ]
        for thread in self._threads:
            thread.start()

    def _saw(self, event: dict[str, Any]) -> None:
        rid = acknowledged(event)
        if rid is not None:
            with self._lock:
                self.acked.append(rid)
                if len(self.acked) >= self.target:
                    self.reached.set()

    def _run(self, kind: str) -> None:
        try:
            if kind == "ws":
                with connect(self.server.ws_url, open_timeout=HANG_GUARD) as socket:
                    for n in range(10 * self.target):
                        self._saw(ws_turn(socket, f"turn {n}"))
            else:
                with httpx.Client(base_url=self.server.url, timeout=HANG_GUARD) as client:
                    for n in range(10 * self.target):
                        self._saw(http_turn(client, f"turn {n}", stream=kind == "sse"))
        except (OSError, ValueError, httpx.HTTPError, WebSocketException):
            # The server was killed under this client: what it saw so far is the record.
            return

    def join(self) -> None:
        for thread in self._threads:
            thread.join(HANG_GUARD)


@pytest.mark.parametrize("run", range(3))
def test_sigkill_right_after_acknowledgement_loses_nothing(tmp_path: Path, run: int) -> None:
    args = [*FAST, "--data-dir", str(tmp_path)]
    with HotloopProcess(args) as server:
        load = Load(server, TARGET)
        assert load.reached.wait(HANG_GUARD)
        # The fault: 0-50 ms after the 200th acknowledgement, clients still sending.
        time.sleep(random.uniform(0, 0.05))
        server.kill()
        load.join()
    acked = list(load.acked)
    assert len(acked) >= TARGET
    with HotloopProcess(args) as restarted:
        assert unreadable(restarted, acked) == []


def turn_outcome(event: dict[str, Any]) -> str:
    """completed, or the stable code of a failure (a failed response's error says it
    first in its message: its `code` is the SDK's `server_error`)."""
    if event["type"] == "response.completed":
        return "completed"
    error = event.get("response", {}).get("error") or event.get("error") or {}
    message = str(error.get("message", ""))
    if message.startswith("store_unavailable:"):
        return "store_unavailable"
    return str(error.get("code"))


def health(server: HotloopProcess) -> int:
    return httpx.get(server.url + "/health", timeout=HANG_GUARD).status_code


def wait_healthy(server: HotloopProcess) -> None:
    """The store probes itself once a second after a failure: poll, bounded."""
    deadline = time.monotonic() + 60
    while health(server) != 200:
        assert time.monotonic() < deadline, "the store never recovered"
        time.sleep(0.2)


# Turns sent while the lock is held before the test gives up on seeing one fail: each
# waits out the busy timeout, so one is enough; the rest bound a broken run.
LOCKED_TURNS = 5


def test_a_database_locked_by_another_process_fails_responses_not_acknowledges_them(
    tmp_path: Path,
) -> None:
    """The lock is held until the event the test waits for (a response failed with
    `store_unavailable`), not for a time set against the busy timeout."""
    args = [*FAST, "--data-dir", str(tmp_path), "--store-busy-timeout", "1"]
    acked: list[str] = []
    with HotloopProcess(args) as server, connect(server.ws_url) as socket:
        first = ws_turn(socket, "before")
        acked.append(acknowledged(first) or "")
        locker = sqlite3.connect(tmp_path / "responses.sqlite3", isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        outcomes: list[str] = []
        for _ in range(LOCKED_TURNS):
            event = ws_turn(socket, "while locked")
            outcomes.append(turn_outcome(event))
            if outcomes[-1] == "store_unavailable":
                assert health(server) == 503
                break
            acked.append(acknowledged(event) or "")
        locker.execute("ROLLBACK")
        locker.close()
        # Retried for the busy timeout, then failed: never acknowledged. A turn may have
        # committed before the locker's transaction began writing.
        assert outcomes[-1] == "store_unavailable", outcomes
        assert set(outcomes) <= {"completed", "store_unavailable"}
        after = [ws_turn(socket, "after") for _ in range(3)]
        assert [turn_outcome(e) for e in after] == ["completed"] * 3
        acked += [acknowledged(e) or "" for e in after]
        wait_healthy(server)
    with HotloopProcess(args) as restarted:
        assert unreadable(restarted, acked) == []


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        cannot_set_up("a small tmpfs", made.stderr.decode().strip())
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Write zeros until the filesystem is full; the file that holds them."""
    filler = directory / "filler"
    # Unbuffered: a buffered file keeps what ENOSPC refused and raises it again on close.
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass  # ENOSPC: the point
    return filler


def test_a_full_disk_fails_responses_until_space_returns(small_filesystem: Path) -> None:
    args = [*FAST, "--data-dir", str(small_filesystem / "data")]
    acked: list[str] = []
    with HotloopProcess(args) as server, connect(server.ws_url) as socket:
        acked.append(acknowledged(ws_turn(socket, "before")) or "")
        filler = fill(small_filesystem)
        outcomes: list[str] = []
        big = "x" * 20000  # a few WAL pages per turn, so the full disk shows at once
        for _ in range(50):
            event = ws_turn(socket, big)
            outcomes.append(turn_outcome(event))
            if acknowledged(event):
                acked.append(acknowledged(event) or "")
            else:
                break
        assert outcomes[-1] == "store_unavailable", outcomes
        assert health(server) == 503
        filler.unlink()
        wait_healthy(server)
        after = ws_turn(socket, "after")
        assert turn_outcome(after) == "completed"
        acked.append(acknowledged(after) or "")
    with HotloopProcess(args) as restarted:
        assert unreadable(restarted, acked) == []


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of this test's own: it gets stopped midway."""
    yield from started_server()


def test_postgresql_stopped_mid_run(own_postgres: PostgresServer) -> None:
    args = [*FAST, "--store", own_postgres.fresh_database(), "--store-busy-timeout", "2"]
    acked: list[str] = []
    with HotloopProcess(args) as server, connect(server.ws_url) as socket:
        for n in range(5):
            acked.append(acknowledged(ws_turn(socket, f"before {n}")) or "")
        own_postgres.stop()
        down = [ws_turn(socket, "while down") for _ in range(3)]
        assert [turn_outcome(e) for e in down] == ["store_unavailable"] * 3
        assert health(server) == 503
        own_postgres.start()
        wait_healthy(server)
        for n in range(5):
            event = ws_turn(socket, f"after {n}")
            assert turn_outcome(event) == "completed"
            acked.append(acknowledged(event) or "")
        assert unreadable(server, acked) == []
    assert "" not in acked


def test_a_poisoned_tenant_costs_another_tenant_nothing(tmp_path: Path) -> None:
    """Issue 15 item 1: a value orjson cannot load in a pass-through field killed the
    writer, and no later response of any tenant was stored. Whether the core refuses
    the frame or the store quarantines the record, the poisoned response is never
    acknowledged and every one of the other tenant's is stored."""
    args = [*FAST, "--data-dir", str(tmp_path), "--api-keys", "sk-a,sk-b"]
    poisoned = (
        '{"type":"response.create","model":"sim","store":true,"input":[{"type":"message",'
        '"role":"user","content":"hi","zz":1e999}]}'
    )
    acked: list[str] = []
    with HotloopProcess(args) as server:
        with (
            connect(server.ws_url, additional_headers={"authorization": "Bearer sk-a"}) as a,
            connect(server.ws_url, additional_headers={"authorization": "Bearer sk-b"}) as b,
        ):
            for n in range(20):
                a.send(poisoned)
                event = ws_turn(b, f"turn {n}")
                acked.append(acknowledged(event) or "")
                while True:
                    seen = orjson.loads(a.recv(HANG_GUARD))
                    if seen["type"] in ("response.completed", "response.failed", "error"):
                        assert seen["type"] != "response.completed"
                        break
        assert "" not in acked
        assert unreadable(server, acked, "sk-b") == []
    with HotloopProcess(args) as restarted:
        assert unreadable(restarted, acked, "sk-b") == []


@pytest.mark.parametrize(
    "damage",
    [lambda path: path.write_bytes(b""), lambda path: path.write_bytes(b"garbage" * 2000)],
    ids=["truncated", "not_a_database"],
)
def test_the_server_refuses_a_damaged_database(
    tmp_path: Path, damage: Callable[[Path], Any]
) -> None:
    args = [*FAST, "--data-dir", str(tmp_path)]
    with HotloopProcess(args):
        pass
    damage(tmp_path / "responses.sqlite3")
    server = HotloopProcess(args)
    code = server.exit_code()
    log = "".join(server.log)
    assert code != 0
    assert str(tmp_path / "responses.sqlite3") in log
    assert "Traceback" not in log
