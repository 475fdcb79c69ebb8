"""A real PostgreSQL 15 server for the tests, started by the tests themselves.

`initdb` + `pg_ctl` from Debian's `postgresql-15` (installed by `make services` when
missing) in a temporary directory, listening on a free loopback port only, trust auth
for the `postgres` superuser. `initdb` refuses to run as root, so as root (CI) the
server runs as the system user `nobody`. The session-scoped fixture `postgres_server`
(registered in `conftest.py`) starts one server for the whole run; each test takes a
database of its own (`fresh_database`). Fault tests stop and start it (`stop`, `start`).
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

BIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PostgresServer:
    """One initialized cluster; `start`/`stop` keep its port and data."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.data = root / "data"
        self.port = port
        self._user = "nobody" if os.geteuid() == 0 else None
        self._names = itertools.count()
        self._run(
            BIN / "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-instructions",
        )

    def _run(self, *args: str | Path) -> None:
        subprocess.run(
            [str(a) for a in args],
            check=True,
            user=self._user,
            cwd=self.root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=60,
        )

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            "-c max_connections=200 -c shared_buffers=32MB"
        )
        self._run(
            BIN / "pg_ctl", "-D", self.data, "-l", self.root / "log", "-o", options, "-w", "start"
        )

    def stop(self) -> None:
        self._run(BIN / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")

    def fresh_database(self) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return self.url(name)


def started_server() -> Iterator[PostgresServer]:
    """Start a server in a new temporary directory; stop and remove it afterwards."""
    if not (BIN / "initdb").exists():
        pytest.skip(f"PostgreSQL 15 is not installed ({BIN}): run `make services`")
    root = Path(tempfile.mkdtemp(prefix="hotloop-pg-"))
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.chown(root, nobody.pw_uid, nobody.pw_gid)
    server = PostgresServer(root, free_port())
    server.start()
    try:
        yield server
    finally:
        try:
            server.stop()
        except subprocess.CalledProcessError:
            pass  # already stopped by a fault test that failed midway
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    yield from started_server()


__all__ = ["PostgresServer", "free_port", "postgres_server", "started_server"]
