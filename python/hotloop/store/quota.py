"""What each API key holds in the store, and the bound on it (a storage quota).

A key's usage is the bytes and rows of what it keeps as the database holds them: per
stored response its row (the Response JSON without its shared tool list, and the input
items as sent) and one row per input item in wire form (`records.Row.usage`); its
conversations (`conversations.py`) and its background responses' rows and kept events
(`background.py`). Shared tool lists count for nobody. The usage is read from the store
when it opens (`records.USAGE_QUERY`, so it survives restarts), grows with each write
(`Store.counted` for the tables outside `responses`) and shrinks with each delete.

A request that would store one more response for a key at or past either bound is
refused before it runs (`refusal`); the response that crosses a bound is stored.
Responses stored with auth off have no owner and no bound (one tenant).

On several nodes sharing one PostgreSQL, each node counts the usage it read at start
plus what it committed and deleted since: a key writing through several nodes at once
is bounded per node until they restart.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Usage:
    """Bytes and rows of one key's (or one response's) stored data."""

    bytes: int = 0
    rows: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.bytes + other.bytes, self.rows + other.rows)

    def __sub__(self, other: Usage) -> Usage:
        return Usage(self.bytes - other.bytes, self.rows - other.rows)


def owned_usage(table: str, size: str, children: str, child_size: str, parent: str) -> str:
    """The part of `records.USAGE_QUERY` for a table of rows owned by keys and the rows
    they hold in another: (owner, bytes, 1) per `table` row (its `size` column) and per
    `children` row (its `child_size` column; `parent` names its `table` row's id)."""
    return f"""
    UNION ALL
    SELECT owner, length({size}), 1 FROM {table} WHERE owner IS NOT NULL
    UNION ALL
    SELECT p.owner, length(c.{child_size}), 1
    FROM {children} AS c JOIN {table} AS p ON p.id = c.{parent}
    WHERE p.owner IS NOT NULL
"""


class StorageQuota:
    """Every key's usage and the bounds (per key, bytes and rows)."""

    def __init__(self, max_bytes: int, max_rows: int, usage: dict[str, Usage]) -> None:
        self.max_bytes = max_bytes
        self.max_rows = max_rows
        self._usage = usage

    def of(self, owner: str | None) -> Usage:
        return Usage() if owner is None else self._usage.get(owner, Usage())

    def stored(self, owner: str | None, usage: Usage) -> None:
        if owner is not None:
            self._usage[owner] = self.of(owner) + usage

    def deleted(self, owner: str | None, usage: Usage) -> None:
        if owner is None:
            return
        left = self.of(owner) - usage
        if left.bytes > 0 or left.rows > 0:
            self._usage[owner] = left
        else:
            self._usage.pop(owner, None)

    def refusal(self, owner: str | None) -> str | None:
        """Why `owner` may store nothing more (None: it may)."""
        used = self.of(owner)
        if used.bytes >= self.max_bytes or used.rows >= self.max_rows:
            return (
                f"This API key stores {used.bytes} bytes in {used.rows} rows (limit "
                f"{self.max_bytes} bytes, {self.max_rows} rows): delete stored responses "
                "(DELETE /v1/responses/{id}) or send store=false."
            )
        return None


__all__ = ["StorageQuota", "Usage", "owned_usage"]
