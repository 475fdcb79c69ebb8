"""The HTTP routes of stored responses: `GET` and `DELETE /v1/responses/{id}` and
`GET /v1/responses/{id}/input_items`; the pages' query parameters (`page_query`, which
`/v1/conversations` reads too) and the per-key slots that bound a key's store reads
(`KeyedSlots`).

A `GET` of a background response is its live status while it runs here, or its record
when it runs elsewhere; with `stream=true` it is that response's events from
`starting_after` (`background.py` resumes them). Everything is its owner's: another key,
like an unknown id, gets 404 `not_found`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import parse_qs

import orjson

from hotloop.ledger import Ledger
from hotloop.protocol.errors import ProtocolError
from hotloop.transport.asgi import Receive, Scope, Send
from hotloop.transport.background import BackgroundRoutes, BackgroundWork
from hotloop.transport.exchange import not_found, reply

MAX_PAGE = 100
"""Items one list request returns at most (OpenAI's bound)."""
PAGE_LIMIT = re.compile(r"[0-9]{1,4}")
STARTING_AFTER = re.compile(r"[0-9]{1,12}")

Query = dict[str, list[str]]


def query_of(scope: Scope) -> Query:
    """The request's query parameters."""
    return parse_qs(scope.get("query_string", b"").decode("latin-1"))


def query_value(query: Query, name: str) -> str | None:
    """A query parameter's first value."""
    values = query.get(name)
    return values[0] if values else None


def page_query(query: Query) -> tuple[bool, int, str | None]:
    """A list's page: (ascending, limit, after), from `order` (`desc` by default),
    `limit` (`1` to `MAX_PAGE`, `20` by default) and `after`. Raises ProtocolError."""
    order = query_value(query, "order") or "desc"
    if order not in ("asc", "desc"):
        raise ProtocolError("invalid_value", "order must be 'asc' or 'desc'.", "order")
    limit = query_value(query, "limit") or "20"
    # ASCII digits only, and few of them: `str.isdigit` accepts "²" (which `int`
    # refuses) and `int` refuses more than 4,300 digits.
    if not PAGE_LIMIT.fullmatch(limit) or not 1 <= int(limit) <= MAX_PAGE:
        raise ProtocolError(
            "invalid_value", f"limit must be an integer from 1 to {MAX_PAGE}.", "limit"
        )
    return order == "asc", int(limit), query_value(query, "after")


def starting_after(query: Query) -> int:
    """The sequence number a resumed stream starts after (-1: from its start)."""
    text = query_value(query, "starting_after")
    if text is None:
        return -1
    # ASCII digits, and few of them (see `page_query`).
    if not STARTING_AFTER.fullmatch(text):
        raise ProtocolError(
            "invalid_value",
            "starting_after must be a sequence number (an integer from 0).",
            "starting_after",
        )
    return int(text)


class KeyedSlots:
    """At most `per_key` holders at once per key (None, no auth, is one key); the
    others wait in order. A key's semaphore lives while someone holds or awaits it."""

    def __init__(self, per_key: int) -> None:
        self._per_key = max(1, per_key)
        self._slots: dict[str | None, tuple[asyncio.Semaphore, int]] = {}

    @contextlib.asynccontextmanager
    async def slot(self, key: str | None) -> AsyncIterator[None]:
        semaphore, users = self._slots.get(key) or (asyncio.Semaphore(self._per_key), 0)
        self._slots[key] = (semaphore, users + 1)
        try:
            async with semaphore:
                yield
        finally:
            semaphore, users = self._slots[key]
            if users == 1:
                del self._slots[key]
            else:
                self._slots[key] = (semaphore, users - 1)


@dataclass
class StoredRoutes:
    """Read and delete stored responses; `reads`: the keys' slots for store reads (one
    key's reads of 15 MB pages take a bounded share of the store's reader threads)."""

    ledger: Ledger
    background: BackgroundWork
    background_routes: BackgroundRoutes
    reads: KeyedSlots

    async def retrieve(
        self, scope: Scope, receive: Receive, send: Send, response_id: str, owner: str | None
    ) -> None:
        query = query_of(scope)
        if query_value(query, "stream") == "true":
            after = starting_after(query)
            await self.background_routes.resume(receive, send, response_id, owner, after)
            return
        job = self.background.live(response_id, owner)
        if job is not None:
            # A background response running here: its live status.
            await reply(send, 200, job.snapshot)
            return
        store = self.ledger.store
        found = None
        records = self.background.records
        if store is not None:
            async with self.reads.slot(owner):
                found = await store.get(response_id, owner)
                if found is None and records is not None:
                    # A background response running elsewhere, or whose process died.
                    record = await records.get(response_id, owner)
                    found = None if record is None else record.response
        if found is None:
            raise not_found(response_id)
        await reply(send, 200, found)

    async def delete(self, send: Send, response_id: str, owner: str | None) -> None:
        store = self.ledger.store
        if store is None or not await store.delete(response_id, owner):
            raise not_found(response_id)
        # A deleted response cannot be continued either: not over HTTP, nor on any
        # socket of its owner that holds it (the one that created it included).
        self.ledger.budget.evict_everywhere(response_id, owner)
        body = {"id": response_id, "object": "response", "deleted": True}
        await reply(send, 200, orjson.dumps(body))

    async def input_items(
        self, scope: Scope, send: Send, response_id: str, owner: str | None
    ) -> None:
        ascending, limit, after = page_query(query_of(scope))
        store = self.ledger.store
        if store is None:
            raise not_found(response_id)
        async with self.reads.slot(owner):
            page = await store.list_input_items(
                response_id, owner, order="asc" if ascending else "desc", limit=limit, after=after
            )
            if page is None:
                raise not_found(response_id)
            # Under the key's slot too: a page of 15 MB is as long to write as to read.
            await reply(send, 200, page.body())
