"""Background responses' tables (`store/background_tables.py`) on SQLite and PostgreSQL: what
a key keeps there (each row's Response object and each kept event) counts in its
storage quota exactly as the database holds it, through every write (the row saved
again, events flushed twice, a dead process's response failed by the sweep), after a
reopen, and until a delete frees it; a background response whose process stopped
before it finished (a row and its events, no stored response) is deleted as the
response, by its owner only and only once it ended."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
from hotloop.store import Store
from hotloop.store.background_tables import BackgroundRecord, BackgroundRecords
from hotloop.store.quota import Usage
from hotloop.store.writer import BackgroundStore
from test_store import Backend, backend, response

__all__ = ["backend"]  # the fixture, parametrized over both databases

OWNER, OTHER = "key_a", "key_b"


def record(
    rid: str, status: str, process: str = "node/1/a", owner: str = OWNER
) -> BackgroundRecord:
    body = orjson.dumps({"id": rid, "object": "response", "status": status, "output": []})
    return BackgroundRecord(rid, owner, process, status, True, body)


def events(first: int, count: int) -> list[bytes]:
    return [b'{"type":"response.output_text.delta","delta":"%d"}' % n for n in range(first, count)]


def held(backend: Backend, owner: str) -> Usage:
    """What the database holds for `owner`, summed table by table as an operator would."""
    parts = (
        ("length(response)", "background", "owner = :owner"),
        (
            "length(e.event)",
            "background_events AS e JOIN background AS b ON b.id = e.response_id",
            "b.owner = :owner",
        ),
        ("length(response) + length(input_items)", "responses", "owner = :owner"),
        (
            "length(i.item)",
            "input_items AS i JOIN responses AS r ON r.id = i.response_id",
            "r.owner = :owner",
        ),
    )
    total = Usage()
    for size, tables, mine in parts:
        query = f"SELECT coalesce(sum({size}), 0), count(*) FROM {tables} WHERE {mine}"
        ((size_of, rows),) = backend.query(query.replace(":owner", f"'{owner}'"))
        total += Usage(int(size_of), int(rows))
    return total


def counted(store: Store, owner: str) -> Usage:
    assert isinstance(store, BackgroundStore)
    return store.quota.of(owner)


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[Store]:
    s = await backend.open()
    yield s
    await s.close()


async def test_kept_background_responses_count_in_the_quota_as_stored(
    backend: Backend, store: Store
) -> None:
    records = BackgroundRecords(store, "node/1/a")
    # Queued, then running with events flushed every second, the last flush racing the
    # final save (both carry events 10-14: kept and counted once).
    await records.save(record("resp_done", "queued"))
    await records.save(record("resp_done", "in_progress"))
    await records.append([("resp_done", 0, events(0, 15))])
    await records.save(record("resp_done", "completed"), events(10, 20), 10)
    await store.put(response("resp_done", owner=OWNER))
    # Another one, left running by a process that stops saying it is alive.
    dead = BackgroundRecords(store, "node/2/b")
    await dead.save(record("resp_orphan", "in_progress", "node/2/b"))
    await dead.append([("resp_orphan", 0, events(0, 5))])
    await dead.save(record("resp_others", "in_progress", "node/2/b", owner=OTHER))
    # A lease a minute long that ended a minute ago: every process is past it.
    assert sorted(await records.sweep(-60)) == ["resp_orphan", "resp_others"]
    assert await records.sweep(-60) == []
    assert counted(store, OWNER) == held(backend, OWNER)
    assert counted(store, OTHER) == held(backend, OTHER)
    assert held(backend, OWNER).rows == 2 + 20 + 6 + 2  # rows, events, a response
    # Read back from the database as another store opens on it.
    reopened = await backend.open(quota_bytes=held(backend, OWNER).bytes)
    try:
        assert counted(reopened, OWNER) == held(backend, OWNER)
        assert reopened.quota_refusal(OWNER) is not None
    finally:
        await reopened.close()


async def test_a_background_response_without_its_stored_response_is_deleted_by_its_owner(
    backend: Backend, store: Store
) -> None:
    records = BackgroundRecords(store, "node/1/a")
    # Failed when its process stopped: a row and its events, nothing in `responses`.
    await records.save(record("resp_failed", "failed"), events(0, 30))
    await records.save(record("resp_running", "in_progress"), events(0, 3))
    assert counted(store, OWNER) == held(backend, OWNER) != Usage()
    assert not await store.delete("resp_failed", OTHER)
    assert not await store.delete("resp_running", OWNER)  # running: cancelled first
    assert await store.delete("resp_failed", OWNER)
    assert backend.query("SELECT id FROM background") == [("resp_running",)]
    assert backend.query("SELECT DISTINCT response_id FROM background_events") == [
        ("resp_running",)
    ]
    assert counted(store, OWNER) == held(backend, OWNER)
    assert not await store.delete("resp_failed", OWNER)
    # With its stored response, everything goes, whatever the row says.
    await store.put(response("resp_running", owner=OWNER))
    assert await store.delete("resp_running", OWNER)
    assert backend.query("SELECT count(*) FROM background_events") == [(0,)]
    assert counted(store, OWNER) == held(backend, OWNER) == Usage()
