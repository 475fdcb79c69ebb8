"""What each API key holds in the store, and the bound on it (a storage quota).

A key's usage is the bytes and rows of its stored responses as the database holds them:
per response its row (the Response JSON without its shared tool list, and the input
items as sent) and one row per input item in wire form (`records.Row.usage`). Shared
tool lists count for nobody. The usage is read from the store when it opens (so it
survives restarts), grows with each committed response and shrinks with each delete.

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


__all__ = ["StorageQuota", "Usage"]
