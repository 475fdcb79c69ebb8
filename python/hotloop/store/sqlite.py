"""The embedded SQLite database behind the default store.

Blocking code, called only from the store's one background thread (`writer.py`): the
event loop never touches it. One file in the data directory, WAL journal (a reader
never waits for the writer) with `synchronous=FULL`: every commit is fsync'd before the
writer reports it, so a response acknowledged after its commit survives the process
dying and the machine losing power. With durability `process-crash`, `synchronous=NORMAL`:
a commit is in the WAL in the operating system's cache when reported (the process
dying loses nothing; a power loss may lose the last commits, never the file's
consistency), without an fsync per commit. A batch of responses is one transaction.

Opening checks the file before serving from it (`in_directory`): a file truncated to
0 bytes, a corrupt page, a file or directory the server cannot read or write, or a
schema from a newer hotloop is a `StoreError` whose message names the file and what
to do; the schema is migrated in versioned steps (`PRAGMA user_version`).

Tables: `responses` (the Response JSON as sent with its tool list cut out, the input
items as the client sent them for replay, the output token ids and the format
fingerprint), `tool_lists` (each distinct tool list once, by hash), `input_items` (one
row per item in wire form, so listing a page reads only that page), `quarantine`
(records the store refused, raw, for an operator) and `probe` (one row the health
check rewrites).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from hotloop.store import background_tables
from hotloop.store.conversations import SQLITE_TABLES
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
    model_turns,
    page,
    token_ids,
)
from hotloop.store.sql import Sql, Work

FILE_NAME = "responses.sqlite3"
T = TypeVar("T")
# `PRAGMA synchronous` for each of `hotloop.store.DURABILITIES`.
SYNCHRONOUS = {"power-loss": "FULL", "process-crash": "NORMAL"}

# Version N is reached by running MIGRATIONS[N - 1]; PRAGMA user_version holds N.
# Version 1 is the schema of the first release (which set no user_version): its
# statements are idempotent, so a file from that release passes through step 1 as is.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE IF NOT EXISTS responses (
            id TEXT PRIMARY KEY,
            owner TEXT,
            previous_response_id TEXT,
            created_at INTEGER NOT NULL,
            response BLOB NOT NULL,
            input_items BLOB NOT NULL,
            output_token_ids BLOB NOT NULL
        )""",
        """CREATE TABLE IF NOT EXISTS input_items (
            response_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            id TEXT NOT NULL,
            item BLOB NOT NULL,
            PRIMARY KEY (response_id, position)
        ) WITHOUT ROWID""",
        "CREATE INDEX IF NOT EXISTS input_items_by_id ON input_items (response_id, id)",
    ),
    (
        "ALTER TABLE responses ADD COLUMN tools_hash TEXT",
        "ALTER TABLE responses ADD COLUMN tools_at INTEGER",
        "ALTER TABLE responses ADD COLUMN fingerprint TEXT NOT NULL DEFAULT ''",
        "CREATE INDEX responses_by_tools ON responses (tools_hash) WHERE tools_hash IS NOT NULL",
        "CREATE TABLE tool_lists (hash TEXT PRIMARY KEY, tools BLOB NOT NULL) WITHOUT ROWID",
        """CREATE TABLE quarantine (
            seq INTEGER PRIMARY KEY,
            response_id TEXT NOT NULL,
            owner TEXT,
            reason TEXT NOT NULL,
            quarantined_at INTEGER NOT NULL,
            response BLOB NOT NULL,
            input_items BLOB NOT NULL,
            output_token_ids BLOB NOT NULL
        )""",
        "CREATE TABLE probe (id INTEGER PRIMARY KEY, at INTEGER NOT NULL)",
    ),
    (
        "ALTER TABLE responses ADD COLUMN model_turns BLOB",
        "ALTER TABLE quarantine ADD COLUMN model_turns BLOB",
    ),
    SQLITE_TABLES,
    (
        """CREATE TABLE background (
            id TEXT PRIMARY KEY,
            owner TEXT,
            process TEXT NOT NULL,
            status TEXT NOT NULL,
            streamed INTEGER NOT NULL,
            response BLOB NOT NULL,
            updated_at INTEGER NOT NULL,
            cancel_requested INTEGER NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX background_live ON background (process) "
        "WHERE status IN ('queued', 'in_progress')",
        """CREATE TABLE background_events (
            response_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            event BLOB NOT NULL,
            PRIMARY KEY (response_id, seq)
        ) WITHOUT ROWID""",
        """CREATE TABLE background_processes (
            process TEXT PRIMARY KEY,
            seen_at INTEGER NOT NULL
        ) WITHOUT ROWID""",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)


_SELECT = (
    "r.id, r.owner, r.previous_response_id, r.created_at, r.response, r.tools_at, t.tools,"
    " r.input_items, r.output_token_ids, r.fingerprint, r.model_turns"
)

# Newest first: the head of the chain, then its parent, up to the root or a gap.
_CHAIN = f"""
WITH RECURSIVE chain (id, previous_response_id, depth) AS (
    SELECT id, previous_response_id, 0 FROM responses
    WHERE id = :id AND (:owner IS NULL OR owner = :owner)
    UNION ALL
    SELECT r.id, r.previous_response_id, chain.depth + 1
    FROM responses AS r JOIN chain ON r.id = chain.previous_response_id
    WHERE :owner IS NULL OR r.owner = :owner
)
SELECT {_SELECT}
FROM chain JOIN responses AS r ON r.id = chain.id
LEFT JOIN tool_lists AS t ON t.hash = r.tools_hash
ORDER BY chain.depth
"""

_PAGE_ASC = (
    "SELECT id, item FROM input_items WHERE response_id = ? AND position > ?"
    " ORDER BY position ASC LIMIT ?"
)
_PAGE_DESC = (
    "SELECT id, item FROM input_items WHERE response_id = ? AND position < ?"
    " ORDER BY position DESC LIMIT ?"
)

ChainRow = tuple[
    str,
    str | None,
    str | None,
    int,
    bytes,
    int | None,
    bytes | None,
    bytes,
    bytes,
    str,
    bytes | None,
]


@contextmanager
def _failures(action: str, path: Path) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as e:
        raise StoreError("store_unavailable", f"{action} {path} failed: {e}") from e


def _damaged(path: Path, problem: str) -> StoreError:
    return StoreError(
        "store_damaged",
        f"the response store {path} {problem}. hotloop will not serve from it, so that no "
        "stored response is silently lost: restore the file from a backup, or move it "
        "aside to start with an empty store (its responses are then no longer served).",
    )


def _unusable(path: Path, error: Exception) -> StoreError:
    return StoreError(
        "store_unavailable",
        f"cannot use the response store {path} ({error}): make the file and its directory "
        "readable and writable by the server's user, free disk space, or stop the process "
        "holding its lock.",
    )


class SQLiteDatabase:
    """The database file, opened on the store thread and used only from it."""

    readers = 4
    """Reads run on reader threads, each with a connection of its own (WAL lets them
    read while the store thread commits): on the store thread, one key's large
    `input_items` pages were a queue every other key's read waited in (a 1.3 ms GET
    took 5.5 ms behind 6 MB pages, `benches/bench_input_items_reads.py`)."""
    writers = 1
    """One connection writes, on the store thread (SQLite has one writer at a time)."""

    def __init__(
        self, path: Path, *, busy_timeout: float = 5.0, durability: str = "power-loss"
    ) -> None:
        """Open an existing or new database at `path` (`in_directory` adds the checks
        for a damaged file). A write waits up to `busy_timeout` seconds for another
        process's lock before it fails; `durability`: see the module's docstring."""
        self.path = path
        self._busy_timeout = busy_timeout
        self._synchronous = SYNCHRONOUS[durability]
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        try:
            self._db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
        except sqlite3.Error as e:
            raise _unusable(path, e) from e
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={self._synchronous}")
            self._migrate()
        except sqlite3.Error as e:
            self._db.close()
            if getattr(e, "sqlite_errorname", "") in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
                raise _damaged(path, f"is not a readable SQLite database ({e})") from e
            raise _unusable(path, e) from e
        except BaseException:
            self._db.close()
            raise

    @classmethod
    def in_directory(
        cls, directory: Path, *, busy_timeout: float = 5.0, durability: str = "power-loss"
    ) -> SQLiteDatabase:
        """`responses.sqlite3` in `directory`, created (with the directory) if missing,
        after checking that an existing file is whole and that the server can write."""
        path = directory / FILE_NAME
        try:
            directory.mkdir(parents=True, exist_ok=True)
            exists = path.exists()
            if exists and path.stat().st_size == 0:
                raise _damaged(path, "is empty (0 bytes): it was truncated")
            if exists and not os.access(path, os.R_OK):
                raise StoreError(
                    "store_unavailable",
                    f"cannot read the response store {path}: permission denied; give the "
                    "server's user read and write access to it.",
                )
        except OSError as e:
            raise StoreError(
                "store_unavailable",
                f"cannot use the data directory {directory}: {e.strerror or e}; check that it "
                "is a directory the server's user can read and write (--data-dir).",
            ) from e
        if not exists:
            cls._create(path, busy_timeout)
        database = cls(path, busy_timeout=busy_timeout, durability=durability)
        try:
            database._check()
            database.probe()
        except StoreError as e:
            database.close()
            if e.code == "store_damaged":
                raise
            raise _unusable(path, e) from e
        return database

    @classmethod
    def _create(cls, path: Path, busy_timeout: float) -> None:
        # Created aside and linked into place whole: a file at `path` always has a
        # schema, so an empty one can only be a damaged one. The link fails if another
        # process (a worker of `--workers N`) created it first: then that one is used.
        fresh = path.with_name(f"{path.name}.new-{os.getpid()}")
        try:
            cls(fresh, busy_timeout=busy_timeout).close()
            try:
                os.link(fresh, path)
            except FileExistsError:
                pass  # another worker's file won the race; it has the same schema
        except OSError as e:
            raise StoreError(
                "store_unavailable",
                f"cannot create the response store {path}: {e.strerror or e}; check that its "
                "directory is writable by the server's user and has free space.",
            ) from e
        finally:
            fresh.unlink(missing_ok=True)

    def _migrate(self) -> None:
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise _damaged(
                self.path,
                f"has schema version {version}, newer than this hotloop knows "
                f"({SCHEMA_VERSION}); run a newer hotloop",
            )
        for number in range(version + 1, SCHEMA_VERSION + 1):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for statement in MIGRATIONS[number - 1]:
                    self._db.execute(statement)
                # PRAGMA takes no parameters; `number` is an int from this module.
                self._db.execute(f"PRAGMA user_version = {number}")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _check(self) -> None:
        """Refuse a file with a corrupt page (reads every page once: about a second per
        GB at startup)."""
        try:
            problems = [row[0] for row in self._db.execute("PRAGMA quick_check(5)")]
        except sqlite3.DatabaseError as e:
            raise _damaged(self.path, f"is corrupt ({e})") from e
        if problems != ["ok"]:
            raise _damaged(self.path, f"is corrupt ({'; '.join(problems)})")

    @contextmanager
    def _transaction(self, action: str) -> Iterator[sqlite3.Connection]:
        db = self._db
        with _failures(action, self.path):
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                # A failed COMMIT (disk full) can leave the transaction open.
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def probe(self) -> None:
        """One small durable write: raises StoreError while the database cannot commit."""
        with self._transaction("write to") as db:
            db.execute("INSERT OR REPLACE INTO probe (id, at) VALUES (1, ?)", (int(time.time()),))

    def write(self, rows: Sequence[Row], rejected: Rejected, items: ItemRows = ()) -> None:
        """Commit `rows` and `items`, and quarantine `rejected`, in one fsync'd
        transaction."""
        with self._transaction("write to") as db:
            db.executemany(
                "INSERT OR IGNORE INTO tool_lists (hash, tools) VALUES (?, ?)",
                [(r.tools.hash, r.tools.tools) for r in rows if r.tools is not None],
            )
            db.executemany(
                f"INSERT OR REPLACE INTO responses ({RESPONSE_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [r.values() for r in rows],
            )
            db.executemany(
                "INSERT OR REPLACE INTO input_items (response_id, position, id, item)"
                " VALUES (?, ?, ?, ?)",
                [*items, *((r.id, *item) for r in rows for item in r.items)],
            )
            db.executemany(
                f"INSERT INTO quarantine ({QUARANTINE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [q.values() for q in rejected],
            )

    def write_bulk(
        self, rows: Sequence[Row], rejected: Rejected, items: ItemRows = ()
    ) -> Callable[[], None] | None:
        """Commit like `write` without the fsync (`synchronous=NORMAL` for the
        transaction: SQLite's one write lock is held for writing the frames only) and
        return the fsync of the WAL, which the writer runs on another thread, outside
        the lock, before it acknowledges the rows and before the next bulk piece (for
        chunks alone, unless a commit of rows under way, whose fsync covers them).
        Another key's commit thus never waits for a large piece's fsync, and its own
        fsync finds at most one piece's frames unsynced: left for it to flush, a flood's
        chunks made B's two-row commit 2.9 ms instead of 0.39 ms
        (`benches/bench_store_fairness.py`). Durability is unchanged: the WAL holds
        each commit whole, and on Linux an fsync writes out every dirty page of the
        file, whichever descriptor wrote it, so a row is on disk once that fsync (or a
        later `synchronous=FULL` commit's) returns, and so are its chunks' frames,
        written before it; NORMAL in WAL mode never corrupts the file (a crash loses at
        most commits not yet fsync'd, whose rows nobody was told were stored)."""
        if self._synchronous == "NORMAL":
            self.write(rows, rejected, items)
            return None
        db = self._db
        with _failures("write to", self.path):
            db.execute("PRAGMA synchronous=NORMAL")
        try:
            self.write(rows, rejected, items)
        finally:
            with _failures("write to", self.path):
                db.execute(f"PRAGMA synchronous={self._synchronous}")
        return self._sync_log

    def _sync_log(self) -> None:
        """fsync the WAL file (any thread: no SQLite connection involved)."""
        try:
            log = os.open(f"{self.path}-wal", os.O_RDONLY)
            try:
                os.fsync(log)
            finally:
                os.close(log)
        except OSError as e:
            raise StoreError(
                "store_unavailable", f"syncing {self.path}-wal failed: {e.strerror or e}"
            ) from e

    def _reader(self) -> sqlite3.Connection:
        """The calling thread's read connection, opened on its first read."""
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            # Closed by `close`, on the store thread.
            db = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
            with self._readers_lock:
                self._readers.append(db)
            self._local.db = db
        return db

    def get(self, response_id: str, owner: str | None) -> bytes | None:
        with _failures("reading", self.path):
            row = (
                self._reader()
                .execute(
                    "SELECT r.owner, r.response, r.tools_at, t.tools FROM responses AS r"
                    " LEFT JOIN tool_lists AS t ON t.hash = r.tools_hash WHERE r.id = ?",
                    (response_id,),
                )
                .fetchone()
            )
        if row is None or not may_read(row[0], owner):
            return None
        return joined(bytes(row[1]), row[2], None if row[3] is None else bytes(row[3]))

    def usage(self) -> dict[str, Usage]:
        with _failures("reading", self.path):
            rows = self._db.execute(USAGE_QUERY).fetchall()
        return {owner: Usage(int(size), int(count)) for owner, size, count in rows}

    def delete(self, response_id: str, owner: str | None) -> tuple[str | None, Usage] | None:
        with self._transaction("deleting from") as db:
            row = db.execute(FREED_QUERY.format(id="?"), (response_id,)).fetchone()
            if row is not None and not may_read(row[0], owner):
                return None
            # A background response's row and events go with it; alone (its process
            # stopped before it finished), they are deleted as the response.
            kept = background_tables.deleted(Sql(db), response_id, owner, stored=row is not None)
            if row is None:
                return kept
            db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
            db.execute("DELETE FROM input_items WHERE response_id = ?", (response_id,))
            if row[3] is not None:
                db.execute(
                    "DELETE FROM tool_lists WHERE hash = ?1 AND NOT EXISTS"
                    " (SELECT 1 FROM responses WHERE tools_hash = ?1)",
                    (row[3],),
                )
            freed = Usage(int(row[1]), int(row[2]))
            return row[0], freed if kept is None else freed + kept[1]

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
        with _failures("reading", self.path):
            db = self._reader()
            row = db.execute("SELECT owner FROM responses WHERE id = ?", (response_id,)).fetchone()
            if row is None or not may_read(row[0], owner):
                return None
            bound: int = -1 if ascending else 2**62
            if after is not None:
                found = db.execute(
                    "SELECT position FROM input_items WHERE response_id = ? AND id = ?",
                    (response_id, after),
                ).fetchone()
                if found is None:
                    return InputItemPage(items=[], has_more=False)
                bound = found[0]
            rows = db.execute(
                _PAGE_ASC if ascending else _PAGE_DESC, (response_id, bound, limit + 1)
            ).fetchall()
        return page([(r[0], bytes(r[1])) for r in rows], limit)

    def chain(self, response_id: str, owner: str | None) -> list[StoredResponse]:
        """The stored responses of `owner` from `response_id` back towards the root,
        newest first; stops early where an ancestor is missing (the caller checks)."""
        with _failures("reading", self.path):
            rows = self._reader().execute(_CHAIN, {"id": response_id, "owner": owner})
            return [chain_record(row) for row in rows]

    def transact(self, work: Work[T]) -> T:
        with self._transaction("writing to") as db:
            return work(Sql(db))

    def query(self, work: Work[T]) -> T:
        """`work`'s reads on this thread's reader, in one snapshot (a read transaction:
        a conversation's version and its items agree)."""
        with _failures("reading", self.path):
            db = self._reader()
            db.execute("BEGIN")
            try:
                return work(Sql(db))
            finally:
                db.execute("COMMIT")

    def close(self) -> None:
        for reader in self._readers:
            reader.close()
        self._db.close()


def chain_record(row: ChainRow) -> StoredResponse:
    """A `StoredResponse` from a row of the chain query (shared with PostgreSQL)."""
    return StoredResponse(
        id=row[0],
        owner=row[1],
        previous_response_id=row[2],
        created_at=row[3],
        response=joined(bytes(row[4]), row[5], None if row[6] is None else bytes(row[6])),
        input_items=bytes(row[7]),
        output_token_ids=token_ids(bytes(row[8])),
        fingerprint=row[9],
        model_turns=model_turns(None if row[10] is None else bytes(row[10])),
    )


__all__ = ["FILE_NAME", "SCHEMA_VERSION", "SQLiteDatabase", "chain_record"]
