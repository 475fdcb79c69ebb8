"""The embedded SQLite database behind the default store.

Blocking code, called only from the store's one background thread (`writer.py`):
the event loop never touches it. One file in the data directory, WAL journal, so a
reader never waits for the writer. A batch of puts is one transaction.

Tables: `responses` (the Response JSON as sent, the input items as the client sent
them for replay, the sampled token ids) and `input_items` (one row per input item in
wire form, so listing a page reads only that page).
"""

from __future__ import annotations

import sqlite3
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import orjson

from hotloop.store import InputItemPage, Order, StoredResponse, StoreError
from hotloop.store.items import listed_items

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT,
    previous_response_id TEXT,
    created_at INTEGER NOT NULL,
    response BLOB NOT NULL,
    input_items BLOB NOT NULL,
    output_token_ids BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS input_items (
    response_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    id TEXT NOT NULL,
    item BLOB NOT NULL,
    PRIMARY KEY (response_id, position)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS input_items_by_id ON input_items (response_id, id);
"""

_COLUMNS = "id, owner, previous_response_id, created_at, response, input_items, output_token_ids"

# Newest first: the head of the chain, then its parent, up to the root or a gap.
_CHAIN = f"""
WITH RECURSIVE chain (id, previous_response_id, depth) AS (
    SELECT id, previous_response_id, 0 FROM responses WHERE id = ?
    UNION ALL
    SELECT r.id, r.previous_response_id, chain.depth + 1
    FROM responses AS r JOIN chain ON r.id = chain.previous_response_id
)
SELECT {", ".join("r." + c.strip() for c in _COLUMNS.split(","))}
FROM chain JOIN responses AS r ON r.id = chain.id ORDER BY chain.depth
"""

_PAGE_ASC = (
    "SELECT item FROM input_items WHERE response_id = ? AND position > ?"
    " ORDER BY position ASC LIMIT ?"
)
_PAGE_DESC = (
    "SELECT item FROM input_items WHERE response_id = ? AND position < ?"
    " ORDER BY position DESC LIMIT ?"
)

Row = tuple[str, str | None, str | None, int, bytes, bytes, bytes]


@contextmanager
def _failures(action: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as e:
        raise StoreError("store_unavailable", f"{action} failed: {e}") from e


def may_read(stored_owner: str | None, owner: str | None) -> bool:
    """A response stored under an API key is visible only to that key; with auth off
    (no owner on either side) everything is."""
    return stored_owner is None or owner is None or stored_owner == owner


class SQLiteDatabase:
    """The database file, opened on the store thread and used only from it."""

    def __init__(self, path: Path) -> None:
        try:
            self._db = sqlite3.connect(path, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a commit survives the process dying; only an OS crash or
            # power loss can take the last commits back.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as e:
            raise StoreError("store_unavailable", f"cannot open {path}: {e}") from e

    def write(self, batch: Sequence[StoredResponse]) -> None:
        """Commit a batch of finished responses in one transaction."""
        responses = [
            (
                r.id,
                r.owner,
                r.previous_response_id,
                r.created_at,
                r.response,
                r.input_items,
                array("I", r.output_token_ids).tobytes(),
            )
            for r in batch
        ]
        items = [
            (r.id, position, item["id"], orjson.dumps(item))
            for r in batch
            for position, item in enumerate(listed_items(r.id, r.input_items))
        ]
        with _failures("write"), self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                f"INSERT OR REPLACE INTO responses ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                responses,
            )
            self._db.executemany(
                "INSERT OR REPLACE INTO input_items (response_id, position, id, item)"
                " VALUES (?, ?, ?, ?)",
                items,
            )

    def get(self, response_id: str, owner: str | None) -> bytes | None:
        with _failures("read"):
            row = self._db.execute(
                "SELECT owner, response FROM responses WHERE id = ?", (response_id,)
            ).fetchone()
        if row is None or not may_read(row[0], owner):
            return None
        return bytes(row[1])

    def delete(self, response_id: str, owner: str | None) -> bool:
        with _failures("delete"), self._db:
            self._db.execute("BEGIN")
            row = self._db.execute(
                "SELECT owner FROM responses WHERE id = ?", (response_id,)
            ).fetchone()
            if row is None or not may_read(row[0], owner):
                return False
            self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
            self._db.execute("DELETE FROM input_items WHERE response_id = ?", (response_id,))
            return True

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
        with _failures("read"):
            row = self._db.execute(
                "SELECT owner FROM responses WHERE id = ?", (response_id,)
            ).fetchone()
            if row is None or not may_read(row[0], owner):
                return None
            bound: int = -1 if ascending else 2**62
            if after is not None:
                found = self._db.execute(
                    "SELECT position FROM input_items WHERE response_id = ? AND id = ?",
                    (response_id, after),
                ).fetchone()
                if found is None:
                    return InputItemPage(data=[], has_more=False)
                bound = found[0]
            rows = self._db.execute(
                _PAGE_ASC if ascending else _PAGE_DESC, (response_id, bound, limit + 1)
            ).fetchall()
        return InputItemPage(
            data=[orjson.loads(r[0]) for r in rows[:limit]], has_more=len(rows) > limit
        )

    def chain(self, response_id: str) -> list[StoredResponse]:
        """The stored responses from `response_id` back towards the root, newest first;
        stops early where an ancestor is missing (the caller checks)."""
        with _failures("read"):
            return [_record(row) for row in self._db.execute(_CHAIN, (response_id,))]

    def close(self) -> None:
        self._db.close()


def _record(row: Row) -> StoredResponse:
    ids = array("I")
    ids.frombytes(row[6])
    return StoredResponse(
        id=row[0],
        owner=row[1],
        previous_response_id=row[2],
        created_at=row[3],
        response=bytes(row[4]),
        input_items=bytes(row[5]),
        output_token_ids=ids.tolist(),
    )


__all__ = ["SQLiteDatabase", "may_read"]
