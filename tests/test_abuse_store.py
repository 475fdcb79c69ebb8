"""Attacks on the store, and unlucky operators' stores (issue 21): what one tenant's
stored responses, deletes and storms can do to another tenant's, and what a hung
database or cache does to everyone's. Real PostgreSQL and Redis servers
(`pg_server.py`, `redis_server.py`); several `Store`s on one database are several
hotloop nodes."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from hotloop.store import Store, StoredResponse, StoreError, open_store
from hotloop.store.postgres import PostgresDatabase
from hotloop.store.records import ItemRows, Rejected, Row
from hotloop.store.redis_cache import CachedStore
from hotloop.store.sqlite import SQLiteDatabase
from hotloop.store.writer import CHUNK_BYTES, MAX_BATCH_BYTES, MAX_BATCH_ROWS, BackgroundStore
from hotloop_process import (
    HANG_GUARD,
    TERMINAL,
    HotloopProcess,
    acknowledged,
    body,
    ws_turn,
)
from loop_order import scheduled_callbacks_ran
from pg_server import PostgresServer
from redis_server import RedisServer
from shell_tool import TOOLS
from test_store import GatedDatabase, response
from test_store_faults import FAST, health, turn_outcome, unreadable, wait_healthy
from websockets.sync.client import ClientConnection, connect


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait until `condition()` holds, asking again every few milliseconds (the thing
    waited for is in another process: no event to wait on); fail after 30 s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while not condition():
        assert loop.time() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.005)


async def delete_all(store: Store, ids: list[str], owner: str) -> None:
    for rid in ids:
        assert await store.delete(rid, owner)


def lock_waits(url: str) -> int:
    """How many sessions of the database at `url` wait on a lock now."""
    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    return 0 if row is None else int(row[0])


async def test_a_delete_never_takes_a_tool_list_from_another_nodes_open_commit(
    postgres_server: PostgresServer,
) -> None:
    """Tenant A on node 1 deletes its last response with the shared tool list while
    tenant B's commit on node 2, holding the same list, is still open (held open here
    by a third session that owns B's response id, as a slow commit would be). The list
    must survive: B's response reads back as JSON and continues."""
    url = postgres_server.fresh_database()
    node_1, node_2 = await open_store(url), await open_store(url)
    try:
        await node_1.put(response("resp_a", owner="key_a", tools=TOOLS))
        with psycopg.connect(url) as blocker:
            # An uncommitted row with B's id: B's commit waits on it after it has
            # written (or, fixed, locked) the tool list.
            blocker.execute(
                "INSERT INTO responses (id, created_at, response, input_items,"
                " output_token_ids) VALUES ('resp_b', 0, '', '', '')"
            )
            b_put = asyncio.create_task(node_2.put(response("resp_b", owner="key_b", tools=TOOLS)))
            await until(lambda: lock_waits(url) == 1, "B's commit waits")
            a_delete = asyncio.create_task(node_1.delete("resp_a", "key_a"))
            # A's delete either finishes (the list gone under B) or waits for B.
            await until(lambda: a_delete.done() or lock_waits(url) == 2, "A's delete ran")
            blocker.rollback()
        await b_put
        assert await a_delete
        stored = await node_2.get("resp_b", "key_b")
        assert stored is not None and orjson.loads(stored)["tools"] == TOOLS
        chain = await node_1.load_chain("resp_b", "key_b")
        assert chain is not None and orjson.loads(chain.head.response)["tools"] == TOOLS
    finally:
        await node_1.close()
        await node_2.close()


async def test_deletes_and_stores_of_two_tenants_on_two_nodes_leave_every_row_whole(
    postgres_server: PostgresServer,
) -> None:
    """The reproduction as it happens: tenant A stores and deletes on node 1 while
    tenant B stores on node 2, all with the same tools, for many rounds; every one of
    B's responses reads back as JSON and continues."""
    url = postgres_server.fresh_database()
    node_1, node_2 = await open_store(url), await open_store(url)
    try:
        for round_ in range(40):
            a_ids = [f"resp_a{round_}_{n}" for n in range(4)]
            b_ids = [f"resp_b{round_}_{n}" for n in range(4)]
            await asyncio.gather(
                *(node_1.put(response(i, owner="key_a", tools=TOOLS)) for i in a_ids)
            )
            await asyncio.gather(
                delete_all(node_1, a_ids, "key_a"),
                *(node_2.put(response(i, owner="key_b", tools=TOOLS)) for i in b_ids),
            )
            for rid in b_ids:
                stored = await node_2.get(rid, "key_b")
                assert stored is not None and orjson.loads(stored)["tools"] == TOOLS, rid
                assert await node_1.load_chain(rid, "key_b") is not None, rid
            for rid in b_ids:
                assert await node_2.delete(rid, "key_b")
    finally:
        await node_1.close()
        await node_2.close()


def server_processes(server: PostgresServer) -> list[int]:
    """The postmaster and every backend of `server`: all of a hung host's server."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[1]) == postmaster:
            children.append(int(stat.parent.name))
    return [postmaster, *children]


@contextmanager
def stopped(server: PostgresServer) -> Iterator[None]:
    """`server` hung (SIGSTOP: its kernel still accepts and acknowledges), then resumed."""
    processes = server_processes(server)
    try:
        for pid in processes:
            os.kill(pid, signal.SIGSTOP)
        yield
    finally:
        for pid in processes:
            os.kill(pid, signal.SIGCONT)


async def test_a_hung_postgresql_fails_stored_responses_and_health_in_time(
    postgres_server: PostgresServer,
) -> None:
    """A stopped server fails a commit with `store_unavailable` and marks the store
    unhealthy (`/health` 503) after the busy timeout, not after the server resumes; a
    read fails too. The bound on the wait below only keeps the test from hanging: it
    is twenty times the busy timeout."""
    url = postgres_server.fresh_database()
    store = await open_store(url, busy_timeout=0.5)
    try:
        await store.put(response("resp_before", owner="key_b", tools=TOOLS))
        with stopped(postgres_server):
            with pytest.raises(StoreError) as failed:
                await asyncio.wait_for(store.put(response("resp_hung", owner="key_b")), 10)
            assert failed.value.code == "store_unavailable"
            assert not store.healthy
            with pytest.raises(StoreError):
                await asyncio.wait_for(store.get("resp_before", "key_b"), 10)
        # Resumed: the writer's probe commits, and everything works again.
        await until(lambda: store.healthy, "the store is healthy again")
        await store.put(response("resp_after", owner="key_b"))
        assert await store.get("resp_before", "key_b") is not None
    finally:
        await store.close()


def turn_within(socket: ClientConnection, text: str, guard: float) -> dict[str, Any]:
    """`ws_turn` with a shorter guard (only bounds a broken run)."""
    socket.send(orjson.dumps({"type": "response.create", **body(text)}).decode())
    while True:
        event: dict[str, Any] = orjson.loads(socket.recv(guard))
        if event["type"] in TERMINAL:
            return event


def test_a_hung_postgresql_fails_turns_and_health_not_completes_them_later(
    postgres_server: PostgresServer,
) -> None:
    """Issue 21 defect 4 end to end: with the database stopped, a `store: true` turn
    ends `response.failed` (`store_unavailable`) and `/health` answers 503 while it is
    still stopped; resumed, turns complete again and nothing acknowledged is lost."""
    args = [*FAST, "--store", postgres_server.fresh_database(), "--store-busy-timeout", "1"]
    acked: list[str] = []
    with HotloopProcess(args) as server, connect(server.ws_url) as socket:
        acked.append(acknowledged(ws_turn(socket, "before")) or "")
        with stopped(postgres_server):
            hung = [turn_within(socket, "while hung", 20) for _ in range(2)]
            assert [turn_outcome(e) for e in hung] == ["store_unavailable"] * 2
            assert health(server) == 503
        wait_healthy(server)
        after = ws_turn(socket, "after")
        assert turn_outcome(after) == "completed"
        acked.append(acknowledged(after) or "")
        assert unreadable(server, acked) == []


class RecordingDatabase(GatedDatabase):
    """A `GatedDatabase` that keeps the ids of every batch, in commit order."""

    def __init__(self) -> None:
        super().__init__()
        self.committed: list[list[str]] = []
        self.bulk: list[bool] = []
        """Whether each batch went in the bulk lane (a chunk, or a row too large for a
        batch of rows)."""
        self.item_bytes: list[int] = []
        """Bytes of input item rows committed, per batch."""
        self.row_counts: list[int] = []
        """Rows inserted (responses and input items), per batch."""

    def write(self, rows: Sequence[Row], rejected: Rejected, items: ItemRows = ()) -> None:
        self._record(rows, rejected, items, bulk=False)

    def write_bulk(self, rows: Sequence[Row], rejected: Rejected, items: ItemRows = ()) -> None:
        self._record(rows, rejected, items, bulk=True)

    def _record(
        self, rows: Sequence[Row], rejected: Rejected, items: ItemRows, *, bulk: bool
    ) -> None:
        super().write(rows, rejected, items)
        self.bulk.append(bulk)
        self.committed.append([r.id for r in rows])
        listed = [item for _, _, _, item in items]
        listed += [item for row in rows for _, _, item in row.items]
        self.item_bytes.append(sum(map(len, listed)))
        self.row_counts.append(len(rows) + len(listed))


async def flooded(puts: list[StoredResponse], *, max_batch: int = 256) -> list[list[str]]:
    """Commit `puts` queued all at once behind a commit under way (tenant A's first
    response, held until everything is queued); the batches after it."""
    db = RecordingDatabase()
    db.gate.clear()
    store = await BackgroundStore.open(lambda: db, commit_window=0, max_batch=max_batch)
    try:
        held = asyncio.create_task(store.put(response("resp_held", owner="key_a")))
        await asyncio.get_running_loop().run_in_executor(None, db.entered.wait)
        queued = [asyncio.create_task(store.put(p)) for p in puts]
        await scheduled_callbacks_ran()  # every put is queued (none can commit: the gate is shut)
        db.gate.set()
        await asyncio.gather(held, *queued)
    finally:
        await store.close()
    durable = [ids for ids in db.committed if ids]
    assert durable[0] == ["resp_held"]
    return durable[1:]


async def test_a_key_flooding_the_writer_with_large_responses_gets_its_turn_per_batch() -> None:
    """Issue 21 defect 5: tenant A's large stored warm-ups queued ahead of tenant B's
    turn. B's response commits in the first batch after the one under way, and that
    batch holds at most `max_batch_bytes` (256 KiB) of A's, not all of A's queue."""
    items = orjson.dumps([{"role": "user", "content": "x" * 200}] * 250)  # ~57 KB
    flood = [response(f"resp_a{n}", owner="key_a", input_json=items) for n in range(20)]
    batches = await flooded([*flood, response("resp_b", owner="key_b")])
    first = batches[0]
    assert "resp_b" in first
    assert len(first) - 1 <= (256 * 1024) // len(items)
    assert sorted(r for batch in batches for r in batch) == sorted(
        ["resp_b", *(p.id for p in flood)]
    )


async def large_then_small(items: bytes) -> RecordingDatabase:
    """Tenant A's response of `items` (a JSON array) put first, its first batch held
    until B's small response is queued behind it; the batches committed."""
    db = RecordingDatabase()
    db.gate.clear()
    store = await BackgroundStore.open(lambda: db, commit_window=0)
    try:
        large = asyncio.create_task(store.put(response("resp_a", owner="key_a", input_json=items)))
        await asyncio.get_running_loop().run_in_executor(None, db.entered.wait)
        small = asyncio.create_task(store.put(response("resp_b", owner="key_b")))
        await scheduled_callbacks_ran()  # B's put is queued (small: prepared on the loop)
        db.gate.set()
        await asyncio.gather(large, small)
    finally:
        await store.close()
    return db


async def test_a_large_response_commits_in_chunks_between_other_keys_responses() -> None:
    """Issue 21 defect 5: one response of 5,000 input items no longer holds the writer
    for the whole of its commit: its item rows go in chunks (`CHUNK_BYTES`), a batch
    at most `MAX_BATCH_BYTES`, and B's response, put while the first batch commits,
    commits in the next one; A's response row commits last, after all of its items."""
    db = await large_then_small(
        orjson.dumps([{"role": "user", "content": f"item {n} " + "x" * 40} for n in range(5000)])
    )
    with_b = next(n for n, ids in enumerate(db.committed) if "resp_b" in ids)
    assert with_b == 1
    # The batch under way, then B's: each at most MAX_BATCH_BYTES of A's item rows.
    assert db.item_bytes[0] <= MAX_BATCH_BYTES + 200
    assert db.item_bytes[1] <= MAX_BATCH_BYTES + 200
    assert sum(db.item_bytes) > 5 * MAX_BATCH_BYTES  # what used to be one commit
    assert db.committed[-1] == ["resp_a"]
    assert len(db.rows["resp_a"].items) < 5000  # the rest went ahead in chunks


async def test_a_response_of_many_small_items_commits_a_bounded_number_of_rows_per_batch() -> None:
    """Issue 21 defect 5 on PostgreSQL: a row costs PostgreSQL far more than its bytes,
    so 32 KiB of A's small items (over 200 rows) held B's turn 3x its quiet median.
    Now a batch inserts at most `MAX_BATCH_ROWS` rows, B's included, B's response
    still commits in the batch after the one under way, and that batch holds only A's
    share (half of it, two keys having queued work), not a whole batch of A's."""
    db = await large_then_small(
        orjson.dumps([{"role": "user", "content": str(n)} for n in range(3000)])
    )
    assert "resp_b" in db.committed[1]
    assert max(db.row_counts) <= MAX_BATCH_ROWS
    assert db.row_counts[1] == 2  # B's own rows: none of A's chunks (written ahead)
    assert sum(db.row_counts) == 3000 + 1 + 2


async def test_a_light_keys_commit_holds_no_chunk_and_chunks_go_one_at_a_time() -> None:
    """Issue 21 defect 5, the last 2x: B's commit waited for A's chunk under way and
    then committed a share of A's chunks with its own row (SQLite 3.0-3.7x its quiet
    median). Now every chunk is written ahead in the bulk lane (`Database.write_bulk`)
    in a batch of one chunk, every commit of rows holds rows only, and A's row commits
    after its last chunk (in the bulk lane too: with 100 KB of input it is larger than
    a batch of rows)."""
    db = await large_then_small(
        orjson.dumps([{"role": "user", "content": f"item {n} " + "x" * 40} for n in range(2000)])
    )
    for ids, bulk, size in zip(db.committed, db.bulk, db.item_bytes, strict=True):
        assert bulk == (ids != ["resp_b"])
        assert size <= CHUNK_BYTES + 200
    assert db.committed[1] == ["resp_b"]
    assert db.committed[-1] == ["resp_a"]


class HeldBulk(RecordingDatabase):
    """Two writers (as PostgreSQL's): the bulk lane's commits wait for `bulk_gate`, the
    rows lane's not."""

    writers = 2

    def __init__(self) -> None:
        super().__init__()
        self.bulk_gate = threading.Event()
        self.bulk_entered = threading.Event()

    def write_bulk(self, rows: Sequence[Row], rejected: Rejected, items: ItemRows = ()) -> None:
        self.bulk_entered.set()
        self.bulk_gate.wait(HANG_GUARD)
        super().write_bulk(rows, rejected, items)


def answered(rid: str, owner: str, size: int) -> StoredResponse:
    """A response whose output is one message of `size` bytes of text: a row that is
    large by itself, with no item rows to cut into chunks."""
    record = response(rid, owner=owner)
    message = {
        "type": "message",
        "id": f"msg_{rid}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "y" * size, "annotations": []}],
    }
    body = orjson.loads(record.response) | {"output": [message]}
    return replace(record, response=orjson.dumps(body))


async def test_a_key_coming_back_goes_before_the_key_whose_piece_was_just_taken() -> None:
    """Issue 39: a key whose queue emptied lost its turn: putting again, it went behind
    the flooding key, whose piece had just been taken, and waited for two of its large
    rows, the one under way and the next (B's median 2.6-5.0x its quiet one on SQLite,
    9x on PostgreSQL, under 350 KB outputs). Now the key whose piece the writer took
    longest ago goes first: B's large response, put while A's is being written with
    more of A's queued before it, commits next, then A's in order."""
    db = RecordingDatabase()
    store = await BackgroundStore.open(lambda: db, commit_window=0)
    try:
        await store.put(answered("resp_b0", "key_b", MAX_BATCH_BYTES))
        db.gate.clear()
        held = asyncio.create_task(store.put(answered("resp_a0", "key_a", MAX_BATCH_BYTES)))
        await asyncio.get_running_loop().run_in_executor(None, db.entered.wait)
        queued = [
            asyncio.create_task(store.put(answered(f"resp_a{n}", "key_a", MAX_BATCH_BYTES)))
            for n in (1, 2, 3)
        ]
        queued.append(asyncio.create_task(store.put(answered("resp_b1", "key_b", MAX_BATCH_BYTES))))
        await scheduled_callbacks_ran()  # every put is queued (none can commit: the gate is shut)
        db.gate.set()
        await asyncio.gather(held, *queued)
    finally:
        await store.close()
    assert db.committed == [
        ["resp_b0"],
        ["resp_a0"],
        ["resp_b1"],
        ["resp_a1"],
        ["resp_a2"],
        ["resp_a3"],
    ]


def chunked() -> StoredResponse:
    """A's response of 500 input items: committed in chunks ahead of its row."""
    items = orjson.dumps([{"role": "user", "content": f"item {n}"} for n in range(500)])
    return response("resp_a", owner="key_a", input_json=items)


BULK_PIECES = [
    pytest.param(chunked, id="chunks"),
    pytest.param(lambda: answered("resp_a", "key_a", MAX_BATCH_BYTES), id="large-row"),
]
"""A's response whose bulk pieces B's commit must not wait for: chunks of item rows,
or a row too large for a batch of rows (with no item rows to cut into chunks)."""


@pytest.mark.parametrize("large", BULK_PIECES)
async def test_a_light_keys_commit_never_waits_for_a_bulk_piece_on_two_writers(
    large: Callable[[], StoredResponse],
) -> None:
    """Issue 21 defect 5 and issue 39 on PostgreSQL: B's commit waited behind A's
    chunk under way (2.9x its quiet median), and behind a row too large for a batch of
    rows (a 350 KB output) on the connection that commits everyone's rows (9x). With a
    writer of its own for the bulk lane, B's response commits while A's piece is still
    being written, and A's put returns only once its row committed, after its chunks."""
    db = HeldBulk()
    db.bulk_gate.clear()
    store = await BackgroundStore.open(lambda: db, commit_window=0)
    try:
        put = asyncio.create_task(store.put(large()))
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, db.bulk_entered.wait, HANG_GUARD)
        await asyncio.wait_for(store.put(response("resp_b", owner="key_b")), HANG_GUARD)
        assert not put.done()
        db.bulk_gate.set()
        await put
    finally:
        db.bulk_gate.set()
        await store.close()
    assert db.committed[0] == ["resp_b"] and db.committed[-1] == ["resp_a"]
    assert db.bulk[0] is False and all(db.bulk[1:-1])


@pytest.mark.parametrize("large", BULK_PIECES)
async def test_a_light_keys_commit_never_waits_for_a_bulk_pieces_fsync_on_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, large: Callable[[], StoredResponse]
) -> None:
    """Issue 21 defect 5 and issue 39 on SQLite (one writer): B's commit waited behind
    A's chunk transaction including its fsync (2.6x its quiet median), and behind the
    commit of a response too large for a batch of rows, its fsync inside SQLite's one
    write lock too. Now a bulk piece's transaction writes its frames only and the WAL
    is fsync'd off the store thread: B's response commits while that fsync is held,
    and A's put, which its terminal event waits for, returns only after it (the
    durability of `store: true` unchanged)."""
    entered, gate = threading.Event(), threading.Event()
    fsync = os.fsync

    def held(fd: int) -> None:
        entered.set()
        gate.wait(HANG_GUARD)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", held)
    store = await BackgroundStore.open(
        lambda: SQLiteDatabase.in_directory(tmp_path), commit_window=0
    )
    try:
        put = asyncio.create_task(store.put(large()))
        assert await asyncio.get_running_loop().run_in_executor(None, entered.wait, HANG_GUARD)
        await asyncio.wait_for(store.put(response("resp_b", owner="key_b")), HANG_GUARD)
        assert not put.done()
        gate.set()
        await put
        assert await store.get("resp_a", "key_a") is not None
    finally:
        gate.set()
        await store.close()


async def test_on_postgresql_a_row_always_waits_for_the_wal_and_chunks_alone_never(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bulk lane's transactions on PostgreSQL: a large response's chunks are
    committed without waiting for the WAL flush (the commit of their row, which
    follows, flushes it), but its row, too large for a batch of rows and committed on
    the bulk lane's connection too, waits for it like every other row: what a
    terminal event waits for is durable."""
    settings: list[tuple[bool, str]] = []
    insert = PostgresDatabase._insert

    def spied(
        cursor: psycopg.Cursor[Any], rows: Sequence[Row], rejected: Rejected, items: ItemRows
    ) -> None:
        row = cursor.execute("SHOW synchronous_commit").fetchone()
        assert row is not None
        settings.append((bool(rows), row[0]))
        insert(cursor, rows, rejected, items)

    monkeypatch.setattr(PostgresDatabase, "_insert", staticmethod(spied))
    items = [{"role": "user", "content": f"item {n} " + "x" * 40} for n in range(1000)]
    store = await open_store(postgres_server.fresh_database())
    try:
        await store.put(response("resp_a", owner="key_a", input_json=orjson.dumps(items)))
        await store.put(answered("resp_b", "key_b", 2 * MAX_BATCH_BYTES))
    finally:
        await store.close()
    assert {setting for rows, setting in settings if rows} == {"on"}
    assert {setting for rows, setting in settings if not rows} == {"off"}
    assert [rows for rows, _ in settings].count(True) == 2


class HeldSQLite(SQLiteDatabase):
    """SQLite whose commits wait for `gate` (`entered` says one does): the store
    thread held, as by a slow disk or another process's lock."""

    entered = threading.Event()
    gate = threading.Event()

    def write(self, rows: Sequence[Row], rejected: Rejected, items: ItemRows = ()) -> None:
        self.entered.set()
        self.gate.wait(HANG_GUARD)
        super().write(rows, rejected, items)


async def test_sqlite_reads_go_on_while_the_store_thread_commits(tmp_path: Path) -> None:
    """Issue 21 (minor): SQLite's reads ran on the store thread, behind its commits and
    behind one key's 15 MB `input_items` pages, so another key's GET waited for them
    all. Now they run on reader threads with connections of their own (WAL): a GET is
    answered while a commit holds the store thread."""
    HeldSQLite.gate.set()
    store = await BackgroundStore.open(lambda: HeldSQLite.in_directory(tmp_path))
    try:
        await store.put(response("resp_b", owner="key_b"))
        HeldSQLite.gate.clear()
        HeldSQLite.entered.clear()
        held = asyncio.create_task(store.put(response("resp_a", owner="key_a")))
        await asyncio.get_running_loop().run_in_executor(None, HeldSQLite.entered.wait)
        found = await asyncio.wait_for(store.get("resp_b", "key_b"), HANG_GUARD)
        assert found is not None
        assert not held.done()
        HeldSQLite.gate.set()
        await held
    finally:
        HeldSQLite.gate.set()
        await store.close()


async def test_a_key_flooding_the_writer_with_many_responses_gets_its_turn_per_batch() -> None:
    """The same with many small responses: B's is not behind a full batch of A's."""
    flood = [response(f"resp_a{n}", owner="key_a") for n in range(300)]
    batches = await flooded([*flood, response("resp_b", owner="key_b")], max_batch=64)
    assert "resp_b" in batches[0]
    assert max(len(batch) for batch in batches) <= 64


@pytest.fixture(params=["sqlite", "postgresql"])
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> str | Path:
    if request.param == "sqlite":
        return tmp_path
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.fresh_database()


async def test_a_keys_storage_usage_survives_restarts_and_goes_down_on_delete(
    store_target: str | Path,
) -> None:
    """Issue 21 defect 7, the store's side: what a key holds is counted as it commits,
    read back from the database when the store opens again (the same figures), and
    freed by DELETE; past either bound the key is refused, other keys are not."""
    items = orjson.dumps([{"role": "user", "content": "x" * 1000}] * 10)
    store = await open_store(store_target, quota_bytes=50_000, quota_rows=1_000)
    try:
        ids = []
        while store.quota_refusal("key_a") is None:
            ids.append(f"resp_a{len(ids)}")
            await store.put(response(ids[-1], owner="key_a", tools=TOOLS, input_json=items))
        await store.put(response("resp_b", owner="key_b", tools=TOOLS, input_json=items))
        assert store.quota_refusal("key_b") is None
        assert isinstance(store, BackgroundStore)
        counted = store.quota.of("key_a"), store.quota.of("key_b")
    finally:
        await store.close()
    assert len(ids) == 3  # about 21 KB and 11 rows each
    reopened = await open_store(store_target, quota_bytes=50_000, quota_rows=1_000)
    try:
        assert isinstance(reopened, BackgroundStore)
        assert (reopened.quota.of("key_a"), reopened.quota.of("key_b")) == counted
        assert "limit 50000 bytes" in (reopened.quota_refusal("key_a") or "")
        assert await reopened.delete(ids[0], "key_a")
        assert reopened.quota_refusal("key_a") is None
        assert reopened.quota.of("key_a").rows == 2 * 11
    finally:
        await reopened.close()
    rows = await open_store(store_target, quota_bytes=1 << 40, quota_rows=22)
    try:
        assert "22 rows)" in (rows.quota_refusal("key_a") or "")  # 22 rows held
    finally:
        await rows.close()


QUOTA = ["--api-keys", "sk-a,sk-b", "--store-quota-bytes", "200000"]


def warm_up(socket: ClientConnection, items: int) -> dict[str, Any]:
    """A stored warm-up (`generate: false`: a prefill, nothing sampled) of `items`
    input items."""
    frame = {
        "type": "response.create",
        "model": "sim",
        "generate": False,
        "store": True,
        "input": [{"role": "user", "content": f"item {n} " + "x" * 100} for n in range(items)],
    }
    socket.send(orjson.dumps(frame).decode())
    while True:
        event: dict[str, Any] = orjson.loads(socket.recv(HANG_GUARD))
        if event["type"] in TERMINAL:
            return event


def test_stored_warm_ups_past_the_quota_get_429_insufficient_quota(tmp_path: Path) -> None:
    """Issue 21 defect 7 end to end: a key storing free warm-ups is refused once it
    holds its quota, on WebSocket (an `error` event, status 429) and over HTTP (429),
    with `insufficient_quota`; it can still run `store: false`; another key stores as
    before; a restart keeps the count; deleting frees it."""
    args = [*FAST, "--data-dir", str(tmp_path), *QUOTA]
    a_key, b_key = {"authorization": "Bearer sk-a"}, {"authorization": "Bearer sk-b"}
    with HotloopProcess(args) as server:
        with connect(server.ws_url, additional_headers=a_key) as a:
            stored = []
            for _ in range(20):
                event = warm_up(a, 500)
                if event["type"] != "response.completed":
                    break
                stored.append(event["response"]["id"])
            assert 1 <= len(stored) < 20
            assert event["type"] == "error" and event["status"] == 429
            assert event["error"]["code"] == "insufficient_quota"
            assert turn_outcome(ws_turn(a, "not stored", store=False)) == "completed"
        reply = httpx.post(
            server.url + "/v1/responses", json=body("over HTTP"), headers=a_key, timeout=HANG_GUARD
        )
        assert reply.status_code == 429 and reply.json()["error"]["code"] == "insufficient_quota"
        with connect(server.ws_url, additional_headers=b_key) as b:
            assert turn_outcome(ws_turn(b, "B stores as before")) == "completed"
    with HotloopProcess(args) as restarted:
        refused = httpx.post(
            restarted.url + "/v1/responses",
            json=body("after a restart"),
            headers=a_key,
            timeout=HANG_GUARD,
        )
        assert refused.status_code == 429
        for rid in stored:
            deleted = httpx.delete(
                f"{restarted.url}/v1/responses/{rid}", headers=a_key, timeout=HANG_GUARD
            )
            assert deleted.status_code == 200
        again = httpx.post(
            restarted.url + "/v1/responses", json=body("freed"), headers=a_key, timeout=HANG_GUARD
        )
        assert again.status_code == 200


@contextmanager
def hung(cache: RedisServer) -> Iterator[None]:
    """`cache` stopped (SIGSTOP: connections stay open and nothing answers), then resumed."""
    assert cache.process is not None
    os.kill(cache.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(cache.process.pid, signal.SIGCONT)


@pytest.fixture
async def cached(
    postgres_server: PostgresServer, redis_server: RedisServer
) -> AsyncIterator[CachedStore]:
    """A cached store whose cache is tried again half a second after a failure."""
    store = await open_store(postgres_server.fresh_database())
    cached = CachedStore(store, redis_server.fresh_url(), cool_down=0.5)
    yield cached
    await cached.close()


async def test_a_delete_while_the_cache_is_down_never_leaves_the_response_served(
    cached: CachedStore, redis_server: RedisServer
) -> None:
    """Issue 21 (minor): a DELETE while Redis does not answer left the response served
    and continuable from the cache for its TTL. Now it is refused (503
    `store_unavailable`, nothing deleted); once the cache answers, the delete goes
    through and neither a read nor a chain finds the response, from any node."""
    for n, previous in ((1, None), (2, "resp_1")):
        await cached.put(response(f"resp_{n}", previous=previous, owner="key_a"))
        await cached.copied()
    with hung(redis_server):
        with pytest.raises(StoreError) as refused:
            await asyncio.wait_for(cached.delete("resp_1", "key_a"), 10)
        assert refused.value.code == "store_unavailable"
    # Nothing was deleted: the response is whole, in the store and the cache alike.
    assert await cached.get("resp_1", "key_a") is not None
    await until(lambda: time.monotonic() >= cached.cool_down_ends, "the cache is tried again")
    assert await cached.delete("resp_1", "key_a")
    assert await cached.get("resp_1", "key_a") is None
    assert await cached.load_chain("resp_2", "key_a") is None
    # A read that fills the cache from the store cannot bring it back either.
    assert await cached.load_chain("resp_1", "key_a") is None
    assert await cached.get("resp_1", "key_a") is None


async def test_a_hung_cache_is_skipped_after_one_slow_call(
    cached: CachedStore, redis_server: RedisServer
) -> None:
    """Issue 21 (minor): every read waited for a hung Redis. Now one call waits its
    socket timeout, then the cache is skipped (the circuit breaker): the reads after it
    go to the store alone. The bound on each read only keeps the test from hanging."""
    await cached.put(response("resp_r", owner="key_b"))
    await cached.copied()
    with hung(redis_server):
        for _ in range(20):
            stored = await asyncio.wait_for(cached.get("resp_r", "key_b"), 10)
            assert stored is not None
        assert cached.skipped == 19
        assert await asyncio.wait_for(cached.load_chain("resp_r", "key_b"), 10) is not None


async def test_a_response_committed_in_chunks_reads_back_whole(store_target: str | Path) -> None:
    """A response whose item rows were committed in chunks ahead of it lists every
    item in order, replays, and counts against its key as one committed whole would
    (the same usage when counted again from the database)."""
    items = [{"role": "user", "content": f"item {n} " + "x" * 40} for n in range(3000)]
    store = await open_store(store_target)
    try:
        await store.put(response("resp_big", owner="key_a", input_json=orjson.dumps(items)))
        listed, after = [], None
        while True:
            page = await store.list_input_items(
                "resp_big", "key_a", order="asc", limit=1000, after=after
            )
            assert page is not None
            listed += page.data
            if not page.has_more:
                break
            after = page.data[-1]["id"]
        assert [item["content"][0]["text"] for item in listed] == [i["content"] for i in items]
        assert await store.load_chain("resp_big", "key_a") is not None
        assert isinstance(store, BackgroundStore)
        counted = store.quota.of("key_a")
    finally:
        await store.close()
    reopened = await open_store(store_target)
    try:
        assert isinstance(reopened, BackgroundStore)
        assert reopened.quota.of("key_a") == counted and counted.rows == 3001
    finally:
        await reopened.close()
