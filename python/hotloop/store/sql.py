"""One transaction's statements written once for both databases: queries use `:name`
parameters, which sqlite3 takes as they are and psycopg as `%(name)s` (`named`). The
conversation and background-response tables (`conversations.py`, `background.py`) run
their statements through `Sql`, in a transaction the store opens (`transact`) or a read
(`query`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

_PARAM = re.compile(r"(?<!:):(\w+)")


def named(query: str) -> str:
    """`query` with its `:name` parameters as psycopg's `%(name)s` (`::` casts stay)."""
    return _PARAM.sub(r"%(\1)s", query)


class Cursor(Protocol):
    """What sqlite3 connections and psycopg cursors both offer."""

    def execute(self, query: Any, params: Any = ...) -> Any: ...
    def executemany(self, query: Any, params_seq: Any) -> Any: ...


class Sql:
    """One transaction's statements, in `:name` style whatever the backend."""

    def __init__(self, cursor: Cursor, rewrite: Callable[[str], str] = str) -> None:
        self._cursor = cursor
        self._rewrite = rewrite

    def execute(self, query: str, params: Mapping[str, object] | None = None) -> Any:
        """The cursor after `query` (`fetchone`, `fetchall`): sqlite3's execute returns
        a new cursor, psycopg's the one it ran on."""
        return self._cursor.execute(self._rewrite(query), params or {})

    def rows(self, query: str, params: Mapping[str, object]) -> list[tuple[Any, ...]]:
        cursor = self.execute(query, params)
        if cursor.description is None:
            return []
        return list(cursor.fetchall())

    def many(self, query: str, params: Sequence[Mapping[str, object]]) -> None:
        if params:
            self._cursor.executemany(self._rewrite(query), params)


Work = Callable[[Sql], T]

__all__ = ["Sql", "Work", "named"]
