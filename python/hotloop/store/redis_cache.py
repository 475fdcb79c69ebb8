"""An optional read cache (Redis or Valkey, `--store-cache redis://...`) in front of the
store, never the system of record.

`CachedStore` wraps a `Store`: puts commit to the store first, and only a committed
response is copied to the cache (in the background: the copy never delays a terminal
event, and a cache that is down only costs hits). Reads try the cache, then the store.
A cached record carries its owner (reads check it as the store does) and the ids of its
ancestors, so a chain is read with one `MGET`; any gap falls back to the store's
one-query chain, whose records are then cached. Entries expire after `ttl` seconds.

A delete first replaces the entry with a tombstone, then deletes from the store; a
response is never copied over an entry that exists (`SET NX`: a record never changes),
so no read racing the delete can put it back. When the tombstone cannot be written (the
cache is down), the delete is refused (`store_unavailable`, nothing deleted): deleting
from the store alone would leave the response served and continuable from the cache.

A hung or unreachable cache costs each call at most `SOCKET_TIMEOUT`; after a failure
the cache is skipped for `COOL_DOWN` seconds (a circuit breaker: reads go straight to
the store, copies are dropped, deletes are refused), then tried again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import astuple
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from hotloop.store.interface import (
    Chain,
    InputItemPage,
    ModelTurn,
    Order,
    Store,
    StoredResponse,
    StoreError,
    may_read,
)
from hotloop.store.quota import Usage

if TYPE_CHECKING:
    from hotloop.store.sql import Work

log = logging.getLogger("hotloop.store.redis_cache")

T = TypeVar("T")

try:
    from redis import asyncio as redis
    from redis.exceptions import RedisError
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise StoreError(
        "store_unavailable", "--store-cache needs the redis client: pip install 'hotloop[redis]'"
    ) from e

PREFIX = "hotloop:response:"
TOMBSTONE = b"deleted"
SOCKET_TIMEOUT = 0.25
"""Seconds a cache call may take (connecting, or waiting for an answer) before it fails."""
COOL_DOWN = 5.0
"""Seconds the cache is skipped after a failure."""


def _encode(record: StoredResponse, ancestors: list[str] | None) -> bytes:
    return orjson.dumps(
        {
            "id": record.id,
            "owner": record.owner,
            "previous_response_id": record.previous_response_id,
            "created_at": record.created_at,
            # Both are JSON the store has already read back (records.prepare).
            "response": record.response.decode(),
            "input_items": record.input_items.decode(),
            "output_token_ids": list(record.output_token_ids),
            "fingerprint": record.fingerprint,
            "model_turns": [list(astuple(turn)) for turn in record.model_turns],
            "ancestors": ancestors,
        }
    )


def _decode(raw: bytes | str) -> tuple[StoredResponse, list[str] | None] | None:
    """A cached entry; None for a tombstone."""
    if raw == TOMBSTONE:
        return None
    entry: dict[str, Any] = orjson.loads(raw)
    record = StoredResponse(
        id=entry["id"],
        owner=entry["owner"],
        previous_response_id=entry["previous_response_id"],
        created_at=entry["created_at"],
        response=entry["response"].encode(),
        input_items=entry["input_items"].encode(),
        output_token_ids=entry["output_token_ids"],
        fingerprint=entry["fingerprint"],
        # Copied by an older hotloop: one model turn.
        model_turns=tuple(ModelTurn(*turn) for turn in entry.get("model_turns", ())),
    )
    return record, entry["ancestors"]


class CachedStore:
    """A `Store` with a Redis read cache in front (see the module docstring)."""

    def __init__(
        self, store: Store, url: str, *, ttl: int = 3600, cool_down: float = COOL_DOWN
    ) -> None:
        self._store = store
        self._redis = redis.Redis.from_url(
            url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT
        )
        self._ttl = ttl
        self._copies: set[asyncio.Task[None]] = set()
        self._cool_down = cool_down
        self._skip_until = 0.0
        self.hits = 0
        self.misses = 0
        self.skipped = 0
        """Calls that went to the store alone while the cache was skipped."""

    @property
    def cool_down_ends(self) -> float:
        """When (`time.monotonic()`) the cache is tried again after a failure."""
        return self._skip_until

    def _available(self) -> bool:
        if time.monotonic() < self._skip_until:
            self.skipped += 1
            return False
        return True

    def _failed(self, what: str, error: RedisError) -> None:
        """A cache call failed: skip the cache for a cool-down."""
        self._skip_until = time.monotonic() + self._cool_down
        log.warning("%s; cache skipped for %g s: %s", what, self._cool_down, error)

    @property
    def healthy(self) -> bool:
        return self._store.healthy

    def pending(self) -> int:
        return self._store.pending()

    def quota_refusal(self, owner: str | None) -> str | None:
        return self._store.quota_refusal(owner)

    async def transact(self, work: Work[T]) -> T:
        # Background rows change while their response runs: never cached.
        return await self._store.transact(work)

    async def query(self, work: Work[T]) -> T:
        return await self._store.query(work)

    def counted(self, owner: str | None, change: Usage) -> None:
        self._store.counted(owner, change)

    async def put(self, response: StoredResponse) -> None:
        await self._store.put(response)
        copy = asyncio.get_running_loop().create_task(self._copy(response))
        self._copies.add(copy)
        copy.add_done_callback(self._copies.discard)

    async def _copy(self, record: StoredResponse) -> None:
        if not self._available():
            return
        try:
            ancestors: list[str] | None = []
            if record.previous_response_id is not None:
                parent = await self._redis.get(PREFIX + record.previous_response_id)
                entry = None if parent is None else _decode(parent)
                if entry is None:
                    ancestors = None
                else:
                    parent_record, parent_ancestors = entry
                    ancestors = (
                        None if parent_ancestors is None else [*parent_ancestors, parent_record.id]
                    )
            await self._redis.set(
                PREFIX + record.id, _encode(record, ancestors), ex=self._ttl, nx=True
            )
        except RedisError as e:
            self._failed(f"response {record.id} not cached", e)

    async def _cached(self, ids: list[str]) -> list[tuple[StoredResponse, list[str] | None] | None]:
        if not self._available():
            return [None] * len(ids)
        try:
            raws = await self._redis.mget([PREFIX + rid for rid in ids])
        except RedisError as e:
            self._failed("cache unavailable", e)
            return [None] * len(ids)
        return [None if raw is None else _decode(raw) for raw in raws]

    async def get(self, response_id: str, owner: str | None) -> bytes | None:
        (entry,) = await self._cached([response_id])
        if entry is not None and may_read(entry[0].owner, owner):
            self.hits += 1
            return entry[0].response
        self.misses += 1
        return await self._store.get(response_id, owner)

    async def load_chain(self, response_id: str, owner: str | None) -> Chain | None:
        (head,) = await self._cached([response_id])
        if head is not None and head[1] is not None and may_read(head[0].owner, owner):
            older = await self._cached(head[1])
            records = [entry[0] for entry in older if entry is not None]
            if len(records) == len(older) and all(may_read(r.owner, owner) for r in records):
                self.hits += 1
                return Chain([*records, head[0]])
        self.misses += 1
        chain = await self._store.load_chain(response_id, owner)
        if chain is not None:
            await self._fill(chain)
        return chain

    async def _fill(self, chain: Chain) -> None:
        if not self._available():
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for n, record in enumerate(chain.responses):
                    ancestors = [r.id for r in chain.responses[:n]]
                    pipe.set(PREFIX + record.id, _encode(record, ancestors), ex=self._ttl, nx=True)
                await pipe.execute()
        except RedisError as e:
            self._failed("chain not cached", e)

    async def delete(self, response_id: str, owner: str | None) -> bool:
        (entry,) = await self._cached([response_id])
        if entry is not None and not may_read(entry[0].owner, owner):
            return False  # another key's: it tombstones nothing
        refused = StoreError(
            "store_unavailable",
            "The response cache is unavailable, so the response cannot be deleted without "
            "staying readable from it; nothing was deleted: retry shortly.",
        )
        if not self._available():
            raise refused
        try:
            await self._redis.set(PREFIX + response_id, TOMBSTONE, ex=self._ttl)
        except RedisError as e:
            self._failed(f"response {response_id} not deleted", e)
            raise refused from e
        return await self._store.delete(response_id, owner)

    async def list_input_items(
        self,
        response_id: str,
        owner: str | None,
        *,
        order: Order = "desc",
        limit: int = 20,
        after: str | None = None,
    ) -> InputItemPage | None:
        return await self._store.list_input_items(
            response_id, owner, order=order, limit=limit, after=after
        )

    async def copied(self) -> None:
        """Return once every committed response so far has been copied to the cache
        (or the copy failed and was logged)."""
        if self._copies:
            await asyncio.gather(*self._copies)

    async def close(self) -> None:
        await self.copied()
        await self._store.close()
        await self._redis.aclose()


__all__ = ["CachedStore"]
