"""A real PostgreSQL 15 server for the tests, started by the tests themselves.

`hotloop.lab.cluster.Postgres`: `initdb` + `pg_ctl` from Debian's `postgresql-15` (installed
by `make services` when missing) in a temporary directory, listening on a free loopback
port only, trust auth for the `postgres` superuser, as `nobody` when the tests run as
root (CI). The session-scoped fixture `postgres_server` (registered in `conftest.py`)
starts one server for the whole run; each test takes a database of its own
(`fresh_database`). Fault tests stop and start it (`stop`, `start`). `store_settings`
(also registered) runs a test once per backend: the server settings of a fresh SQLite
directory, then of a fresh PostgreSQL database.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hotloop.lab.cluster import POSTGRES_BIN
from hotloop.lab.cluster import Postgres as PostgresServer
from hotloop.lab.proc import free_port
from missing import missing


def started_server() -> Iterator[PostgresServer]:
    """Start a server in a new temporary directory; stop and remove it afterwards."""
    if not PostgresServer.installed():
        missing(f"PostgreSQL 15 ({POSTGRES_BIN})", "make services")
    with PostgresServer.temporary() as server:
        yield server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    yield from started_server()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_settings(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """`ServerConfig`'s store settings of a fresh database of each backend."""
    if request.param == "sqlite":
        return {"data_dir": str(tmp_path)}
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return {"store": server.fresh_database()}


__all__ = ["PostgresServer", "free_port", "postgres_server", "started_server", "store_settings"]
