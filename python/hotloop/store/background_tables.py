"""Background responses in the store: their live status, their kept events and the
liveness of the processes running them.

A background response (`background: true`, `transport/background.py`) runs without its
client, so its status must be readable while it runs and after the process that ran it
is gone. Three tables, in both backends (the SQL here is shared; `:name` parameters,
no casts, so PostgreSQL takes it once `named` rewrote them):

- `background`: one row per background response: its owner, the process running it,
  its status and its latest Response object (`queued`/`in_progress` while it runs, the
  terminal one after), and whether another process was asked to cancel it (the
  process running it reads its cancel requests every second). The finished response
  itself is in `responses` like any stored one; this row is what `GET` reads while no
  terminal response is there.
- `background_events`: the events of a streamed one, by sequence number, written by
  the process running it every second and when it ends (a resume on that process
  reads them from its memory; on another, from here).
- `background_processes`: when each process running background work last said it was
  alive. A row still live whose process has not said so within the lease belongs to a
  dead process: `sweep` marks it `failed` (it is not resumed: its engine state died
  with it, and re-running a request the client may have acted on half of is not safe).

What a key keeps here counts towards its storage quota (`quota.py`), as its stored
responses do: each row's Response object and each kept event, one row each. Every
write reports what it added (`Store.counted`); a delete (`deleted`, in the databases'
own delete) frees it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import orjson

from hotloop.store.interface import Store, may_read
from hotloop.store.quota import Usage, owned_usage
from hotloop.store.sql import Sql

T = TypeVar("T")

LIVE = ("queued", "in_progress")
TERMINAL = frozenset(("completed", "failed", "incomplete", "cancelled"))


@dataclass(frozen=True)
class BackgroundRecord:
    """A background response as the store holds it."""

    id: str
    owner: str | None
    process: str
    status: str
    streamed: bool
    response: bytes

    @property
    def live(self) -> bool:
        return self.status in LIVE


_SAVE = """INSERT INTO background (id, owner, process, status, streamed, response, updated_at)
VALUES (:id, :owner, :process, :status, :streamed, :response, :now)
ON CONFLICT (id) DO UPDATE SET process = excluded.process, status = excluded.status,
response = excluded.response, updated_at = excluded.updated_at"""
_BEAT = """INSERT INTO background_processes (process, seen_at) VALUES (:process, :now)
ON CONFLICT (process) DO UPDATE SET seen_at = excluded.seen_at"""
_EVENT = """INSERT INTO background_events (response_id, seq, event) VALUES (:id, :seq, :event)
ON CONFLICT (response_id, seq) DO NOTHING"""
_ORPHANS = """SELECT b.id, b.owner, b.process, b.response, b.streamed FROM background AS b
LEFT JOIN background_processes AS p ON p.process = b.process
WHERE b.status IN ('queued', 'in_progress') AND (p.seen_at IS NULL OR p.seen_at < :before)"""
_KEPT = """SELECT coalesce(sum(length(event)), 0), count(*) FROM background_events
WHERE response_id = :id"""

# What each key's background responses hold (`records.USAGE_QUERY` adds it to the
# responses'): their rows, and the events kept for them.
USAGE_PARTS = owned_usage("background", "response", "background_events", "event", "response_id")


def _now() -> int:
    return int(time.time() * 1000)


def orphaned(response: bytes, process: str) -> bytes:
    """The Response object of a background response whose process died, as `failed`."""
    body = orjson.loads(response)
    body["status"] = "failed"
    body["error"] = {
        "code": "server_error",
        "message": f"The process running this background response ({process}) stopped "
        "before it finished; it was not resumed. Create it again.",
    }
    return orjson.dumps(body)


def failed_event(response: bytes, seq: int) -> bytes:
    """The `response.failed` event carrying `response`, numbered `seq`."""
    return b'{"type":"response.failed","response":%b,"sequence_number":%d}' % (response, seq)


def _row(sql: Sql, response_id: str) -> tuple[str | None, int, str] | None:
    """The owner of `response_id`'s row, the size of its Response object, its status."""
    row = sql.execute(
        "SELECT owner, length(response), status FROM background WHERE id = :id",
        {"id": response_id},
    ).fetchone()
    return None if row is None else (row[0], int(row[1]), row[2])


def _keep(sql: Sql, response_id: str, first: int, events: Sequence[bytes]) -> Usage:
    """Write `response_id`'s events from sequence number `first` on, those it does not
    keep yet (a flush and the final save may both carry one), and what they add."""
    if not events:
        return Usage()
    kept = {
        int(row[0])
        for row in sql.rows(
            "SELECT seq FROM background_events WHERE response_id = :id"
            " AND seq >= :first AND seq < :end",
            {"id": response_id, "first": first, "end": first + len(events)},
        )
    }
    new = [(seq, e) for seq, e in enumerate(events, start=first) if seq not in kept]
    sql.many(_EVENT, [{"id": response_id, "seq": seq, "event": e} for seq, e in new])
    return Usage(sum(len(e) for _, e in new), len(new))


def deleted(
    sql: Sql, response_id: str, owner: str | None, stored: bool
) -> tuple[str | None, Usage] | None:
    """Delete the row of background response `response_id` and its kept events, in the
    database's delete of the response (`stored`: its finished response was there too,
    and goes whatever the row's status); without a stored response, only once the row
    ended (one running is cancelled first) and only if `owner` may read it. Returns
    the row's owner and what the row and its events held; None if nothing was
    deleted."""
    found = _row(sql, response_id)
    if found is None:
        return None
    row_owner, size, status = found
    if not stored and (status in LIVE or not may_read(row_owner, owner)):
        return None
    events = sql.execute(_KEPT, {"id": response_id}).fetchone()
    sql.execute("DELETE FROM background WHERE id = :id", {"id": response_id})
    sql.execute("DELETE FROM background_events WHERE response_id = :id", {"id": response_id})
    return row_owner, Usage(size + int(events[0]), 1 + int(events[1]))


class BackgroundRecords:
    """The background tables of `store` (see the module docstring)."""

    def __init__(self, store: Store, process: str) -> None:
        self._store = store
        self.process = process

    async def save(
        self, record: BackgroundRecord, events: Sequence[bytes] = (), first: int = 0
    ) -> None:
        """Write the record's row and its events from sequence number `first` on, and
        say this process is alive, in one transaction."""

        def save(sql: Sql) -> Usage:
            now = _now()
            before = _row(sql, record.id)
            added = Usage(len(record.response), 1) - (
                Usage() if before is None else Usage(before[1], 1)
            )
            sql.rows(
                _SAVE,
                {
                    "id": record.id,
                    "owner": record.owner,
                    "process": record.process,
                    "status": record.status,
                    "streamed": int(record.streamed),
                    "response": record.response,
                    "now": now,
                },
            )
            added += _keep(sql, record.id, first, events)
            sql.rows(_BEAT, {"process": record.process, "now": now})
            return added

        self._store.counted(record.owner, await self._store.transact(save))

    async def append(self, events: Sequence[tuple[str, int, Sequence[bytes]]]) -> None:
        """Write the events of running responses, `(id, first sequence number,
        events)` each, in one transaction; they count for the owner of each one's row."""

        def append(sql: Sql) -> list[tuple[str | None, Usage]]:
            added = []
            for response_id, first, batch in events:
                found = _row(sql, response_id)
                usage = _keep(sql, response_id, first, batch)
                if found is not None:
                    added.append((found[0], usage))
            return added

        for owner, usage in await self._store.transact(append):
            self._store.counted(owner, usage)

    async def beat(self) -> None:
        """This process is alive (its live rows are not orphans)."""
        process = self.process
        await self._store.transact(lambda sql: sql.rows(_BEAT, {"process": process, "now": _now()}))

    async def get(self, response_id: str, owner: str | None) -> BackgroundRecord | None:
        def get(sql: Sql) -> BackgroundRecord | None:
            rows = sql.rows(
                "SELECT owner, process, status, streamed, response FROM background WHERE id = :id",
                {"id": response_id},
            )
            if not rows:
                return None
            stored_owner, process, status, streamed, response = rows[0]
            return BackgroundRecord(
                response_id, stored_owner, process, status, bool(streamed), bytes(response)
            )

        if "\x00" in response_id:
            return None  # no stored id holds one, and PostgreSQL refuses it in a query
        record = await self._store.query(get)
        if record is None or not may_read(record.owner, owner):
            return None
        return record

    async def events(self, response_id: str, after: int) -> tuple[int, list[bytes]]:
        """How many events the response kept, and those after sequence number `after`."""

        def events(sql: Sql) -> tuple[int, list[bytes]]:
            ((count,),) = sql.rows(
                "SELECT count(*) FROM background_events WHERE response_id = :id",
                {"id": response_id},
            )
            rows = sql.rows(
                "SELECT event FROM background_events WHERE response_id = :id AND seq > :after"
                " ORDER BY seq",
                {"id": response_id, "after": after},
            )
            return int(count), [bytes(row[0]) for row in rows]

        return await self._store.query(events)

    async def request_cancel(self, response_id: str) -> None:
        """Ask the process running `response_id` to cancel it (`cancels`)."""
        await self._store.transact(
            lambda sql: sql.rows(
                "UPDATE background SET cancel_requested = 1"
                " WHERE id = :id AND status IN ('queued', 'in_progress')",
                {"id": response_id},
            )
        )

    async def cancels(self) -> list[str]:
        """This process's live responses another process was asked to cancel."""
        rows = await self._store.query(
            lambda sql: sql.rows(
                "SELECT id FROM background WHERE process = :process AND cancel_requested = 1"
                " AND status IN ('queued', 'in_progress')",
                {"process": self.process},
            )
        )
        return [row[0] for row in rows]

    async def sweep(self, lease: float) -> list[str]:
        """Mark `failed` every live row whose process has not said it is alive for
        `lease` seconds; forget such processes. Returns the ids it failed."""

        def sweep(sql: Sql) -> list[tuple[str, str | None, Usage]]:
            now = _now()
            before = now - int(lease * 1000)
            failed = []
            for response_id, owner, process, response, streamed in sql.rows(
                _ORPHANS, {"before": before}
            ):
                failure = orphaned(bytes(response), process)
                updated = sql.execute(
                    "UPDATE background SET status = 'failed', response = :response,"
                    " updated_at = :now WHERE id = :id AND status IN ('queued', 'in_progress')",
                    {"id": response_id, "response": failure, "now": now},
                )
                if updated.rowcount == 0:
                    continue  # it ended meanwhile (another process's sweep, or its own)
                added = Usage(len(failure) - len(response), 0)
                if streamed:
                    # Its kept events end as its stream would have: with the failure.
                    ((last,),) = sql.rows(
                        "SELECT max(seq) FROM background_events WHERE response_id = :id",
                        {"id": response_id},
                    )
                    if last is not None:
                        event = failed_event(failure, int(last) + 1)
                        added += _keep(sql, response_id, int(last) + 1, [event])
                failed.append((response_id, owner, added))
            sql.rows("DELETE FROM background_processes WHERE seen_at < :before", {"before": before})
            return failed

        failed = await self._store.transact(sweep)
        for _, owner, added in failed:
            self._store.counted(owner, added)
        return [response_id for response_id, _, _ in failed]


__all__ = [
    "LIVE",
    "TERMINAL",
    "USAGE_PARTS",
    "BackgroundRecord",
    "BackgroundRecords",
    "deleted",
    "failed_event",
    "orphaned",
]
