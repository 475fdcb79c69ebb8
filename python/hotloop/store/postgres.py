"""PostgreSQL behind the store: the shared system of record for several hotloop nodes.

Blocking code (psycopg 3), called from the store's threads (`writer.py`): writes from
its one writer thread, reads from a few reader threads, all through one connection pool.
A batch of responses is one committed transaction. The schema is created and migrated
on start in versioned steps (`hotloop_schema`), under an advisory lock so that nodes
starting together migrate once. Every read names the owner in its query (`_OWNED`), and
a chain is loaded in one round trip (a recursive CTE).

The tables are those of the SQLite store (`sqlite.py` describes them); rows come from
`records.py`, so both backends store exactly the same bytes.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from hotloop.store import background_tables
from hotloop.store.conversations import POSTGRES_TABLES
from hotloop.store.interface import InputItemPage, Order, StoredResponse, StoreError, may_read
from hotloop.store.quota import Usage
from hotloop.store.records import (
    FREED_QUERY,
    QUARANTINE_COLUMNS,
    RESPONSE_COLUMNS,
    USAGE_QUERY,
    ItemRows,
    Rejected,
    Row,
    joined,
    page,
)
from hotloop.store.sql import Sql, Work, named
from hotloop.store.sqlite import chain_record

try:
    import psycopg
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise StoreError(
        "store_unavailable",
        "a postgresql:// store needs psycopg 3: pip install 'hotloop[postgres]'",
    ) from e

T = TypeVar("T")

READERS = 4
# Session options for each of `hotloop.store.DURABILITIES`: `power-loss` keeps the
# server's own setting (on, or what its operator chose for replicas).
SYNCHRONOUS_COMMIT = {"power-loss": "", "process-crash": " -c synchronous_commit=off"}
"""Reader threads (and pooled connections beside the two writers')."""

# Version N is reached by running MIGRATIONS[N - 1].
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE responses (
            id text PRIMARY KEY,
            owner text,
            previous_response_id text,
            created_at bigint NOT NULL,
            response bytea NOT NULL,
            tools_hash text,
            tools_at integer,
            input_items bytea NOT NULL,
            output_token_ids bytea NOT NULL,
            fingerprint text NOT NULL DEFAULT ''
        )""",
        "CREATE INDEX responses_by_tools ON responses (tools_hash) WHERE tools_hash IS NOT NULL",
        "CREATE TABLE tool_lists (hash text PRIMARY KEY, tools bytea NOT NULL)",
        """CREATE TABLE input_items (
            response_id text NOT NULL,
            position integer NOT NULL,
            id text NOT NULL,
            item bytea NOT NULL,
            PRIMARY KEY (response_id, position)
        )""",
        "CREATE INDEX input_items_by_id ON input_items (response_id, id)",
        """CREATE TABLE quarantine (
            seq bigserial PRIMARY KEY,
            response_id text NOT NULL,
            owner text,
            reason text NOT NULL,
            quarantined_at bigint NOT NULL,
            response bytea NOT NULL,
            input_items bytea NOT NULL,
            output_token_ids bytea NOT NULL
        )""",
        "CREATE TABLE probe (id integer PRIMARY KEY, at bigint NOT NULL)",
    ),
    (
        "ALTER TABLE responses ADD COLUMN model_turns bytea",
        "ALTER TABLE quarantine ADD COLUMN model_turns bytea",
    ),
    POSTGRES_TABLES,
    (
        """CREATE TABLE background (
            id text PRIMARY KEY,
            owner text,
            process text NOT NULL,
            status text NOT NULL,
            streamed integer NOT NULL,
            response bytea NOT NULL,
            updated_at bigint NOT NULL,
            cancel_requested integer NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX background_live ON background (process) "
        "WHERE status IN ('queued', 'in_progress')",
        """CREATE TABLE background_events (
            response_id text NOT NULL,
            seq integer NOT NULL,
            event bytea NOT NULL,
            PRIMARY KEY (response_id, seq)
        )""",
        "CREATE TABLE background_processes (process text PRIMARY KEY, seen_at bigint NOT NULL)",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)

# pg_advisory_xact_lock key: "hotloop" in ASCII.
_MIGRATION_LOCK = 0x686F746C6F6F70

# Owner None is the single tenant with auth off (sees everything); a key sees its own.
_OWNED = "(%(owner)s::text IS NULL OR {table}.owner = %(owner)s)"

_CHAIN = f"""
WITH RECURSIVE chain (id, previous_response_id, depth) AS (
    SELECT id, previous_response_id, 0 FROM responses r
    WHERE id = %(id)s AND {_OWNED.format(table="r")}
    UNION ALL
    SELECT r.id, r.previous_response_id, chain.depth + 1
    FROM responses AS r JOIN chain ON r.id = chain.previous_response_id
    WHERE {_OWNED.format(table="r")}
)
SELECT r.id, r.owner, r.previous_response_id, r.created_at, r.response, r.tools_at, t.tools,
       r.input_items, r.output_token_ids, r.fingerprint, r.model_turns
FROM chain JOIN responses AS r ON r.id = chain.id
LEFT JOIN tool_lists AS t ON t.hash = r.tools_hash
ORDER BY chain.depth
"""


def _text(value: str) -> bool:
    """Whether a client-given id can be a text value at all: no stored id holds a NUL,
    and PostgreSQL refuses one in a query instead of finding nothing."""
    return "\x00" not in value


def redacted(url: str) -> str:
    """`url` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@contextmanager
def _severed_after(connection: psycopg.Connection[Any], seconds: float) -> Iterator[None]:
    """Break `connection` if what runs inside takes longer than `seconds`: a stopped
    server (SIGSTOP, a hung host's process) leaves its kernel acknowledging every byte,
    so neither the server's timeouts nor TCP's fire, and a blocking call would wait for
    as long as the server is stopped. Shutting the socket down wakes that call with an
    error; the pool then discards the connection. A COMMIT already sent may still be
    carried out when the server resumes: the response was failed, never acknowledged."""
    guard = threading.Lock()
    armed = True

    def sever() -> None:
        with guard:
            if not armed:
                return
            try:
                # A duplicate of the descriptor: shutting it down shuts the socket down,
                # and closing it never frees the number the connection still holds.
                with socket.socket(fileno=os.dup(connection.fileno())) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except (OSError, psycopg.Error):
                pass  # already closed: the blocked call has its error

    timer = threading.Timer(seconds, sever)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with guard:
            armed = False
        timer.cancel()


def _hold_tool_lists(cursor: psycopg.Cursor[Any], tools: dict[str, bytes]) -> None:
    """Make sure every list of `tools` (hash: JSON) is in `tool_lists` and stays there
    until this transaction ends: each row is locked FOR KEY SHARE, which a deleter's
    FOR UPDATE waits for (`delete`) and other writers do not. A list a deleter removed
    between the insert (a no-op: the row was there) and the lock is inserted again."""
    missing = dict(tools)
    while missing:
        cursor.executemany(
            "INSERT INTO tool_lists (hash, tools) VALUES (%s, %s) ON CONFLICT (hash) DO NOTHING",
            list(missing.items()),
        )
        cursor.execute(
            "SELECT hash FROM tool_lists WHERE hash = ANY(%s) FOR KEY SHARE", (list(missing),)
        )
        for (held,) in cursor.fetchall():
            del missing[held]


class PostgresDatabase:
    """A pool of connections to one PostgreSQL database."""

    readers = READERS
    writers = 2
    """Large responses' rows and the item rows written ahead of them have a thread and
    a connection of their own (`writer.py`): a light key's commit never waits for a
    heavy key's piece."""

    def __init__(
        self, url: str, *, busy_timeout: float = 5.0, durability: str = "power-loss"
    ) -> None:
        """Connect (waiting up to `busy_timeout` seconds), then create or migrate the
        schema. Raises StoreError naming the server when it cannot. `durability`
        `process-crash`: the server acknowledges a commit before its WAL is flushed
        (`synchronous_commit=off`), so hotloop dying loses nothing, the database server
        crashing may lose the last commits."""
        self._where = redacted(url)
        self._timeout = busy_timeout
        milliseconds = int(busy_timeout * 1000)
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=READERS + 2,
            timeout=busy_timeout,
            # A connection broken by a server restart is replaced, not handed out.
            check=self._check,
            kwargs={
                "autocommit": True,
                "connect_timeout": max(1, round(busy_timeout)),
                # A commit that waits on another session's lock, or a statement the
                # server is slow to run, fails in time.
                "options": f"-c lock_timeout={milliseconds} -c statement_timeout={milliseconds}"
                + SYNCHRONOUS_COMMIT[durability],
                # A host or network that went away (nothing acknowledges what is sent,
                # an idle pooled connection gets no keepalive answer) breaks the
                # connection in time. A hung server on a live host acknowledges all of
                # it: `_severed_after` covers that.
                "tcp_user_timeout": milliseconds,
                "keepalives": 1,
                "keepalives_idle": max(1, round(busy_timeout)),
                "keepalives_interval": 1,
                "keepalives_count": 3,
            },
            open=False,
        )
        try:
            self._pool.open(wait=True, timeout=busy_timeout)
            self._migrate()
        except (psycopg.Error, PoolTimeout) as e:
            self._pool.close()
            raise StoreError(
                "store_unavailable",
                f"cannot use the PostgreSQL store {self._where}: {e}; check --store (host, "
                "port, database, user) and that the server is up.",
            ) from e
        except BaseException:
            self._pool.close()
            raise

    def _check(self, connection: psycopg.Connection[Any]) -> None:
        with _severed_after(connection, self._timeout):
            ConnectionPool.check_connection(connection)

    @contextmanager
    def _connection(self, action: str) -> Iterator[psycopg.Connection[Any]]:
        try:
            with (
                self._pool.connection() as connection,
                _severed_after(connection, self._timeout),
            ):
                yield connection
        except (psycopg.Error, PoolTimeout) as e:
            raise StoreError(
                "store_unavailable", f"PostgreSQL {action} at {self._where} failed: {e}"
            ) from e

    @contextmanager
    def _transaction(self, action: str) -> Iterator[psycopg.Cursor[Any]]:
        with self._connection(action) as connection, connection.transaction():
            yield connection.cursor()

    def _migrate(self) -> None:
        with self._transaction("migrating the schema") as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            cursor.execute("CREATE TABLE IF NOT EXISTS hotloop_schema (version integer NOT NULL)")
            cursor.execute("SELECT version FROM hotloop_schema")
            row = cursor.fetchone()
            version = 0 if row is None else int(row[0])
            if version > SCHEMA_VERSION:
                raise StoreError(
                    "store_damaged",
                    f"the PostgreSQL store {self._where} has schema version {version}, newer "
                    f"than this hotloop knows ({SCHEMA_VERSION}): run a newer hotloop.",
                )
            for number in range(version + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[number - 1]:
                    cursor.execute(statement)
            if row is None:
                cursor.execute("INSERT INTO hotloop_schema VALUES (%s)", (SCHEMA_VERSION,))
            else:
                cursor.execute("UPDATE hotloop_schema SET version = %s", (SCHEMA_VERSION,))

    def probe(self) -> None:
        with self._transaction("write") as cursor:
            cursor.execute(
                "INSERT INTO probe (id, at) VALUES (1, %s)"
                " ON CONFLICT (id) DO UPDATE SET at = excluded.at",
                (int(time.time()),),
            )

    def write(self, rows: Sequence[Row], rejected: Rejected, items: ItemRows = ()) -> None:
        """Commit `rows` and `items`, and quarantine `rejected`, in one transaction."""
        with self._transaction("write") as cursor:
            self._insert(cursor, rows, rejected, items)

    def write_bulk(self, rows: Sequence[Row], rejected: Rejected, items: ItemRows = ()) -> None:
        """`write` on the bulk lane's connection, concurrently with `write` on another.
        Item rows alone are committed without waiting for the WAL flush
        (`synchronous_commit` off for the transaction): the WAL is one sequence, so the
        flush their response's own commit waits for, which follows, covers them too; a
        crash before then leaves at most some of them, unreferenced."""
        with self._transaction("write") as cursor:
            if not rows and not rejected:
                cursor.execute("SET LOCAL synchronous_commit = off")
            self._insert(cursor, rows, rejected, items)

    @staticmethod
    def _insert(
        cursor: psycopg.Cursor[Any], rows: Sequence[Row], rejected: Rejected, items: ItemRows
    ) -> None:
        tools = {r.tools.hash: r.tools.tools for r in rows if r.tools is not None}
        if tools:
            _hold_tool_lists(cursor, tools)
        if rows:
            cursor.executemany(
                f"INSERT INTO responses ({RESPONSE_COLUMNS})"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (id) DO UPDATE SET owner = excluded.owner,"
                " previous_response_id = excluded.previous_response_id,"
                " created_at = excluded.created_at, response = excluded.response,"
                " tools_hash = excluded.tools_hash, tools_at = excluded.tools_at,"
                " input_items = excluded.input_items,"
                " output_token_ids = excluded.output_token_ids,"
                " fingerprint = excluded.fingerprint, model_turns = excluded.model_turns",
                [r.values() for r in rows],
            )
        # One statement for every item row of the batch: `executemany` is a round
        # trip and a Python adaptation per row, each a wait for the GIL while other
        # threads (the preparing thread, the readers) hold it.
        latest = {(row[0], row[1]): row for row in items}
        latest.update(((r.id, item[0]), (r.id, *item)) for r in rows for item in r.items)
        if latest:
            response_ids, positions, ids, listed = zip(*latest.values(), strict=True)
            cursor.execute(
                "INSERT INTO input_items (response_id, position, id, item)"
                " SELECT * FROM unnest(%s::text[], %s::integer[], %s::text[], %s::bytea[])"
                " ON CONFLICT (response_id, position)"
                " DO UPDATE SET id = excluded.id, item = excluded.item",
                (list(response_ids), list(positions), list(ids), list(listed)),
            )
        if rejected:
            cursor.executemany(
                f"INSERT INTO quarantine ({QUARANTINE_COLUMNS})"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                [q.values() for q in rejected],
            )

    def get(self, response_id: str, owner: str | None) -> bytes | None:
        if not _text(response_id):
            return None
        with self._connection("read") as connection:
            row = connection.execute(
                "SELECT r.response, r.tools_at, t.tools FROM responses AS r"
                " LEFT JOIN tool_lists AS t ON t.hash = r.tools_hash"
                f" WHERE r.id = %(id)s AND {_OWNED.format(table='r')}",
                {"id": response_id, "owner": owner},
            ).fetchone()
        if row is None:
            return None
        return joined(bytes(row[0]), row[1], None if row[2] is None else bytes(row[2]))

    def usage(self) -> dict[str, Usage]:
        with self._connection("read") as connection:
            rows = connection.execute(USAGE_QUERY).fetchall()
        return {owner: Usage(int(size), int(count)) for owner, size, count in rows}

    def delete(self, response_id: str, owner: str | None) -> tuple[str | None, Usage] | None:
        if not _text(response_id):
            return None
        with self._transaction("delete") as cursor:
            cursor.execute(FREED_QUERY.format(id="%(id)s"), {"id": response_id})
            freed = cursor.fetchone()
            if freed is not None and not may_read(freed[0], owner):
                return None
            # A background response's row and events go with it; alone (its process
            # stopped before it finished), they are deleted as the response.
            sql = Sql(cursor, named)
            kept = background_tables.deleted(sql, response_id, owner, stored=freed is not None)
            cursor.execute(
                "DELETE FROM responses AS r"
                f" WHERE r.id = %(id)s AND {_OWNED.format(table='r')} RETURNING r.tools_hash",
                {"id": response_id, "owner": owner},
            )
            row = cursor.fetchone()
            if row is None or freed is None:
                return kept
            cursor.execute("DELETE FROM input_items WHERE response_id = %s", (response_id,))
            if row[0] is not None:
                # First the lock: it waits for every writer holding the list (their
                # responses commit or roll back meanwhile). Then, in a statement of its
                # own (a fresh snapshot in READ COMMITTED, which sees those commits),
                # the list goes only if nothing references it. One DELETE with the
                # NOT EXISTS would wait on the lock but re-check it against its old
                # snapshot, and delete a list a just-committed response points at.
                cursor.execute("SELECT 1 FROM tool_lists WHERE hash = %s FOR UPDATE", (row[0],))
                cursor.execute(
                    "DELETE FROM tool_lists WHERE hash = %(h)s AND NOT EXISTS"
                    " (SELECT 1 FROM responses WHERE tools_hash = %(h)s)",
                    {"h": row[0]},
                )
            usage = Usage(int(freed[1]), int(freed[2]))
            return freed[0], usage if kept is None else usage + kept[1]

    def list_input_items(
        self,
        response_id: str,
        owner: str | None,
        *,
        order: Order,
        limit: int,
        after: str | None,
    ) -> InputItemPage | None:
        ascending = order == "asc"
        if not _text(response_id):
            return None
        with self._connection("read") as connection:
            found = connection.execute(
                f"SELECT 1 FROM responses AS r WHERE r.id = %(id)s AND {_OWNED.format(table='r')}",
                {"id": response_id, "owner": owner},
            ).fetchone()
            if found is None:
                return None
            bound: int = -1 if ascending else 2**31 - 1
            if after is not None:
                position = (
                    None
                    if not _text(after)
                    else connection.execute(
                        "SELECT position FROM input_items WHERE response_id = %s AND id = %s",
                        (response_id, after),
                    ).fetchone()
                )
                if position is None:
                    return InputItemPage(items=[], has_more=False)
                bound = position[0]
            rows = connection.execute(
                "SELECT id, item FROM input_items WHERE response_id = %s AND position "
                + ("> %s ORDER BY position ASC" if ascending else "< %s ORDER BY position DESC")
                + " LIMIT %s",
                (response_id, bound, limit + 1),
            ).fetchall()
        return page([(r[0], bytes(r[1])) for r in rows], limit)

    def chain(self, response_id: str, owner: str | None) -> list[StoredResponse]:
        if not _text(response_id):
            return []
        with self._connection("read") as connection:
            rows = connection.execute(_CHAIN, {"id": response_id, "owner": owner}).fetchall()
        return [chain_record(tuple(row)) for row in rows]

    def transact(self, work: Work[T]) -> T:
        with self._transaction("write") as cursor:
            return work(Sql(cursor, named))

    def query(self, work: Work[T]) -> T:
        with self._connection("read") as connection:
            return work(Sql(connection.cursor(), named))

    def close(self) -> None:
        self._pool.close()


__all__ = ["SCHEMA_VERSION", "PostgresDatabase", "redacted"]
