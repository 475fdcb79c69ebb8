"""What happens to a response after its terminal event, for both transports.

`Ledger` is the protocol's `Observer`. For every finished response it books usage per
API key id, updates metrics and, with `store=true`, hands the response to the store's
background writer; all of it is deferred to the event loop's next turn, so it never
delays the terminal frame. It also owns the process-wide caches of rendered state that
HTTP requests continue from (one per API key id, all under the global cache budget),
and the rebuild of a stored chain into a checkpoint on a cache miss.

It does not decide what goes on the wire and never sees a response before it ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from pathlib import Path

import orjson

from hotloop._core import Checkpoint, Conversation, CoreError, Policy
from hotloop.auth import key_id
from hotloop.engines.base import Engine
from hotloop.metrics import Metrics
from hotloop.protocol import CacheBudget, ConnectionCache, Finished, ProtocolError
from hotloop.protocol.compaction import Compactor
from hotloop.shutdown import Drain
from hotloop.store import Chain, Store, StoredResponse, StoreError, open_store
from hotloop.usage import Usage

log = logging.getLogger("hotloop.ledger")


class Ledger:
    """Bookkeeping shared by every connection and request of the process."""

    def __init__(
        self,
        engine: Engine,
        *,
        cache_memory_bytes: int,
        max_cached_bytes: int,
        data_dir: str | Path | None = None,
        policy: Policy | None = None,
        compactor: Compactor | None = None,
    ) -> None:
        """`compactor`: the server's compaction key, to rebuild chains that hold
        compaction items (one of the ledger's own otherwise)."""
        self.usage = Usage()
        self.metrics = Metrics(self.usage)
        self.drain = Drain()
        # Every generation, over either transport, goes through the drain.
        self.engine = self.drain.engine(engine)
        # The global cap on cached state, shared by the WebSocket connections' caches
        # and the HTTP caches.
        self.budget = CacheBudget(cache_memory_bytes)
        self.store: Store | None = None
        self._data_dir = data_dir
        self.metrics.cache_counts = lambda: (
            self.budget.hits,
            self.budget.misses,
            self.budget.evictions,
        )
        self._max_cached_bytes = max_cached_bytes
        self._policy = policy
        self.compactor = compactor or Compactor.ephemeral()
        self._http_caches: dict[str | None, ConnectionCache] = {}
        self._puts: set[asyncio.Task[None]] = set()
        self._unbooked: deque[tuple[Finished, str]] = deque()

    async def start(self) -> None:
        """Open the durable store (when a data directory is configured)."""
        if self._data_dir is not None and self.store is None:
            self.store = await open_store(self._data_dir, metrics=self.metrics)
            self.metrics.store_pending = self.store.pending

    async def close(self) -> None:
        """Persist everything acknowledged: wait for scheduled puts, then flush and
        close the store. Called after the last response has ended."""
        self._book_all()
        if self._puts:
            await asyncio.gather(*self._puts)
        if self.store is not None:
            await self.store.close()

    # ---------------------------------------------------------------- the caches

    def http_cache(self, owner: str | None) -> ConnectionCache:
        """The process-wide cache HTTP requests of API key id `owner` continue from.
        One per key: an id never resolves to another key's state."""
        cache = self._http_caches.get(owner)
        if cache is None:
            cache = ConnectionCache(self._max_cached_bytes, self.budget)
            self._http_caches[owner] = cache
        return cache

    async def restore(self, response_id: str, owner: str | None) -> Checkpoint | None:
        """Rebuild a stored chain into a checkpoint (the slow, correct path of a cache
        miss), or None if the store does not have it for this owner."""
        if self.store is None:
            return None
        try:
            chain = await self.store.load_chain(response_id, owner)
        except StoreError as e:
            log.error("cannot load %s from the store: %s", response_id, e.message)
            return None
        return self._rebuild(response_id, chain)

    async def warm(self, cache: ConnectionCache, parent: str | None, owner: str | None) -> None:
        """Make `parent` a hit in `cache` when the store can rebuild it. Both transports
        await this before a request reaches its `Connection` (the state machine cannot
        await), so the read runs in the store's thread, never on the event loop."""
        if parent is None or parent in cache:
            return
        checkpoint = await self.restore(parent, owner)
        if checkpoint is not None:
            cache.put(parent, checkpoint, None)

    def _rebuild(self, response_id: str, chain: Chain | None) -> Checkpoint | None:
        if chain is None:
            return None
        conversation = Conversation(
            self.engine.chat_format,
            context_window=self.engine.context_window,
            policy=self._policy,
        )
        try:
            chain.replay(conversation, self.compactor)
        except (CoreError, ProtocolError) as e:
            log.warning("stored chain of %s no longer renders: %s", response_id, e.message)
            return None
        self.metrics.store_rebuilds.inc()
        return conversation.checkpoint()

    # ---------------------------------------------------------------- observers

    def observer(self, principal: str | None, transport: str = "websocket") -> Books:
        """The protocol `Observer` for one connection (or one HTTP request) that
        authenticated with `principal` (the API key, None when auth is off)."""
        return Books(self, principal, transport)

    def record(self, response: Finished, transport: str) -> None:
        """Book a finished response on the loop's next turn, after the terminal frame."""
        if not self._unbooked:
            asyncio.get_running_loop().call_soon(self._book_all)
        self._unbooked.append((response, transport))

    def _book_all(self) -> None:
        while self._unbooked:
            self._book(*self._unbooked.popleft())

    def _book(self, finished: Finished, transport: str) -> None:
        owner = key_id(finished.principal) if finished.principal is not None else None
        usage = finished.usage
        response = orjson.loads(finished.response_json)
        status = response["status"]
        metrics = self.metrics
        metrics.turns.labels(transport, status).inc()
        metrics.turn_overhead.labels(transport).observe(finished.overhead_ns / 1e9)
        if finished.turn is not None:
            metrics.record_prompt(
                prompt_tokens=finished.turn.prompt_tokens,
                cached_tokens=finished.turn.cached_tokens,
            )
        self.usage.record(
            owner,
            input_tokens=usage.input_tokens,
            cached_tokens=usage.cached_tokens,
            output_tokens=usage.output_tokens,
        )
        request = finished.request
        if request.store and self.store is not None:
            stored = StoredResponse(
                id=finished.response_id,
                owner=owner,
                previous_response_id=request.previous_response_id,
                created_at=response["created_at"],
                response=finished.response_json,
                input_items=request.input_json.encode(),
                output_token_ids=_output_ids(finished),
            )
            task = asyncio.get_running_loop().create_task(self._put(stored))
            self._puts.add(task)
            task.add_done_callback(self._puts.discard)

    async def _put(self, stored: StoredResponse) -> None:
        assert self.store is not None
        try:
            await self.store.put(stored)
        except StoreError as e:
            log.error("response %s not stored: %s", stored.id, e.message)


def _output_ids(finished: Finished) -> list[int]:
    """The assistant segment as the cache holds it: the sampled ids verbatim (with the
    format's end-of-message token). Empty when the response cannot be continued."""
    if finished.checkpoint is None or finished.turn is None:
        return []
    return finished.checkpoint.fork().prompt().tokens_from(finished.turn.prompt_tokens)


class Books:
    """A `protocol.Observer` bound to one principal: finished responses are booked
    under its key id (`owner`, which also scopes `Ledger.warm`'s store reads)."""

    def __init__(self, ledger: Ledger, principal: str | None, transport: str) -> None:
        self.ledger = ledger
        self.principal = principal
        self.owner = key_id(principal) if principal is not None else None
        self.transport = transport

    def finished(self, response: Finished) -> None:
        self.ledger.record(response, self.transport)


__all__ = ["Books", "Ledger"]
