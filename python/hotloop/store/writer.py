"""The group-committing writer: a `Store` over a blocking database.

Owns the one thread that touches the database, the thread that prepares large records
and the queues in front of them. A put waits for its commit: its record is prepared
(`records.prepare`; on the event loop when small, on the preparing thread when large),
queued, and the drain task takes a batch and commits it in one transaction: the
responses put while a commit is under way share the next one (and its fsync), and a
commit window, when set, also waits that long after the first queued response for
more. Each put then
learns its own outcome: committed, refused (a record the store cannot read back is
quarantined in the same transaction and only that response fails) or failed with the
whole transaction.

Fair shares: the writer is one resource every tenant waits on, so each API key has a
queue of its own and a batch takes one piece of work from each key in turn, the key
served longest ago first (a key coming back from idle goes before a flooding key, whose
piece was taken last), up to `max_batch` pieces, `max_batch_bytes` bytes and
`MAX_BATCH_ROWS` rows (a batch's time follows its bytes on SQLite, its rows on
PostgreSQL). A piece is a response's row (with its last input item rows), or a chunk of
a large response's item rows (`CHUNK_BYTES`, `CHUNK_ROWS`), committed ahead of the row:
invisible until the row commits (every read starts from the row), so a large response
still appears whole or not at all. The pieces go in two lanes of batches (`_Lane`):
rows, which acknowledge responses, in group commits of rows that fit a batch, holding no
chunk; and bulk, one piece per transaction (`Database.write_bulk`): a chunk, written
ahead without waiting for the disk, or a row larger than a batch of rows, acknowledged
once the database's flush ran. Another key's response thus waits for at most one bulk
piece under way (on PostgreSQL not even that: the lanes have a connection each) and its
own commit, which holds none of the large one's bytes, never behind the whole of a
large response nor its fsync. A large response that fails after some of its chunks
committed leaves those item rows behind, unreferenced.

Failure isolation: nothing a record holds and no database error ends the drain task.
Every failure is counted (`hotloop_store_errors_total{stage}`) and logged at ERROR with
the response ids, never their content. After a failed commit the store reports itself
unhealthy (`/health` 503) and probes the database with a small write every second until
one commits. `close` commits what was put, then closes the database.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, TypeVar

from hotloop.store.interface import (
    COMMIT_WINDOW,
    Chain,
    InputItemPage,
    Order,
    StoredResponse,
    StoreError,
    may_read,
)
from hotloop.store.quota import StorageQuota, Usage
from hotloop.store.records import (
    ItemRows,
    Quarantined,
    RecordError,
    Rejected,
    Row,
    prepare,
    quarantined,
)

if TYPE_CHECKING:
    from hotloop.metrics import Metrics
    from hotloop.store.sql import Work

log = logging.getLogger("hotloop.store")

T = TypeVar("T")

PROBE_INTERVAL = 1.0
"""Seconds between write probes while the store is unhealthy."""


class Database(Protocol):
    """Blocking storage. Writes run on the store thread; reads on it too, or on
    `readers` threads of their own when the database allows concurrent use (0: none).
    Every method raises StoreError `store_unavailable` when the database fails."""

    readers: int
    writers: int
    """1: `write_bulk` runs on the store thread beside `write`; 2: on a thread (and a
    connection) of its own, concurrently with `write`."""

    def write(self, rows: Sequence[Row], rejected: Rejected, items: ItemRows = ()) -> None:
        """Commit the rows, the quarantined records and more input item rows
        (response id, position, id, item) in one durable transaction."""
        ...

    def write_bulk(
        self, rows: Sequence[Row], rejected: Rejected, items: ItemRows = ()
    ) -> Callable[[], None] | None:
        """Commit like `write`, possibly without waiting for the disk, and return what
        makes the commit durable (None: it is), which the writer runs on a thread of its
        own, outside any lock `write` takes, before it acknowledges the rows. With no
        rows, the item rows are those of responses not yet committed: no read reaches
        them before their response's row commits, and that durable commit, which
        follows, flushes the log up to itself (each database's log is one sequence), so
        the writer may skip the flush while a commit of rows is under way."""
        ...

    def probe(self) -> None:
        """One small durable write (the health check while unhealthy)."""
        ...

    def usage(self) -> dict[str, Usage]:
        """Every owner's stored bytes and rows (`quota.py`)."""
        ...

    def get(self, response_id: str, owner: str | None) -> bytes | None: ...
    def delete(self, response_id: str, owner: str | None) -> tuple[str | None, Usage] | None:
        """The deleted response's owner and what it held; None if there was none."""
        ...

    def list_input_items(
        self, response_id: str, owner: str | None, *, order: Order, limit: int, after: str | None
    ) -> InputItemPage | None: ...
    def chain(self, response_id: str, owner: str | None) -> list[StoredResponse]:
        """`owner`'s responses from `response_id` back towards the root, newest first,
        in one query (None: with auth off, anyone's)."""
        ...

    def transact(self, work: Work[T]) -> T:
        """`work` in one durable transaction (`sql.py`: the conversation and background
        tables)."""
        ...

    def query(self, work: Work[T]) -> T:
        """`work`, which only reads, outside any write transaction."""
        ...

    def close(self) -> None: ...


CHUNK_BYTES = 8 * 1024
CHUNK_ROWS = 16
"""Input item rows of a large response committed per transaction ahead of its row:
up to CHUNK_BYTES of them, and at most CHUNK_ROWS."""
MAX_BATCH_BYTES = 32 * 1024
MAX_BATCH_ROWS = 64
"""What one batch of rows commits at most (a row larger than that goes in the bulk lane,
alone): what another key's response may wait behind. Rows are bounded beside bytes because
PostgreSQL's time per row (a conflict check and two index entries) dwarfs its time per
byte: 32 KiB of small items, 180 rows, took 6.8 ms to commit where one row takes 0.8 ms
(`benches/bench_store_fairness.py`), and B's turn waited behind two such batches."""
PREPARE_INLINE_BYTES = 64 * 1024
"""Records up to this size are prepared on the event loop (well under a millisecond);
larger ones on the preparing thread, so that the loop never parses a large one."""


@dataclass
class _Put:
    record: StoredResponse
    waiter: asyncio.Future[None] = field(repr=False)
    """What its caller awaits: settled at once, with no future between (a caller that
    goes away cancels only this, never the put)."""
    settled: bool = False
    usage: Usage = field(default_factory=Usage)
    """What the whole response holds in the database, once prepared (its quota)."""
    ahead: int = 0
    """Its chunks being written ahead: its row waits until none is
    (`BackgroundStore._takes`)."""

    @property
    def size(self) -> int:
        """What the record weighs: its JSON, as the database receives it."""
        return len(self.record.response) + len(self.record.input_items)


@dataclass
class _Piece:
    """One unit of the writer's work for `put`: its row (`final`, with its last item
    rows), a chunk of its item rows committed ahead of the row (`items`), or its record
    refused (`refused`, final)."""

    put: _Put
    size: int
    row: Row | None = None
    items: list[tuple[str, int, str, bytes]] = field(default_factory=list)
    refused: RecordError | None = None

    @property
    def final(self) -> bool:
        return self.row is not None or self.refused is not None

    @property
    def rows(self) -> int:
        """The rows it inserts."""
        return len(self.items) + (0 if self.row is None else 1 + len(self.row.items))


def _pieces(put: _Put) -> list[_Piece]:
    """Prepare `put`'s record and cut it into pieces (see the module docstring)."""
    try:
        row = prepare(put.record)
    except RecordError as e:
        return [_Piece(put, put.size, refused=e)]
    put.usage = row.usage
    pieces: list[_Piece] = []
    chunk: list[tuple[str, int, str, bytes]] = []
    size = 0
    for position, item_id, item in row.items:
        chunk.append((row.id, position, item_id, item))
        size += len(item)
        if size >= CHUNK_BYTES or len(chunk) >= CHUNK_ROWS:
            pieces.append(_Piece(put, size, items=chunk))
            chunk, size = [], 0
    final = replace(row, items=[(position, item_id, item) for _, position, item_id, item in chunk])
    pieces.append(_Piece(put, len(row.response) + len(row.input_items) + size, row=final))
    return pieces


@dataclass
class _Lane:
    """A sequence of batches of one kind, committed one after another on `thread`:
    rows that fit a batch (durable, acknowledging), or bulk pieces (`Database.write_bulk`:
    chunks written ahead of their rows, and rows too large for a batch)."""

    bulk: bool
    thread: ThreadPoolExecutor
    max_bytes: int
    max_rows: int
    """What one of its batches holds at most, past its first piece."""
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a piece it may take may have become takeable."""
    committing: bool = False


@dataclass
class _Outcome:
    """What the store thread did with one batch."""

    committed: list[_Put] = field(default_factory=list)
    refused: list[tuple[_Put, RecordError]] = field(default_factory=list)
    failure: StoreError | None = None
    flush: Callable[[], None] | None = None
    """What `Database.write_bulk` left to run off its thread."""


class BackgroundStore:
    """A `Store`: one database thread, a queue of puts, group commits."""

    def __init__(
        self,
        database: Database,
        thread: ThreadPoolExecutor,
        *,
        max_batch: int,
        max_batch_bytes: int,
        commit_window: float,
        deadline: float,
        quota: StorageQuota,
        metrics: Metrics | None,
    ) -> None:
        self._database = database
        self.quota = quota
        self._thread = thread
        self._readers = (
            ThreadPoolExecutor(database.readers, thread_name_prefix="hotloop-store-read")
            if database.readers
            else thread
        )
        self._preparer = ThreadPoolExecutor(1, thread_name_prefix="hotloop-store-prepare")
        self._flusher = ThreadPoolExecutor(1, thread_name_prefix="hotloop-store-flush")
        self._preparing = 0
        self._preparings: set[asyncio.Task[None]] = set()
        # Per owner with queued work.
        self._queues: dict[str | None, deque[_Piece]] = {}
        # Per owner, when the writer last took a piece of it (`_take`'s turn order).
        self._served: dict[str | None, int] = {}
        self._taken = 0
        self._queued_pieces = 0
        self._rows = _Lane(False, thread, max_batch_bytes, MAX_BATCH_ROWS)
        # One piece per batch: what another key's commit may wait behind on SQLite.
        self._bulk = _Lane(
            True,
            thread
            if database.writers == 1
            else ThreadPoolExecutor(1, thread_name_prefix="hotloop-store-bulk"),
            CHUNK_BYTES,
            CHUNK_ROWS,
        )
        self._max_batch = max_batch
        self._max_batch_bytes = max_batch_bytes
        self._queued_bytes = 0
        self._queued_rows = 0
        self._window = commit_window
        self._deadline = deadline
        self._metrics = metrics
        self._closed = False
        self._healthy = True
        self._queued = 0
        self._probing: asyncio.Task[None] | None = None
        loop = asyncio.get_running_loop()
        self._drainers = [loop.create_task(self._drain(lane)) for lane in (self._rows, self._bulk)]

    @classmethod
    async def open(
        cls,
        connect: Callable[[], Database],
        *,
        max_batch: int = 256,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        commit_window: float = COMMIT_WINDOW,
        deadline: float = 5.0,
        quota_bytes: int = 2**62,
        quota_rows: int = 2**62,
        metrics: Metrics | None = None,
    ) -> BackgroundStore:
        """Open the database on a new store thread (SQLite connections stay on the
        thread that made them) and start draining. A commit, probe or delete that has
        not answered within `deadline` seconds fails (`_written`). Each API key may store
        up to `quota_bytes` and `quota_rows` (`quota.py`), counted from the database
        here."""
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hotloop-store")
        try:
            database, usage = await asyncio.get_running_loop().run_in_executor(
                thread, lambda: _with_usage(connect())
            )
        except BaseException:
            thread.shutdown(wait=False)
            raise
        store = cls(
            database,
            thread,
            max_batch=max_batch,
            max_batch_bytes=max_batch_bytes,
            commit_window=commit_window,
            deadline=deadline,
            quota=StorageQuota(quota_bytes, quota_rows, usage),
            metrics=metrics,
        )
        if metrics is not None:
            metrics.store_pending = store.pending
            metrics.store_healthy = lambda: store.healthy
        return store

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(fn, *args))

    async def _written(
        self, fn: Callable[..., T], *args: object, thread: ThreadPoolExecutor | None = None
    ) -> T:
        """`fn` on the store thread (or `thread`), failed with StoreError
        `store_unavailable` when it has not returned within the deadline: a database
        that hangs (a stopped server, a hung disk) must fail the responses waiting on
        it and turn `/health` 503 in time, not hold them for as long as it hangs. The
        call itself goes on on the store thread until the database layer breaks it off,
        and the calls after it wait behind it within their own deadlines; a commit it
        still completes stored responses that were failed, never ones acknowledged and
        lost. The thread settles the awaited future itself: one wake-up of the loop
        per commit, no task or future between (each was a turn of a busy loop before
        the terminal event)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()

        def run() -> None:
            try:
                result = fn(*args)
            except BaseException as e:  # handed to the awaiting task, raised there
                loop.call_soon_threadsafe(_fail, answer, e)
            else:
                loop.call_soon_threadsafe(_succeed, answer, result)

        (thread or self._thread).submit(run)
        expiry = loop.call_later(self._deadline, self._expire, answer)
        try:
            return await answer
        finally:
            expiry.cancel()

    def _expire(self, answer: asyncio.Future[T]) -> None:
        _fail(
            answer,
            StoreError(
                "store_unavailable",
                f"the database did not answer within {self._deadline:g} s (--store-busy-timeout)",
            ),
        )

    async def _read(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, functools.partial(fn, *args, **kwargs))

    @property
    def healthy(self) -> bool:
        return self._healthy

    def pending(self) -> int:
        return self._queued

    async def put(self, response: StoredResponse) -> None:
        if self._closed:
            raise StoreError("store_closed", "the store is shut down; nothing more is stored")
        loop = asyncio.get_running_loop()
        put = _Put(response, loop.create_future())
        self._queued += 1
        if put.size <= PREPARE_INLINE_BYTES:
            self._enqueue(_pieces(put))
        else:
            # A caller that goes away (a closed socket) does not take the record back:
            # it is prepared, then committed or refused like every other.
            self._preparing += 1
            preparing = loop.create_task(self._prepare(put))
            self._preparings.add(preparing)
            preparing.add_done_callback(self._preparings.discard)
        await put.waiter

    async def _prepare(self, put: _Put) -> None:
        try:
            pieces = await asyncio.get_running_loop().run_in_executor(self._preparer, _pieces, put)
        except Exception as e:
            log.exception("store writer failed to prepare response %s", put.record.id)
            self._settle(put, StoreError("store_unavailable", type(e).__name__))
            self._arrive()
            return
        finally:
            self._preparing -= 1
        self._enqueue(pieces)

    def _enqueue(self, pieces: list[_Piece]) -> None:
        self._queues.setdefault(pieces[0].put.record.owner, deque()).extend(pieces)
        self._queued_pieces += len(pieces)
        self._queued_bytes += sum(piece.size for piece in pieces)
        self._queued_rows += sum(piece.rows for piece in pieces)
        self._arrive()

    def _arrive(self) -> None:
        self._rows.arrived.set()
        self._bulk.arrived.set()

    # ---------------------------------------------------------------- the drain task

    async def _drain(self, lane: _Lane) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._takeable(lane):
                if self._closed and not self._preparing and not self._queues:
                    return
                lane.arrived.clear()
                await lane.arrived.wait()
                continue
            # Let the responses finishing together join (closing: commit at once).
            deadline = loop.time() + self._window
            while not lane.bulk and not self._closed and not self._full():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                lane.arrived.clear()
                try:
                    await asyncio.wait_for(lane.arrived.wait(), remaining)
                except asyncio.TimeoutError:
                    break
            batch = self._take(lane)
            self._arrive()  # the keys' next pieces changed: the other lane's may be there
            await self._commit(lane, batch)

    def _takeable(self, lane: _Lane) -> bool:
        """Whether a key's next piece is one `lane` takes, or is left of a failed
        response (any lane drops it)."""
        return any(
            self._takes(lane, queue[0]) or queue[0].put.settled for queue in self._queues.values()
        )

    def _takes(self, lane: _Lane, piece: _Piece) -> bool:
        """Whether `piece` goes in `lane`: a row (or a refused record) that fits a batch
        of rows in the rows lane, once its chunks are committed; a chunk, or a larger
        row, in the bulk lane, alone."""
        if not piece.final or piece.size > self._rows.max_bytes:
            return lane.bulk
        return not lane.bulk and not piece.put.ahead

    def _full(self) -> bool:
        return (
            self._queued_pieces >= self._max_batch
            or self._queued_bytes >= self._max_batch_bytes
            or self._queued_rows >= MAX_BATCH_ROWS
        )

    def _take(self, lane: _Lane) -> list[_Piece]:
        """`lane`'s next batch: one piece from each key in turn, the key whose piece
        the writer took longest ago first (see the module docstring), skipping the keys
        whose next piece is for the other lane (they keep their turn), and past its
        first, a key's pieces only within its share of the batch (the bounds divided
        among the keys with queued work): the batch another key's response commits in
        holds part of a flooding key's, not a whole one. A key whose next piece does
        not fit keeps its turn: it goes first next time. The pieces left of a response
        that already failed are dropped."""
        batch: list[_Piece] = []
        size = rows = 0
        max_bytes, max_rows = lane.max_bytes, lane.max_rows
        keys = len(self._queues)
        shares: dict[str | None, tuple[int, int]] = {}
        # Never taken: first, in the order they came.
        turns = sorted(self._queues, key=lambda owner: self._served.get(owner, -1))
        while turns:
            more: list[str | None] = []
            for owner in turns:
                queue = self._queues[owner]
                piece = queue[0]
                failed = piece.put.settled
                if not failed and not self._takes(lane, piece):
                    continue
                over = size + piece.size > max_bytes or rows + piece.rows > max_rows
                if owner in shares:
                    key_size, key_rows = shares[owner]
                    over = over or (
                        (key_size + piece.size) * keys > max_bytes
                        or (key_rows + piece.rows) * keys > max_rows
                    )
                if not failed and batch and over:
                    return batch
                queue.popleft()
                self._queued_pieces -= 1
                self._queued_bytes -= piece.size
                self._queued_rows -= piece.rows
                if not failed:
                    batch.append(piece)
                    size += piece.size
                    rows += piece.rows
                    key_size, key_rows = shares.get(owner, (0, 0))
                    shares[owner] = (key_size + piece.size, key_rows + piece.rows)
                    # One number per key that ever stored, as the quota keeps its usage.
                    self._taken += 1
                    self._served[owner] = self._taken
                if queue:
                    more.append(owner)
                else:
                    del self._queues[owner]
                if len(batch) >= self._max_batch:
                    return batch
            turns = more
        return batch

    async def _commit(self, lane: _Lane, batch: list[_Piece]) -> None:
        if not batch:
            return
        chunks = [piece for piece in batch if not piece.final]
        for piece in chunks:
            piece.put.ahead += 1
        lane.committing = True
        try:
            outcome = await self._written(self._write, lane.bulk, batch, thread=lane.thread)
            if outcome.flush is not None and (
                len(chunks) < len(batch) or not self._rows.committing
            ):
                # Off the store thread: another key's commit goes on meanwhile. Rows are
                # acknowledged only after it; chunks alone need no second fsync of the
                # log beside that of a commit of rows under way.
                await self._written(outcome.flush, thread=self._flusher)
        except StoreError as e:
            outcome = _Outcome(failure=e)
        except Exception as e:
            # A bug below must not end the drain task: fail this batch, keep going.
            log.exception("store writer failed on responses %s", _ids(batch))
            outcome = _Outcome(failure=StoreError("store_unavailable", f"{type(e).__name__}"))
        finally:
            lane.committing = False
        if chunks:
            for piece in chunks:
                piece.put.ahead -= 1
            self._rows.arrived.set()  # a response's row may now follow its chunks
        metrics = self._metrics
        if outcome.failure is not None:
            puts = list({id(piece.put): piece.put for piece in batch}.values())
            log.error(
                "store commit failed; %d responses not stored and failed (%s): %s",
                len(puts),
                _ids(batch),
                outcome.failure.message,
            )
            if metrics is not None:
                metrics.store_errors.labels("commit").inc(len(puts))
            self._unhealthy()
            for put in puts:
                self._settle(put, outcome.failure)
            return
        self._healthy = True
        if metrics is not None:
            metrics.store_commits.inc()
            metrics.store_writes.inc(len(outcome.committed))
            metrics.store_errors.labels("record").inc(len(outcome.refused))
        for put in outcome.committed:
            self.quota.stored(put.record.owner, put.usage)
            self._settle(put, None)
        for put, error in outcome.refused:
            log.error(
                "response %s cannot be stored (%s); quarantined, the response failed",
                put.record.id,
                error.reason,
            )
            self._settle(
                put,
                StoreError(
                    "store_unavailable",
                    "This response could not be stored: the server kept it aside for its "
                    "operator and failed it instead of acknowledging it.",
                ),
            )

    def _write(self, bulk: bool, batch: Sequence[_Piece]) -> _Outcome:
        """On the lane's thread: commit the batch's pieces in one transaction."""
        outcome = _Outcome()
        rows: list[Row] = []
        rejected: list[Quarantined] = []
        items: list[tuple[str, int, str, bytes]] = []
        for piece in batch:
            items.extend(piece.items)
            if piece.row is not None:
                rows.append(piece.row)
                outcome.committed.append(piece.put)
            elif piece.refused is not None:
                rejected.append(quarantined(piece.put.record, piece.refused))
                outcome.refused.append((piece.put, piece.refused))
        try:
            if bulk:
                outcome.flush = self._database.write_bulk(rows, rejected, items)
            else:
                self._database.write(rows, rejected, items)
        except StoreError as e:
            return _Outcome(failure=e)
        return outcome

    def _settle(self, put: _Put, error: StoreError | None) -> None:
        if put.settled:
            return
        put.settled = True
        self._queued -= 1
        if put.waiter.done():
            return  # its caller went away
        if error is None:
            put.waiter.set_result(None)
        else:
            put.waiter.set_exception(error)

    def _unhealthy(self) -> None:
        self._healthy = False
        if self._probing is None and not self._closed:
            self._probing = asyncio.get_running_loop().create_task(self._probe())

    async def _probe(self) -> None:
        """Until a write commits: try one every PROBE_INTERVAL seconds (a commit of
        real responses in between also counts)."""
        try:
            while not self._healthy and not self._closed:
                await asyncio.sleep(PROBE_INTERVAL)
                if self._healthy or self._closed:
                    break
                try:
                    await self._written(self._database.probe)
                except StoreError as e:
                    log.warning("store still unavailable: %s", e.message)
                else:
                    log.info("store available again")
                    self._healthy = True
        finally:
            self._probing = None

    # ---------------------------------------------------------------- reads

    async def get(self, response_id: str, owner: str | None) -> bytes | None:
        return await self._read(self._database.get, response_id, owner)

    async def delete(self, response_id: str, owner: str | None) -> bool:
        freed = await self._written(self._database.delete, response_id, owner)
        if freed is None:
            return False
        self.quota.deleted(*freed)
        return True

    def quota_refusal(self, owner: str | None) -> str | None:
        return self.quota.refusal(owner)

    async def transact(self, work: Work[T]) -> T:
        return await self._written(self._database.transact, work)

    async def query(self, work: Work[T]) -> T:
        return await self._read(self._database.query, work)

    async def list_input_items(
        self,
        response_id: str,
        owner: str | None,
        *,
        order: Order = "desc",
        limit: int = 20,
        after: str | None = None,
    ) -> InputItemPage | None:
        return await self._read(
            self._database.list_input_items,
            response_id,
            owner,
            order=order,
            limit=limit,
            after=after,
        )

    def counted(self, owner: str | None, change: Usage) -> None:
        if change.bytes >= 0 and change.rows >= 0:
            self.quota.stored(owner, change)
        else:
            self.quota.deleted(owner, Usage() - change)

    async def load_chain(self, response_id: str, owner: str | None) -> Chain | None:
        newest_first = await self._read(self._database.chain, response_id, owner)
        # Complete only if it reaches a root: a deleted ancestor makes the whole chain a
        # miss.
        if not newest_first or newest_first[-1].previous_response_id is not None:
            return None
        if newest_first[0].id != response_id:
            return None
        if not all(may_read(r.owner, owner) for r in newest_first):
            return None
        return Chain(responses=newest_first[::-1])

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._arrive()
        await asyncio.gather(*self._drainers)
        if self._probing is not None:
            self._probing.cancel()
        self._preparer.shutdown(wait=True)
        self._flusher.shutdown(wait=True)
        if self._readers is not self._thread:
            self._readers.shutdown(wait=True)
        if self._bulk.thread is not self._thread:
            self._bulk.thread.shutdown(wait=True)
        await self._call(self._database.close)
        self._thread.shutdown(wait=True)


def _succeed(answer: asyncio.Future[T], result: T) -> None:
    if not answer.done():
        answer.set_result(result)


def _fail(answer: asyncio.Future[T], error: BaseException) -> None:
    if not answer.done():
        answer.set_exception(error)


def _with_usage(database: Database) -> tuple[Database, dict[str, Usage]]:
    try:
        return database, database.usage()
    except BaseException:
        database.close()
        raise


def _ids(batch: Sequence[_Piece]) -> str:
    return ", ".join(dict.fromkeys(piece.put.record.id for piece in batch))


__all__ = ["PROBE_INTERVAL", "BackgroundStore", "Database"]
