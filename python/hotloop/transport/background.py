"""Background responses over HTTP (`background: true`): the work that runs without its
client, the events it keeps, its bounds and the liveness of the process running it.

A `Job` is one background response: its `Connection` runs in a task of its own (the
HTTP request that made it only follows it, so a client that goes away cancels
nothing). It watches the frames its response emits: the lifecycle events give its live
status and Response object, and a streamed one keeps every event in memory (up to
`--background-event-bytes`; past that the response fails) for `GET
/v1/responses/{id}?stream=true&starting_after=N` to replay and follow. When it ends,
its row and events go to the store (`store/background_tables.py`) and the job is forgotten:
the store answers from then on.

`BackgroundWork` is the process's registry: the bounds (per key and per process, 429
`background_limit` past either), the jobs by response id, and a task that says this
process is alive while it runs background work and, every lease, marks `failed` the
background responses of processes that stopped saying so (`--background-lease`).

`BackgroundRoutes` are their HTTP routes, which `HttpApi` dispatches to: create (the
job started, then its queued Response or its events), resume (the events after N, from
the job while it runs here, else from the store, following another process's writes)
and cancel (here, or asked of the process running it through the store).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson

from hotloop._core import CreateRequest
from hotloop.events import new_id
from hotloop.ledger import Ledger
from hotloop.mcp_client import McpClient
from hotloop.protocol import Connection, ConnectionCache, Observer
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.mcp_tools import McpTurn
from hotloop.store import Store, StoreError, may_read
from hotloop.store.background_tables import (
    TERMINAL,
    BackgroundRecord,
    BackgroundRecords,
    failed_event,
    orphaned,
)
from hotloop.transport import exchange
from hotloop.transport.asgi import Receive, Send
from hotloop.transport.driver import Driver

log = logging.getLogger("hotloop.background")

LIFECYCLE = frozenset(
    (
        b"response.created",
        b"response.queued",
        b"response.in_progress",
        b"response.completed",
        b"response.failed",
        b"response.incomplete",
    )
)
RETRY_AFTER = 1
CANCEL_POLL = 1.0
"""Seconds between a process's reads of the cancels other processes asked of it."""
CANCEL_WAIT = 0.1
"""Seconds between reads of a response another process was asked to cancel."""


@dataclass(frozen=True)
class BackgroundLimits:
    """`--max-background-per-key`, `--max-background`, `--background-event-bytes`,
    `--background-lease`."""

    per_key: int = 16
    total: int = 256
    event_bytes: int = 4 << 20
    lease: float = 30.0


class Job:
    """One background response (see the module docstring)."""

    def __init__(self, owner: str | None, streamed: bool, event_bytes: int) -> None:
        self.owner = owner
        self.streamed = streamed
        self._event_bytes = event_bytes
        self.response_id: str | None = None
        self.status = "queued"
        self.snapshot = b""
        """The latest Response object its lifecycle events carried."""
        self.queued = b""
        """Its Response object as created: what `POST /v1/responses` answers."""
        self.events: list[bytes] = []
        """Every event so far when streamed (index = sequence number)."""
        self.flushed = 0
        """How many of `events` are in the store."""
        self._kept = 0
        self._overflowed = False
        self.connection: Connection | None = None
        self.driver: Driver | None = None
        """Runs the connection's actions while the response runs."""
        self.cancelled = False
        self.created: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        """None once the response exists; an error frame if it was refused."""
        self.ended = asyncio.Event()
        self._changed = asyncio.Event()

    @property
    def final(self) -> bool:
        return self.status in TERMINAL

    async def emit(self, frames: list[bytes]) -> None:
        """Every frame the response's connection sends, in order (`exchange.Emit`)."""
        for frame in frames:
            self._emitted(frame)

    def _emitted(self, frame: bytes) -> None:
        if self.response_id is None and frame.startswith(b'{"type":"error"'):
            if not self.created.done():
                self.created.set_result(frame)
            return
        kind = exchange.event_type(frame)
        if self.streamed:
            self.events.append(frame)
            self._kept += len(frame)
        if kind in LIFECYCLE:
            response = orjson.loads(frame)["response"]
            self.status = response["status"]
            self.snapshot = orjson.dumps(response)
            if self.response_id is None:
                self.response_id = response["id"]
                self.queued = self.snapshot
                self.created.set_result(None)
        if self._kept > self._event_bytes and not (self.final or self._overflowed):
            self._overflow()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _overflow(self) -> None:
        """Streamed past `--background-event-bytes`: the response stops and fails (its
        kept events end with its `response.failed`), its usage booked as it ends."""
        running = None
        if self.connection is not None and self.response_id is not None:
            running = self.connection.running(self.response_id)
        if running is None:
            return
        # The events that end it are kept whatever they weigh.
        self._overflowed = True
        running.stop()
        running.fail(
            f"The response streamed more than {self._event_bytes} bytes of events, the most a "
            "background response keeps for resuming (--background-event-bytes); it was "
            "stopped.",
            running.usage(),
        )

    def cancel(self) -> None:
        """`POST /v1/responses/{id}/cancel`: the response ends `cancelled` (its terminal
        event and commit follow from the job's task), the engine's generation stops."""
        if self.final or self.cancelled:
            return
        self.cancelled = True
        running = None
        if self.connection is not None and self.response_id is not None:
            running = self.connection.running(self.response_id)
        if running is not None:
            running.cancel()
            if self.driver is not None:
                # Its engine work stops (`Cancel`); its ending is sent and committed.
                self.driver.dispatch()
                self.driver.wake()

    async def changed(self) -> None:
        """Return at the next frame (or at once if the job ended)."""
        if not self.ended.is_set():
            await self._changed.wait()

    def record(self, process: str) -> BackgroundRecord:
        assert self.response_id is not None
        return BackgroundRecord(
            self.response_id, self.owner, process, self.status, self.streamed, self.snapshot
        )


class BackgroundWork:
    """The process's background responses (see the module docstring)."""

    def __init__(self, limits: BackgroundLimits | None = None, node: str = "") -> None:
        self.limits = limits or BackgroundLimits()
        # Unique per process and start: a restarted process never passes for the old one.
        self.process = f"{node or 'hotloop'}/{os.getpid()}/{new_id('')[:12]}"
        self.records: BackgroundRecords | None = None
        self.jobs: dict[str, Job] = {}
        self._running: set[Job] = set()
        self._of_key: dict[str | None, int] = {}
        self._tasks: dict[asyncio.Task[None], Job] = {}
        self._wake = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None

    def admit(self, owner: str | None) -> ProtocolError | None:
        """Why `owner` may not start another background response now, or None."""
        limits = self.limits
        if self._of_key.get(owner, 0) >= limits.per_key:
            message = (
                f"This API key already has {limits.per_key} background responses queued or "
                "running (--max-background-per-key); wait for one to end or cancel one."
            )
        elif len(self._running) >= limits.total:
            message = (
                f"This server already runs {limits.total} background responses "
                "(--max-background); retry later."
            )
        else:
            return None
        return ProtocolError(
            "background_limit", message, "background", status=429, retry_after=RETRY_AFTER
        )

    def run(self, job: Job, run: Coroutine[Any, Any, None]) -> None:
        """Run `run` (the job's response) as a task the client does not hold."""
        self._running.add(job)
        self._of_key[job.owner] = self._of_key.get(job.owner, 0) + 1
        task = asyncio.get_running_loop().create_task(self._run(job, run))
        self._tasks[task] = job
        task.add_done_callback(self._tasks.pop)
        self._ensure_watcher()

    async def _run(self, job: Job, run: Coroutine[Any, Any, None]) -> None:
        records = self.records
        try:
            started = asyncio.ensure_future(self._started(job))
            try:
                await run
            except Exception:
                log.exception("background response %s failed", job.response_id)
            finally:
                if not job.created.done():
                    job.created.set_result(None)  # refused, or failed before it started
                await started
            if job.response_id is not None and records is not None:
                self.jobs[job.response_id] = job
                record = job.record(self.process)
                if not job.final:
                    # It stopped without its terminal event (a bug above): it must not
                    # stay live for as long as this process lives.
                    failure = orphaned(job.snapshot, self.process)
                    record = replace(record, status="failed", response=failure)
                await records.save(record, job.events[job.flushed :], job.flushed)
        except StoreError as e:
            log.error("background response %s not recorded: %s", job.response_id, e.message)
        finally:
            self._running.discard(job)
            left = self._of_key[job.owner] - 1
            if left:
                self._of_key[job.owner] = left
            else:
                del self._of_key[job.owner]
            if job.response_id is not None:
                self.jobs.pop(job.response_id, None)
            job.ended.set()
            job._changed.set()

    async def _started(self, job: Job) -> None:
        """Record the job once its response exists, so that its status is readable
        elsewhere and its process's death is noticed."""
        if await job.created is not None or job.response_id is None:
            return
        self.jobs[job.response_id] = job
        if self.records is not None and not job.final:
            try:
                await self.records.save(job.record(self.process))
            except StoreError as e:
                log.error("background response %s not recorded: %s", job.response_id, e.message)

    def live(self, response_id: str, owner: str | None) -> Job | None:
        """The job of `response_id` running here, if `owner` may see it."""
        job = self.jobs.get(response_id)
        if job is None or not may_read(job.owner, owner):
            return None
        return job

    # ---------------------------------------------------------------- liveness

    def _ensure_watcher(self) -> None:
        if self.records is not None and self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def start(self, store: Store | None) -> None:
        """At start, with the store open: fail what dead processes left live, then keep
        watching."""
        if store is None:
            return
        self.records = BackgroundRecords(store, self.process)
        await self._sweep()
        self._ensure_watcher()

    async def _watch(self) -> None:
        """While this process runs background work: every second, write the new events
        of its streamed responses and cancel what another process was asked to cancel;
        every third of a lease, say this process is alive.
        Every lease: fail the orphans of processes that stopped saying so."""
        loop = asyncio.get_running_loop()
        lease = self.limits.lease
        beaten = swept = loop.time()
        while True:
            await asyncio.sleep(min(CANCEL_POLL, lease / 3))  # a period, not synchronisation
            now = loop.time()
            if self._running and self.records is not None:
                try:
                    await self._flush(self.records)
                    await self._cancel_requested(self.records)
                    if now - beaten >= lease / 3:
                        beaten = now
                        await self.records.beat()
                except StoreError as e:
                    log.warning("background liveness not recorded: %s", e.message)
            if now - swept >= lease:
                swept = now
                await self._sweep()

    async def _flush(self, records: BackgroundRecords) -> None:
        """The new events of the streamed responses running here, to the store (where
        another process's resume reads them, and where they outlive this one)."""
        batches = [
            (job, response_id, len(job.events))
            for response_id, job in self.jobs.items()
            if not job.final and len(job.events) > job.flushed
        ]
        if not batches:
            return
        await records.append(
            [(rid, job.flushed, job.events[job.flushed : end]) for job, rid, end in batches]
        )
        for job, _, end in batches:
            job.flushed = max(job.flushed, end)

    async def _cancel_requested(self, records: BackgroundRecords) -> None:
        for response_id in await records.cancels():
            job = self.jobs.get(response_id)
            if job is not None:
                job.cancel()

    async def _sweep(self) -> None:
        if self.records is None:
            return
        try:
            failed = await self.records.sweep(self.limits.lease)
        except StoreError as e:
            log.warning("background responses of stopped processes not checked: %s", e.message)
            return
        for response_id in failed:
            log.warning(
                "background response %s failed: the process running it stopped", response_id
            )

    async def close(self) -> None:
        """At shutdown (after the drain): stop watching. A job that ended finishes
        recording itself (bounded by the store's deadline); one still running is
        stopped, its engine work booked, and recorded `failed` (if that write fails too,
        the lease fails it later)."""
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None
        abandoned = [job for job in self._tasks.values() if not job.final]
        for task, job in list(self._tasks.items()):
            if job.final:
                continue
            if job.connection is not None:
                job.connection.abandon()  # books what the engine did for it
            task.cancel()  # and with it the job's driver
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.records is None:
            return
        for job in abandoned:
            if job.response_id is None:
                continue
            failure = orphaned(job.snapshot, self.process)
            record = replace(job.record(self.process), status="failed", response=failure)
            events = job.events[job.flushed :]
            if job.events:
                events.append(failed_event(failure, len(job.events)))
            try:
                await self.records.save(record, events, job.flushed)
            except StoreError as e:
                log.error("background response %s left live: %s", job.response_id, e.message)


class Turns(Protocol):
    """How the HTTP API runs a response's actions (`http.py`): a background response's
    turn runs the same way, with no client watching it."""

    mcp: McpClient
    """Where the MCP calls a request approved run before its turn."""

    def driver(self, connection: Connection, emit: exchange.Emit) -> Driver: ...


Connect = Callable[[ConnectionCache, Observer], Connection]
"""The `Connection` of one HTTP request, for its cache and observer."""


@dataclass
class BackgroundRoutes:
    """The HTTP routes of background responses: create (`POST /v1/responses` with
    `background: true`), resume (`GET /v1/responses/{id}?stream=true`, from this process
    or the store) and cancel (`POST /v1/responses/{id}/cancel`). `reads` is the key's
    slot for store reads (`KeyedSlots.slot`)."""

    work: BackgroundWork
    ledger: Ledger
    reads: Callable[[str | None], AbstractAsyncContextManager[None]]
    turns: Turns

    async def create(
        self,
        receive: Receive,
        send: Send,
        principal: str | None,
        connect: Connect,
        request: CreateRequest,
        size: int,
        parse_ns: int,
        mcp: McpTurn | None,
    ) -> None:
        """`background: true`: the response runs as a job of its own (`Job`);
        this request answers with it queued, or follows its events when streamed. Its
        client going away stops only the following."""
        if not request.store:
            raise ProtocolError(
                "invalid_value", "A background response must be stored: set store=true.", "store"
            )
        if self.ledger.store is None:
            raise ProtocolError(
                "invalid_value",
                "Background responses need a durable store, and this server runs without "
                "one (--data-dir).",
                "background",
            )
        books = self.ledger.observer(principal, "http")
        cache = self.ledger.http_cache(books.owner)
        # Read as a foreground request's are (`HttpApi._create`): its conversation too.
        await self.ledger.warm_request(cache, request, books.owner)
        # Admitted with no await before it runs: requests arriving together cannot all
        # pass the bound.
        refusal = self.work.admit(books.owner)
        if refusal is not None:
            self.ledger.metrics.refusals.labels(refusal.code).inc()
            raise refusal
        connection = connect(cache, exchange.Exchange(books, cache))
        job = Job(books.owner, request.stream, self.work.limits.event_bytes)
        job.connection = connection
        connection.receive_request(request, size, parse_ns, mcp)
        self.work.run(job, self._run(connection, job))
        error = await job.created
        if error is not None:
            await exchange.reply_refusal(send, error)
        elif request.stream:
            await self._follow(receive, send, job, -1)
        else:
            await exchange.reply(send, 200, job.queued)

    async def _run(self, connection: Connection, job: Job) -> None:
        """A background response's whole turn, in the job's task: no client watches it.
        A cancel (`Job.cancel`) ends the response and stops its engine work through the
        job's driver, which then sends and commits its cancelled ending."""
        actions = await exchange.rendered(connection, self.turns.mcp)
        driver = self.turns.driver(connection, job.emit)
        job.driver = driver
        try:
            driver.dispatch(actions)
            await driver.settle()
        finally:
            job.driver = None
            await driver.close()

    async def _follow(self, receive: Receive, send: Send, job: Job, after: int) -> None:
        """SSE: `job`'s events after sequence number `after`, then the live ones until
        it ends or the client goes away (which stops only this stream)."""
        await send({"type": "http.response.start", "status": 200, "headers": exchange.SSE_HEADERS})
        gone = asyncio.ensure_future(exchange.disconnected(receive))
        try:
            sent = after + 1
            while not gone.done():
                while sent < len(job.events):
                    frame = exchange.sse_frame(job.events[sent])
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
                    sent += 1
                if job.final or job.ended.is_set():
                    break
                changed = asyncio.ensure_future(job.changed())
                await asyncio.wait((changed, gone), return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
        finally:
            gone.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def resume(
        self, receive: Receive, send: Send, response_id: str, owner: str | None, after: int
    ) -> None:
        """`GET /v1/responses/{id}?stream=true&starting_after=N`: a streamed background
        response's events after N, from this process while it runs here, else from the
        store once it ended."""
        job = self.work.live(response_id, owner)
        if job is not None:
            if not job.streamed:
                raise _not_streamed(response_id)
            if after >= len(job.events):
                raise _past_last(after, len(job.events))
            await self._follow(receive, send, job, after)
            return
        record = await self._record(response_id, owner)
        if not record.streamed:
            raise _not_streamed(response_id)
        await self._follow_stored(receive, send, record, after)

    async def _follow_stored(
        self, receive: Receive, send: Send, record: BackgroundRecord, after: int
    ) -> None:
        """SSE from the store: the kept events after `after`, then, while the response
        runs on another process, those it writes there (every `CANCEL_POLL` s), until it
        ended or the client goes away."""
        records = self.work.records
        assert records is not None
        async with self.reads(record.owner):
            count, events = await records.events(record.id, after)
        if not record.live and count == 0:
            raise ProtocolError(
                "events_not_kept",
                f"Response '{record.id}' failed with the process that ran it before any "
                "of its events were written.",
                "response_id",
            )
        if not record.live and after >= count:
            raise _past_last(after, count)
        await send({"type": "http.response.start", "status": 200, "headers": exchange.SSE_HEADERS})
        gone = asyncio.ensure_future(exchange.disconnected(receive))
        try:
            found: BackgroundRecord | None = record
            while found is not None:
                for event in events:
                    body = exchange.sse_frame(event)
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                after += len(events)
                if not found.live:
                    break
                # Polling the other process's writes, not synchronisation.
                await asyncio.wait((gone,), timeout=CANCEL_POLL)
                if gone.done():
                    break
                # The status first: once it ended, its last events are there too.
                async with self.reads(record.owner):
                    found = await records.get(record.id, record.owner)
                    _, events = await records.events(record.id, after)
        finally:
            gone.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _record(self, response_id: str, owner: str | None) -> BackgroundRecord:
        """The store's record of a background response; 404 when there is no such
        response, 400 when it is not a background one."""
        records = self.work.records
        store = self.ledger.store
        if records is None or store is None:
            raise exchange.not_found(response_id)
        async with self.reads(owner):
            record = await records.get(response_id, owner)
            if record is not None:
                return record
            if await store.get(response_id, owner) is None:
                raise exchange.not_found(response_id)
        raise ProtocolError(
            "response_not_background",
            f"Response '{response_id}' was not created with background=true: only "
            "background responses can be cancelled or streamed again.",
            "response_id",
        )

    async def cancel(self, send: Send, response_id: str, owner: str | None) -> None:
        """`POST /v1/responses/{id}/cancel`: a background response ends `cancelled`; one
        that already ended answers as it ended (a cancel is idempotent, as OpenAI's)."""
        job = self.work.live(response_id, owner)
        if job is not None:
            job.cancel()
            while not (job.final or job.ended.is_set()):
                await job.changed()
            await exchange.reply(send, 200, job.snapshot)
            return
        record = await self._record(response_id, owner)
        if record.live:
            record = await self._cancel_elsewhere(record)
        store = self.ledger.store
        found = None if store is None else await store.get(response_id, owner)
        await exchange.reply(send, 200, record.response if found is None else found)

    async def _cancel_elsewhere(self, record: BackgroundRecord) -> BackgroundRecord:
        """Ask the process running `record` to cancel it, and wait until it ended: the
        process reads its cancels every `CANCEL_POLL` s; one that died meanwhile has
        its response failed within a lease. Past that, 409."""
        records = self.work.records
        assert records is not None
        await records.request_cancel(record.id)
        waits = int((CANCEL_POLL + self.work.limits.lease) / CANCEL_WAIT) + 2
        for _ in range(waits):
            await asyncio.sleep(CANCEL_WAIT)  # polling the store, not synchronisation
            found = await records.get(record.id, record.owner)
            if found is None:
                raise exchange.not_found(record.id)  # deleted meanwhile
            if not found.live:
                return found
        raise _elsewhere(record.id)


def _not_streamed(response_id: str) -> ProtocolError:
    return ProtocolError(
        "response_not_streamed",
        f"Response '{response_id}' was not created with stream=true and background=true: "
        "it has no events to stream again.",
        "stream",
    )


def _past_last(after: int, count: int) -> ProtocolError:
    return ProtocolError(
        "invalid_value",
        f"starting_after={after} is past the last event of this response (sequence number "
        f"{count - 1}).",
        "starting_after",
    )


def _elsewhere(response_id: str) -> ProtocolError:
    return ProtocolError(
        "response_running_elsewhere",
        f"Response '{response_id}' runs on another hotloop process, which did not answer; "
        "ask again through the same route (its session), or once it ended.",
        "response_id",
        status=409,
    )


__all__ = [
    "CANCEL_POLL",
    "BackgroundLimits",
    "BackgroundRoutes",
    "BackgroundWork",
    "Connect",
    "Job",
    "Turns",
]
