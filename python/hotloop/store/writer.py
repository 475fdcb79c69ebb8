"""The bounded background writer: a `Store` over a blocking database.

Owns the one thread that touches the database and the bounded queue in front of it.
A put returns as soon as the response is queued (it waits only when the queue is full),
so persistence overlaps the next turn; a drain task commits queued responses in
batches, one transaction each. Responses still in the queue are kept in a pending map
so reads see every put that returned. `flush` waits for the queue to empty; `close`
flushes, then closes the database: that is what makes shutdown lose nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol, TypeVar

from hotloop.store import Chain, InputItemPage, Order, StoredResponse, StoreError
from hotloop.store.items import listed_items, page_of
from hotloop.store.sqlite import may_read

if TYPE_CHECKING:
    from hotloop.metrics import Metrics

log = logging.getLogger("hotloop.store")

T = TypeVar("T")


class Database(Protocol):
    """Blocking storage, called from the store thread only."""

    def write(self, batch: Sequence[StoredResponse]) -> None: ...
    def get(self, response_id: str, owner: str | None) -> bytes | None: ...
    def delete(self, response_id: str, owner: str | None) -> bool: ...
    def list_input_items(
        self, response_id: str, owner: str | None, *, order: Order, limit: int, after: str | None
    ) -> InputItemPage | None: ...
    def chain(self, response_id: str) -> list[StoredResponse]: ...
    def close(self) -> None: ...


class BackgroundStore:
    """A `Store`: one database thread, a bounded queue of puts, batched commits."""

    def __init__(
        self,
        database: Database,
        thread: ThreadPoolExecutor,
        *,
        queue_size: int,
        max_batch: int,
        metrics: Metrics | None,
    ) -> None:
        self._database = database
        self._thread = thread
        self._queue: asyncio.Queue[StoredResponse | None] = asyncio.Queue(queue_size)
        self._pending: dict[str, StoredResponse] = {}
        self._max_batch = max_batch
        self._metrics = metrics
        self._closed = False
        self._drainer = asyncio.get_running_loop().create_task(self._drain())

    @classmethod
    async def open(
        cls,
        connect: Callable[[], Database],
        *,
        queue_size: int = 1024,
        max_batch: int = 256,
        metrics: Metrics | None = None,
    ) -> BackgroundStore:
        """Open the database on a new store thread (SQLite connections stay on the
        thread that made them) and start draining."""
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hotloop-store")
        try:
            database = await asyncio.get_running_loop().run_in_executor(thread, connect)
        except BaseException:
            thread.shutdown(wait=False)
            raise
        return cls(database, thread, queue_size=queue_size, max_batch=max_batch, metrics=metrics)

    async def _call(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(fn, *args, **kwargs))

    async def put(self, response: StoredResponse) -> None:
        if self._closed:
            raise StoreError("store_closed", "the store is shut down; nothing more is stored")
        self._pending[response.id] = response
        await self._queue.put(response)

    async def _drain(self) -> None:
        while True:
            first = await self._queue.get()
            if first is None:
                self._queue.task_done()
                return
            batch = [first]
            stop = False
            while len(batch) < self._max_batch and not self._queue.empty():
                more = self._queue.get_nowait()
                if more is None:
                    stop = True
                    self._queue.task_done()
                    break
                batch.append(more)
            await self._commit(batch)
            if stop:
                return

    async def _commit(self, batch: list[StoredResponse]) -> None:
        try:
            await self._call(self._database.write, batch)
            if self._metrics is not None:
                self._metrics.store_writes.inc(len(batch))
        except StoreError as e:
            # Nothing to hand the error to: the responses were acknowledged long ago.
            # Say loudly what was lost.
            log.error(
                "lost %d stored responses (%s): %s",
                len(batch),
                ", ".join(r.id for r in batch),
                e.message,
            )
            if self._metrics is not None:
                self._metrics.store_errors.inc(len(batch))
        finally:
            for response in batch:
                if self._pending.get(response.id) is response:
                    del self._pending[response.id]
                self._queue.task_done()

    async def get(self, response_id: str, owner: str | None) -> bytes | None:
        queued = self._pending.get(response_id)
        if queued is not None:
            return queued.response if may_read(queued.owner, owner) else None
        return await self._call(self._database.get, response_id, owner)

    async def delete(self, response_id: str, owner: str | None) -> bool:
        if response_id in self._pending:
            # Let the put land first: a delete must not race the write it undoes.
            await self.flush()
        return await self._call(self._database.delete, response_id, owner)

    async def list_input_items(
        self,
        response_id: str,
        owner: str | None,
        *,
        order: Order = "desc",
        limit: int = 20,
        after: str | None = None,
    ) -> InputItemPage | None:
        queued = self._pending.get(response_id)
        if queued is not None:
            if not may_read(queued.owner, owner):
                return None
            items = listed_items(queued.id, queued.input_items)
            data, has_more = page_of(items, ascending=order == "asc", limit=limit, after=after)
            return InputItemPage(data=data, has_more=has_more)
        return await self._call(
            self._database.list_input_items,
            response_id,
            owner,
            order=order,
            limit=limit,
            after=after,
        )

    async def load_chain(self, response_id: str, owner: str | None) -> Chain | None:
        newest, cursor = self._pending_chain(response_id)
        older = [] if cursor is None else await self._call(self._database.chain, cursor)
        return _chain(newest + older, owner)

    def _pending_chain(self, response_id: str) -> tuple[list[StoredResponse], str | None]:
        """The newest part of a chain still in the queue, and where the database part
        starts (puts commit in order, so every older ancestor is in the database)."""
        newest: list[StoredResponse] = []
        cursor: str | None = response_id
        while cursor is not None and cursor in self._pending:
            newest.append(self._pending[cursor])
            cursor = newest[-1].previous_response_id
        return newest, cursor

    def pending(self) -> int:
        return len(self._pending)

    async def flush(self) -> None:
        await self._queue.join()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._queue.put(None)
        await self._drainer
        await self._call(self._database.close)
        self._thread.shutdown(wait=True)


def _chain(newest_first: list[StoredResponse], owner: str | None) -> Chain | None:
    # Complete only if it reaches a root: a deleted ancestor makes the whole chain a miss.
    if not newest_first or newest_first[-1].previous_response_id is not None:
        return None
    if not all(may_read(r.owner, owner) for r in newest_first):
        return None
    return Chain(responses=newest_first[::-1])


__all__ = ["BackgroundStore", "Database"]
