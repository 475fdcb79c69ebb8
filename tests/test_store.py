"""The store through its public interface, against every backend (SQLite, and
PostgreSQL on a real server started by `pg_server.py`): a put returns only once its
record is committed, durability across reopen, owner isolation (and who owns what was
stored with auth off), input item pages, chains, group commit, the tool list stored
once per distinct list, and failure isolation: a record the store cannot read back is
quarantined and fails alone, a failed transaction fails its responses (never
acknowledged) and marks the store unhealthy, and the writer goes on either way."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from array import array
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from hotloop.metrics import Metrics
from hotloop.store import (
    DURABILITIES,
    InputItemPage,
    ModelTurn,
    Order,
    Store,
    StoredResponse,
    StoreError,
    open_store,
)
from hotloop.store.items import listed_items, page_of
from hotloop.store.postgres import MIGRATIONS as POSTGRES_MIGRATIONS
from hotloop.store.quota import Usage
from hotloop.store.records import RESPONSE_COLUMNS, ItemRows, Rejected, Row
from hotloop.store.sqlite import FILE_NAME, SQLiteDatabase
from hotloop.store.sqlite import MIGRATIONS as SQLITE_MIGRATIONS
from hotloop.store.writer import BackgroundStore
from hypothesis import given, settings
from hypothesis import strategies as st
from loop_order import scheduled_callbacks_ran
from openai.types.responses import ResponseItemList
from pg_server import PostgresServer
from shell_tool import TOOLS


def response(
    rid: str,
    *,
    previous: str | None = None,
    owner: str | None = None,
    items: list[dict[str, Any]] | None = None,
    ids: Sequence[int] = (1, 2, 3),
    tools: list[dict[str, Any]] | None = None,
    input_json: bytes | None = None,
) -> StoredResponse:
    body = {
        "id": rid,
        "object": "response",
        "previous_response_id": previous,
        "output": [],
        "tools": tools or [],
        "top_p": 1.0,
    }
    return StoredResponse(
        id=rid,
        owner=owner,
        previous_response_id=previous,
        created_at=1_700_000_000,
        response=orjson.dumps(body),
        input_items=input_json
        or orjson.dumps(items if items is not None else [{"role": "user", "content": rid}]),
        output_token_ids=ids,
        fingerprint="f1",
    )


# What issue 15's requests left in a record before the core refused them at the
# boundary: a number outside f64 and a lone surrogate, in pass-through fields. orjson
# cannot load either, so the store can never read such a record back.
POISONED_INPUTS = (
    b'[{"type":"message","role":"user","content":"hi","zz":1e999}]',
    b'[{"type":"message","role":"user","content":"hi","zz":"\\ud800"}]',
    # Loads, but no PostgreSQL text column can hold it.
    b'[{"id":"msg_a\\u0000b","type":"message","role":"user","content":"hi"}]',
)


class Backend:
    """One database of the parametrized kind: `open` a store on it (every call: the
    same database), or `query` it with the backend's own client, as an operator would."""

    def __init__(self, target: str | Path) -> None:
        self.target = target

    async def open(self, **options: Any) -> Store:
        return await open_store(self.target, **options)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        if isinstance(self.target, Path):
            with sqlite3.connect(self.target / FILE_NAME) as db:
                return db.execute(sql).fetchall()
        import psycopg

        with psycopg.connect(self.target) as connection:
            return [tuple(row) for row in connection.execute(sql).fetchall()]


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend(tmp_path)
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return Backend(server.fresh_database())


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[Store]:
    s = await backend.open()
    yield s
    await s.close()


async def test_a_put_returns_committed(backend: Backend, store: Store) -> None:
    await store.put(response("resp_a"))
    assert store.pending() == 0
    # Another connection to the same database sees it: it is committed, not queued.
    other = await backend.open()
    try:
        assert orjson.loads(await other.get("resp_a", None) or b"")["id"] == "resp_a"
    finally:
        await other.close()
    assert await store.get("resp_missing", None) is None


@pytest.mark.parametrize("durability", DURABILITIES)
async def test_a_put_is_committed_before_it_returns_at_either_durability(
    backend: Backend, durability: str
) -> None:
    """`process-crash` only skips the fsync: the commit is still made (visible to
    another connection) before the put returns, so hotloop dying loses nothing."""
    store = await backend.open(durability=durability)
    try:
        await store.put(response("resp_a"))
        assert backend.query("SELECT id FROM responses") == [("resp_a",)]
    finally:
        await store.close()


@pytest.mark.parametrize(("durability", "synchronous"), [("power-loss", 2), ("process-crash", 1)])
def test_sqlite_fsyncs_each_commit_only_for_power_loss(
    tmp_path: Path, durability: str, synchronous: int
) -> None:
    database = SQLiteDatabase.in_directory(tmp_path, durability=durability)
    try:
        assert database._db.execute("PRAGMA synchronous").fetchone() == (synchronous,)
    finally:
        database.close()


async def test_close_and_reopen_reads_everything(backend: Backend) -> None:
    first = await backend.open()
    await asyncio.gather(*(first.put(response(f"resp_{i}", ids=[i, i + 1])) for i in range(50)))
    await first.close()
    with pytest.raises(StoreError) as refused:
        await first.put(response("resp_late"))
    assert refused.value.code == "store_closed"

    second = await backend.open()
    try:
        for i in range(50):
            assert await second.get(f"resp_{i}", None) is not None
        chain = await second.load_chain("resp_7", None)
        assert chain is not None
        assert list(chain.head.output_token_ids) == [7, 8]
        assert chain.head.fingerprint == "f1"
    finally:
        await second.close()


async def test_owner_isolation(store: Store) -> None:
    await store.put(response("resp_k", owner="key_a"))
    assert await store.get("resp_k", "key_a") is not None
    assert await store.get("resp_k", "key_b") is None
    assert await store.list_input_items("resp_k", "key_b") is None
    assert await store.load_chain("resp_k", "key_b") is None
    assert not await store.delete("resp_k", "key_b")
    assert await store.delete("resp_k", "key_a")
    assert await store.get("resp_k", "key_a") is None


async def test_responses_stored_with_auth_off_belong_to_no_key(store: Store) -> None:
    """Issue 15 item 7: they used to become readable and deletable by every key once
    auth was turned on. They stay the single tenant's: with auth on, no key sees them."""
    await store.put(response("resp_open"))
    for key in ("key_a", "key_b"):
        assert await store.get("resp_open", key) is None
        assert await store.list_input_items("resp_open", key) is None
        assert await store.load_chain("resp_open", key) is None
        assert not await store.delete("resp_open", key)
    # With auth off again, the single tenant has them (and sees keyed ones too).
    assert await store.get("resp_open", None) is not None
    await store.put(response("resp_keyed", owner="key_a"))
    assert await store.get("resp_keyed", None) is not None


async def test_an_id_no_record_can_have_is_simply_unknown(store: Store) -> None:
    bad = "resp_a\x00b"
    assert await store.get(bad, None) is None
    assert await store.list_input_items(bad, None) is None
    assert await store.load_chain(bad, None) is None
    assert not await store.delete(bad, None)
    await store.put(response("resp_known"))
    assert await store.list_input_items("resp_known", None, after=bad) == InputItemPage([], False)
    assert store.healthy


async def test_delete(store: Store) -> None:
    await store.put(response("resp_d"))
    assert await store.delete("resp_d", None)
    assert await store.get("resp_d", None) is None
    assert await store.list_input_items("resp_d", None) is None
    assert not await store.delete("resp_d", None)


SHORT_FORMS: list[dict[str, Any]] = [
    {"role": "developer", "content": "be brief"},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    {"role": "assistant", "content": "hello"},
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "again"}],
    },
    {"type": "function_call", "call_id": "call_1", "name": "ls", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "a b"},
    {"id": "msg_client", "type": "message", "role": "user", "content": "kept id"},
]


async def test_input_items_are_sdk_items(store: Store) -> None:
    await store.put(response("resp_items", items=SHORT_FORMS))
    page = await store.list_input_items("resp_items", None, order="asc", limit=100)
    assert page is not None
    listed = ResponseItemList.model_validate(orjson.loads(b"".join(page.body())), strict=True)
    assert [item.type for item in listed.data] == [
        "message",
        "message",
        "message",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert listed.data[-1].id == "msg_client"
    assert listed.first_id == listed.data[0].id
    assert not listed.has_more
    again = await store.list_input_items("resp_items", None, order="asc", limit=100)
    assert again == page


async def test_input_item_pages_walk_both_orders(store: Store) -> None:
    items = [{"role": "user", "content": str(i)} for i in range(7)]
    await store.put(response("resp_p", items=items))
    for order, expected in (("asc", list(range(7))), ("desc", list(range(6, -1, -1)))):
        seen: list[int] = []
        after = None
        while True:
            page = await store.list_input_items("resp_p", None, order=order, limit=3, after=after)
            assert page is not None
            seen += [int(item["content"][0]["text"]) for item in page.data]
            if not page.has_more:
                break
            after = page.data[-1]["id"]
        assert seen == expected


@settings(max_examples=30, deadline=None)
@given(
    count=st.integers(0, 12),
    limit=st.integers(1, 13),
    ascending=st.booleans(),
    after_index=st.one_of(st.none(), st.integers(0, 12)),
)
def test_database_pages_match_in_memory_pages(
    tmp_path_factory: pytest.TempPathFactory,
    count: int,
    limit: int,
    ascending: bool,
    after_index: int | None,
) -> None:
    from hotloop.store.records import prepare

    db = SQLiteDatabase.in_directory(tmp_path_factory.mktemp("db"))
    try:
        record = response(
            "resp_h", items=[{"role": "user", "content": str(i)} for i in range(count)]
        )
        db.write([prepare(record)], [])
        items = listed_items(record.id, record.input_items)
        after = (
            items[after_index]["id"] if after_index is not None and after_index < count else None
        )
        order: Order = "asc" if ascending else "desc"
        page = db.list_input_items("resp_h", None, order=order, limit=limit, after=after)
        data, has_more = page_of(items, ascending=ascending, limit=limit, after=after)
        assert page is not None
        assert (page.data, page.has_more) == (data, has_more)
    finally:
        db.close()


async def test_load_chain(store: Store) -> None:
    await store.put(response("resp_1"))
    await store.put(response("resp_2", previous="resp_1"))
    await store.put(response("resp_3", previous="resp_2"))
    chain = await store.load_chain("resp_3", None)
    assert chain is not None
    assert [r.id for r in chain.responses] == ["resp_1", "resp_2", "resp_3"]
    assert [r.input_items for r in chain.responses] == [
        response(f"resp_{i}").input_items for i in (1, 2, 3)
    ]


def long_running(rid: str) -> StoredResponse:
    """A long-running response: two model turns, a tool output injected between them."""
    output = [{"type": "function_call", "call_id": "call_1"}, {"type": "message"}]
    items = [
        {"role": "user", "content": "ls"},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.py"},
    ]
    base = response(rid, items=items, ids=(1, 2, 3, 4, 5))
    body = {**orjson.loads(base.response), "output": output}
    return replace(
        base, response=orjson.dumps(body), model_turns=(ModelTurn(1, 2, 1), ModelTurn(2, 5, 0))
    )


async def test_a_long_running_response_keeps_its_model_turns(store: Store) -> None:
    await store.put(long_running("resp_l"))
    await store.put(response("resp_m", previous="resp_l"))
    chain = await store.load_chain("resp_m", None)
    assert chain is not None
    first, then = chain.responses
    assert first.model_turns == (ModelTurn(1, 2, 1), ModelTurn(2, 5, 0))
    assert then.model_turns == ()
    page = await store.list_input_items("resp_l", None, order="asc")
    assert page is not None
    assert [item["type"] for item in page.data] == ["message", "function_call_output"]


def previous_schema(backend: Backend) -> None:
    """Make `backend`'s database the schema before `model_turns`, holding one response."""
    row = (
        "resp_old",
        None,
        None,
        1,
        orjson.dumps({"id": "resp_old", "output": []}),
        None,
        None,
        b'[{"role":"user","content":"hi"}]',
        array("I", [5, 6]).tobytes(),
        "f1",
    )
    columns = RESPONSE_COLUMNS.removesuffix(", model_turns")
    if isinstance(backend.target, Path):
        before = _step_adding_model_turns(SQLITE_MIGRATIONS)
        with sqlite3.connect(backend.target / FILE_NAME) as db:
            for step in SQLITE_MIGRATIONS[:before]:
                for statement in step:
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {before}")
            db.execute(f"INSERT INTO responses ({columns}) VALUES ({', '.join('?' * 10)})", row)
        return
    import psycopg

    before = _step_adding_model_turns(POSTGRES_MIGRATIONS)
    with psycopg.connect(backend.target) as connection:
        for step in POSTGRES_MIGRATIONS[:before]:
            for statement in step:
                connection.execute(statement)
        connection.execute("CREATE TABLE hotloop_schema (version integer NOT NULL)")
        connection.execute("INSERT INTO hotloop_schema VALUES (%s)", (before,))
        connection.execute(
            f"INSERT INTO responses ({columns}) VALUES ({', '.join(['%s'] * 10)})", row
        )


def _step_adding_model_turns(migrations: tuple[tuple[str, ...], ...]) -> int:
    return next(n for n, step in enumerate(migrations) if "model_turns" in step[0])


async def test_the_schema_before_model_turns_is_migrated(backend: Backend) -> None:
    previous_schema(backend)
    store = await backend.open()
    try:
        old = await store.load_chain("resp_old", None)
        assert old is not None and old.head.model_turns == ()
        assert list(old.head.output_token_ids) == [5, 6]
        await store.put(long_running("resp_l"))
        chain = await store.load_chain("resp_l", None)
        assert chain is not None and chain.head.model_turns == long_running("resp_l").model_turns
    finally:
        await store.close()


async def test_load_chain_with_a_deleted_ancestor_is_a_miss(store: Store) -> None:
    await store.put(response("resp_1"))
    await store.put(response("resp_2", previous="resp_1"))
    await store.put(response("resp_3", previous="resp_2"))
    assert await store.delete("resp_2", None)
    assert await store.load_chain("resp_3", None) is None
    assert await store.load_chain("resp_1", None) is not None
    assert await store.load_chain("resp_unknown", None) is None


async def test_the_tool_list_is_stored_once_and_read_back_whole(store: Store) -> None:
    tools = TOOLS * 20
    previous = None
    for n in range(5):
        await store.put(response(f"resp_t{n}", previous=previous, tools=tools))
        previous = f"resp_t{n}"
    await store.put(response("resp_other", tools=TOOLS))
    for n in range(5):
        got = orjson.loads(await store.get(f"resp_t{n}", None) or b"")
        assert got == orjson.loads(
            response(f"resp_t{n}", tools=tools, previous=got["previous_response_id"]).response
        )
        # Key order is kept: the tools sit where the response had them.
        assert list(got) == ["id", "object", "previous_response_id", "output", "tools", "top_p"]
    chain = await store.load_chain("resp_t4", None)
    assert chain is not None
    assert all(orjson.loads(r.response)["tools"] == tools for r in chain.responses)
    assert orjson.loads(await store.get("resp_other", None) or b"")["tools"] == TOOLS
    # Deleting every response of a list deletes the list; the other list stays.
    for n in range(5):
        assert await store.delete(f"resp_t{n}", None)
    assert orjson.loads(await store.get("resp_other", None) or b"")["tools"] == TOOLS


async def test_a_poisoned_record_is_quarantined_and_fails_alone(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 15 items 1-2: a record orjson cannot load killed the writer task, and no
    later response of any tenant was stored. Now it fails alone, in the same commit as
    healthy ones, and the writer goes on."""
    metrics = Metrics()
    store = await backend.open(metrics=metrics)
    try:
        puts = [
            store.put(response("resp_ok_1", owner="key_b")),
            store.put(response("resp_bad_1", owner="key_a", input_json=POISONED_INPUTS[0])),
            store.put(response("resp_bad_2", owner="key_a", input_json=POISONED_INPUTS[1])),
            store.put(response("resp_bad_3", owner="key_a", input_json=POISONED_INPUTS[2])),
            store.put(response("resp_ok_2", owner="key_b")),
        ]
        results = await asyncio.gather(*puts, return_exceptions=True)
        assert results[0] is None and results[4] is None
        for refused in results[1:4]:
            assert isinstance(refused, StoreError) and refused.code == "store_unavailable"
        assert store.healthy
        await store.put(response("resp_after", owner="key_b"))
        for rid in ("resp_ok_1", "resp_ok_2", "resp_after"):
            assert await store.get(rid, "key_b") is not None
        assert await store.get("resp_bad_1", "key_a") is None
        assert metrics.store_errors.labels("record").value == 3
        assert "resp_bad_1" in caplog.text and "JSONDecodeError" in caplog.text
        # Nothing of the content reaches the log.
        assert "1e999" not in caplog.text and "ud800" not in caplog.text
    finally:
        await store.close()
    quarantined = backend.query("SELECT response_id, input_items, reason FROM quarantine")
    assert {(rid, bytes(items), reason) for rid, items, reason in quarantined} == {
        ("resp_bad_1", POISONED_INPUTS[0], "JSONDecodeError"),
        ("resp_bad_2", POISONED_INPUTS[1], "JSONDecodeError"),
        ("resp_bad_3", POISONED_INPUTS[2], "an input item id holds a NUL character"),
    }


class GatedDatabase:
    """A database whose writes wait for the test to open a gate, and can be told to fail."""

    readers = 0
    writers = 1

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail: Exception | None = None
        self.rows: dict[str, Row] = {}
        self.batches: list[int] = []

    def write(self, rows: Sequence[Row], rejected: Rejected, items: ItemRows = ()) -> None:
        self.entered.set()
        self.gate.wait()
        if self.fail is not None:
            raise self.fail
        self.batches.append(len(rows))
        self.rows.update((r.id, r) for r in rows)

    def write_bulk(self, rows: Sequence[Row], rejected: Rejected, items: ItemRows = ()) -> None:
        self.write(rows, rejected, items)

    def probe(self) -> None:
        if self.fail is not None:
            raise self.fail

    def get(self, response_id: str, owner: str | None) -> bytes | None:
        row = self.rows.get(response_id)
        return row.response if row else None

    def usage(self) -> dict[str, Usage]:
        return {}

    def delete(self, response_id: str, owner: str | None) -> tuple[str | None, Usage] | None:
        row = self.rows.pop(response_id, None)
        return None if row is None else (row.owner, row.usage)

    def list_input_items(
        self, response_id: str, owner: str | None, *, order: Order, limit: int, after: str | None
    ) -> InputItemPage | None:
        return None

    def chain(self, response_id: str, owner: str | None) -> list[StoredResponse]:
        return []

    def close(self) -> None:
        pass


async def test_responses_arriving_together_share_one_commit() -> None:
    db = GatedDatabase()
    db.gate.clear()
    metrics = Metrics()
    store = await BackgroundStore.open(lambda: db, metrics=metrics, commit_window=0)
    first = asyncio.create_task(store.put(response("resp_0")))
    # The writer is inside the first commit; everything put meanwhile waits for the next.
    await asyncio.get_running_loop().run_in_executor(None, db.entered.wait)
    # 31 responses of two rows each: within a batch's MAX_BATCH_ROWS.
    rest = [asyncio.create_task(store.put(response(f"resp_{i}"))) for i in range(1, 32)]
    await scheduled_callbacks_ran()
    assert store.pending() == 32
    db.gate.set()
    await asyncio.gather(first, *rest)
    await store.close()
    assert db.batches == [1, 31]
    assert metrics.store_commits.value == 2
    assert metrics.store_writes.value == 32


async def test_an_idle_writer_commits_a_response_at_once() -> None:
    """By default nothing waits for company: a response put to an idle writer is taken
    for its commit as soon as the drain runs, and one put after it commits next (a
    commit window made every response of a lone agent wait it out before `completed`)."""
    db = GatedDatabase()
    db.gate.clear()
    store = await BackgroundStore.open(lambda: db)
    first = asyncio.create_task(store.put(response("resp_0")))
    await scheduled_callbacks_ran()  # the put queues its response and wakes the drain
    await scheduled_callbacks_ran()  # the drain takes its batch
    second = asyncio.create_task(store.put(response("resp_1")))
    db.gate.set()
    await asyncio.gather(first, second)
    await store.close()
    assert db.batches == [1, 1]


@pytest.mark.parametrize(
    "failure",
    [StoreError("store_unavailable", "disk full"), RuntimeError("a bug in the database layer")],
    ids=["store_error", "bug"],
)
async def test_a_failed_commit_fails_its_responses_and_the_writer_goes_on(
    failure: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    db = GatedDatabase()
    db.fail = failure
    metrics = Metrics()
    store = await BackgroundStore.open(lambda: db, metrics=metrics)
    results = await asyncio.gather(
        store.put(response("resp_lost_1")),
        store.put(response("resp_lost_2")),
        return_exceptions=True,
    )
    assert all(isinstance(r, StoreError) and r.code == "store_unavailable" for r in results)
    assert "resp_lost_1" in caplog.text
    assert metrics.store_errors.labels("commit").value == 2
    assert not store.healthy
    assert store.pending() == 0
    db.fail = None
    await store.put(response("resp_ok"))
    assert store.healthy
    await store.close()
    assert metrics.store_writes.value == 1
    assert list(db.rows) == ["resp_ok"]
