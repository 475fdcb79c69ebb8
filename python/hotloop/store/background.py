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
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import orjson

from hotloop.store import Store, may_read
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
_ORPHANS = """SELECT b.id, b.process, b.response, b.streamed FROM background AS b
LEFT JOIN background_processes AS p ON p.process = b.process
WHERE b.status IN ('queued', 'in_progress') AND (p.seen_at IS NULL OR p.seen_at < :before)"""


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

        def save(sql: Sql) -> None:
            now = _now()
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
            sql.many(
                _EVENT,
                [
                    {"id": record.id, "seq": seq, "event": e}
                    for seq, e in enumerate(events, start=first)
                ],
            )
            sql.rows(_BEAT, {"process": record.process, "now": now})

        await self._store.transact(save)

    async def append(self, events: Sequence[tuple[str, int, Sequence[bytes]]]) -> None:
        """Write the events of running responses, `(id, first sequence number,
        events)` each, in one transaction."""
        rows = [
            {"id": response_id, "seq": seq, "event": event}
            for response_id, first, batch in events
            for seq, event in enumerate(batch, start=first)
        ]
        await self._store.transact(lambda sql: sql.many(_EVENT, rows))

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

        def sweep(sql: Sql) -> list[str]:
            now = _now()
            before = now - int(lease * 1000)
            failed = []
            for response_id, process, response, streamed in sql.rows(_ORPHANS, {"before": before}):
                failure = orphaned(bytes(response), process)
                sql.rows(
                    "UPDATE background SET status = 'failed', response = :response,"
                    " updated_at = :now WHERE id = :id AND status IN ('queued', 'in_progress')",
                    {"id": response_id, "response": failure, "now": now},
                )
                if streamed:
                    # Its kept events end as its stream would have: with the failure.
                    ((last,),) = sql.rows(
                        "SELECT max(seq) FROM background_events WHERE response_id = :id",
                        {"id": response_id},
                    )
                    if last is not None:
                        event = failed_event(failure, int(last) + 1)
                        sql.many(_EVENT, [{"id": response_id, "seq": last + 1, "event": event}])
                failed.append(response_id)
            sql.rows("DELETE FROM background_processes WHERE seen_at < :before", {"before": before})
            return failed

        return await self._store.transact(sweep)


__all__ = [
    "LIVE",
    "TERMINAL",
    "BackgroundRecord",
    "BackgroundRecords",
    "failed_event",
    "orphaned",
]
