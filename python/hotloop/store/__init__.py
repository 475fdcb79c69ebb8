"""Durable responses: what `store=true` keeps, committed before the terminal event.

This package owns the `Store` interface the protocol and HTTP layers call, the records
it holds, and how a stored chain is replayed into a fresh `Conversation` when the
rendered-token cache misses. It never decides what goes on the wire; `store=false`
responses never reach it.

- `StoredResponse`: one finished response, as it was sent, plus its input items, the
  output segment's token ids and the fingerprint of the format that rendered them.
- `Store`: the async interface (put = a durable commit, get, delete, list input items,
  load a chain, health, close).
- `open_store(target)`: SQLite in a data directory (the embedded default) or PostgreSQL
  (`postgresql://...`), each behind one group-committing writer (`writer.py`); what a
  record becomes in the database is `records.py`.

The records and the interface are defined in `interface.py` (which the backends
import; this package imports them only inside `open_store`) and exported here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hotloop.store.interface import (
    COMMIT_WINDOW,
    DURABILITIES,
    PAGE_CHUNK_BYTES,
    Chain,
    InputItemPage,
    ModelTurn,
    Order,
    Store,
    StoredResponse,
    StoreError,
    format_fingerprint,
    may_read,
)

if TYPE_CHECKING:
    from hotloop.metrics import Metrics

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


async def open_store(
    target: str | Path,
    *,
    metrics: Metrics | None = None,
    commit_window: float = COMMIT_WINDOW,
    busy_timeout: float = 5.0,
    durability: str = "power-loss",
    cache: str | None = None,
    quota_bytes: int = 2**62,
    quota_rows: int = 2**62,
) -> Store:
    """The store at `target`: a PostgreSQL URL (`postgresql://...`), or a data directory
    holding `responses.sqlite3` (created if missing). One writer commits in groups:
    after the first put it waits up to `commit_window` seconds for more, and a commit
    is as durable as `durability` says (`DURABILITIES`). A commit that
    finds the database locked retries for up to `busy_timeout` seconds, and a commit,
    read or delete the database has not answered within it fails. Each API key may
    store up to `quota_bytes` and `quota_rows` (`quota.py`). `cache`: a
    `redis://` URL of a read cache in front (`redis_cache.py`).

    Raises StoreError `store_damaged` / `store_unavailable` with a message naming the
    database and what to do when it cannot be opened as a sound, writable store."""
    from hotloop.store.writer import BackgroundStore, Database

    connect: Callable[[], Database]
    if isinstance(target, str) and target.startswith(POSTGRES_SCHEMES):
        from hotloop.store.postgres import PostgresDatabase

        url = target
        connect = lambda: PostgresDatabase(  # noqa: E731
            url, busy_timeout=busy_timeout, durability=durability
        )
    else:
        from hotloop.store.sqlite import SQLiteDatabase

        path = Path(target)
        connect = lambda: SQLiteDatabase.in_directory(  # noqa: E731
            path, busy_timeout=busy_timeout, durability=durability
        )
    store: Store = await BackgroundStore.open(
        connect,
        metrics=metrics,
        commit_window=commit_window,
        deadline=busy_timeout,
        quota_bytes=quota_bytes,
        quota_rows=quota_rows,
    )
    if cache is not None:
        from hotloop.store.redis_cache import CachedStore

        store = CachedStore(store, cache)
    return store


__all__ = [
    "COMMIT_WINDOW",
    "DURABILITIES",
    "PAGE_CHUNK_BYTES",
    "Chain",
    "InputItemPage",
    "ModelTurn",
    "Order",
    "Store",
    "StoreError",
    "StoredResponse",
    "format_fingerprint",
    "may_read",
    "open_store",
]
