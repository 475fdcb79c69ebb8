"""A real PostgreSQL 15 server for the tests, started by the tests themselves.

`hotloop.lab.cluster.Postgres`: `initdb` + `pg_ctl` from Debian's `postgresql-15` (installed
by `make services` when missing) in a temporary directory, listening on a free loopback
port only, trust auth for the `postgres` superuser, as `nobody` when the tests run as
root (CI). The session-scoped fixture `postgres_server` (registered in `conftest.py`)
starts one server for the whole run; each test takes a database of its own
(`fresh_database`). Fault tests stop and start it (`stop`, `start`).
"""

from __future__ import annotations

from collections.abc import Iterator

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


__all__ = ["PostgresServer", "free_port", "postgres_server", "started_server"]
