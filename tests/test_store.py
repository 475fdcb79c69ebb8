"""The store through its public interface: read-your-writes before the writer commits,
durability across reopen, owner isolation, input item pages, chains, backpressure and
write failures."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from hotloop.metrics import Metrics
from hotloop.store import InputItemPage, Order, Store, StoredResponse, StoreError, open_store
from hotloop.store.items import listed_items, page_of
from hotloop.store.sqlite import SQLiteDatabase
from hotloop.store.writer import BackgroundStore
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import ResponseItemList


def response(
    rid: str,
    *,
    previous: str | None = None,
    owner: str | None = None,
    items: list[dict[str, Any]] | None = None,
    ids: Sequence[int] = (1, 2, 3),
) -> StoredResponse:
    body = {"id": rid, "object": "response", "previous_response_id": previous, "output": []}
    return StoredResponse(
        id=rid,
        owner=owner,
        previous_response_id=previous,
        created_at=1_700_000_000,
        response=orjson.dumps(body),
        input_items=orjson.dumps(
            items if items is not None else [{"role": "user", "content": rid}]
        ),
        output_token_ids=ids,
    )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = await open_store(tmp_path)
    yield s
    await s.close()


async def test_get_sees_a_put_before_and_after_commit(store: Store) -> None:
    await store.put(response("resp_a"))
    assert orjson.loads(await store.get("resp_a", None) or b"")["id"] == "resp_a"
    await store.flush()
    assert store.pending() == 0
    assert orjson.loads(await store.get("resp_a", None) or b"")["id"] == "resp_a"
    assert await store.get("resp_missing", None) is None


async def test_close_flushes_and_reopen_reads_everything(tmp_path: Path) -> None:
    first = await open_store(tmp_path)
    for i in range(50):
        await first.put(response(f"resp_{i}", ids=[i, i + 1]))
    await first.close()
    with pytest.raises(StoreError) as refused:
        await first.put(response("resp_late"))
    assert refused.value.code == "store_closed"

    second = await open_store(tmp_path)
    try:
        for i in range(50):
            assert await second.get(f"resp_{i}", None) is not None
        chain = await second.load_chain("resp_7", None)
        assert chain is not None
        assert list(chain.head.output_token_ids) == [7, 8]
    finally:
        await second.close()


@pytest.mark.parametrize("committed", [False, True])
async def test_owner_isolation(store: Store, committed: bool) -> None:
    await store.put(response("resp_k", owner="key_a"))
    if committed:
        await store.flush()
    assert await store.get("resp_k", "key_a") is not None
    assert await store.get("resp_k", "key_b") is None
    assert await store.list_input_items("resp_k", "key_b") is None
    assert await store.load_chain("resp_k", "key_b") is None
    assert not await store.delete("resp_k", "key_b")
    assert await store.delete("resp_k", "key_a")
    assert await store.get("resp_k", "key_a") is None


@pytest.mark.parametrize("committed", [False, True])
async def test_delete(store: Store, committed: bool) -> None:
    await store.put(response("resp_d"))
    if committed:
        await store.flush()
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


@pytest.mark.parametrize("committed", [False, True])
async def test_input_items_are_sdk_items(store: Store, committed: bool) -> None:
    await store.put(response("resp_items", items=SHORT_FORMS))
    if committed:
        await store.flush()
    page = await store.list_input_items("resp_items", None, order="asc", limit=100)
    assert page is not None
    listed = ResponseItemList.model_validate(orjson.loads(page.to_json()), strict=True)
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


@pytest.mark.parametrize("committed", [False, True])
async def test_input_item_pages_walk_both_orders(store: Store, committed: bool) -> None:
    items = [{"role": "user", "content": str(i)} for i in range(7)]
    await store.put(response("resp_p", items=items))
    if committed:
        await store.flush()
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
    db = SQLiteDatabase(tmp_path_factory.mktemp("db") / "r.sqlite3")
    try:
        record = response(
            "resp_h", items=[{"role": "user", "content": str(i)} for i in range(count)]
        )
        db.write([record])
        items = listed_items(record.id, record.input_items)
        after = (
            items[after_index]["id"] if after_index is not None and after_index < count else None
        )
        order: Order = "asc" if ascending else "desc"
        page = db.list_input_items("resp_h", None, order=order, limit=limit, after=after)
        data, has_more = page_of(items, ascending=ascending, limit=limit, after=after)
        assert page == InputItemPage(data=data, has_more=has_more)
    finally:
        db.close()


async def test_load_chain_spans_pending_and_committed(store: Store) -> None:
    await store.put(response("resp_1"))
    await store.put(response("resp_2", previous="resp_1"))
    await store.flush()
    await store.put(response("resp_3", previous="resp_2"))
    chain = await store.load_chain("resp_3", None)
    assert chain is not None
    assert [r.id for r in chain.responses] == ["resp_1", "resp_2", "resp_3"]
    await store.flush()
    chain = await store.load_chain("resp_3", None)
    assert chain is not None and [r.id for r in chain.responses] == ["resp_1", "resp_2", "resp_3"]


async def test_load_chain_with_a_deleted_ancestor_is_a_miss(store: Store) -> None:
    await store.put(response("resp_1"))
    await store.put(response("resp_2", previous="resp_1"))
    await store.put(response("resp_3", previous="resp_2"))
    await store.flush()
    assert await store.delete("resp_2", None)
    assert await store.load_chain("resp_3", None) is None
    assert await store.load_chain("resp_1", None) is not None
    assert await store.load_chain("resp_unknown", None) is None


class GatedDatabase:
    """A database whose writes wait for the test to open a gate, and can be told to fail."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.fail = False
        self.rows: dict[str, StoredResponse] = {}

    def write(self, batch: Sequence[StoredResponse]) -> None:
        self.entered.set()
        self.gate.wait()
        if self.fail:
            raise StoreError("store_unavailable", "disk full")
        self.rows.update((r.id, r) for r in batch)

    def get(self, response_id: str, owner: str | None) -> bytes | None:
        row = self.rows.get(response_id)
        return row.response if row else None

    def delete(self, response_id: str, owner: str | None) -> bool:
        return self.rows.pop(response_id, None) is not None

    def list_input_items(
        self, response_id: str, owner: str | None, *, order: Order, limit: int, after: str | None
    ) -> InputItemPage | None:
        return None

    def chain(self, response_id: str) -> list[StoredResponse]:
        return []

    def close(self) -> None:
        pass


async def test_a_full_queue_makes_put_wait() -> None:
    db = GatedDatabase()
    store = await BackgroundStore.open(lambda: db, queue_size=1)
    await store.put(response("resp_1"))
    # The drain task has taken resp_1 and is blocked inside write: the queue is empty.
    await asyncio.get_running_loop().run_in_executor(None, db.entered.wait)
    await store.put(response("resp_2"))
    third = asyncio.create_task(store.put(response("resp_3")))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not third.done()
    assert store.pending() == 3
    db.gate.set()
    await third
    await store.close()
    assert sorted(db.rows) == ["resp_1", "resp_2", "resp_3"]


async def test_a_failed_write_is_counted_and_does_not_wedge_the_writer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    db = GatedDatabase()
    db.fail = True
    db.gate.set()
    metrics = Metrics()
    store = await BackgroundStore.open(lambda: db, metrics=metrics)
    await store.put(response("resp_lost"))
    await store.flush()
    assert "resp_lost" in caplog.text
    assert metrics.store_errors.value == 1
    assert store.pending() == 0
    db.fail = False
    await store.put(response("resp_ok"))
    await store.close()
    assert metrics.store_writes.value == 1
    assert list(db.rows) == ["resp_ok"]
