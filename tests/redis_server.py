"""A real `redis-server` for the read-cache tests, started by the tests themselves on a
free loopback port, with persistence off (Debian's `redis-server`, installed by
`make services` when missing). Session-scoped fixture `redis_server` (registered in
`conftest.py`); each test takes a database number of its own (`fresh_url`)."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from missing import missing
from pg_server import free_port


class RedisServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self._databases = itertools.count(1)
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                *("redis-server", "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.root)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        # It says when it listens; reading its log up to there needs no polling.
        for line in self.process.stdout:
            if "Ready to accept connections" in line:
                break
        else:
            raise RuntimeError(f"redis-server exited with {self.process.wait()}")
        threading.Thread(target=self.process.stdout.read, daemon=True).start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)

    def fresh_url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/{next(self._databases) % 16}"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        missing("redis-server", "make services")
    root = Path(tempfile.mkdtemp(prefix="hotloop-redis-"))
    server = RedisServer(root)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


__all__ = ["RedisServer", "redis_server"]
