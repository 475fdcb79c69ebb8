"""The ledger's work after a terminal event, one response at a time: a record that
cannot be read back or booked costs only that response (issue 15 item 2: a poisoned
turn finishing in the same loop iteration as a normal one stopped booking, metrics and
storage for the whole process). The records are built here, with JSON orjson cannot
load, so the tests stay meaningful once the core refuses such values at the boundary."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hotloop._core import parse_request
from hotloop.auth import ApiKeys, key_id
from hotloop.events import Usage
from hotloop.ledger import Ledger
from hotloop.protocol import Finished
from hotloop.store import StoreError
from loop_order import scheduled_callbacks_ran
from servers import sim_engine

POISONED = b'{"id":"resp_bad","status":"completed","created_at":1,"tools":[{"zz":1e999}]}'


def finished(response_id: str, principal: str, response_json: bytes | None = None) -> Finished:
    return Finished(
        response_id=response_id,
        request=parse_request(b'{"model":"sim","input":"hi"}'),
        response_json=response_json
        or b'{"id":"%s","status":"completed","created_at":1,"output":[]}' % response_id.encode(),
        checkpoint=None,
        usage=Usage(input_tokens=10, output_tokens=5),
        principal=principal,
        overhead_ns=1000,
        turn=None,
        created_at=1,
    )


# Usage is booked under the tenant label: named keys keep the assertions readable.
KEYS = ApiKeys(["a:sk-a", "b:sk-b"])


def ledger(**options: Any) -> Ledger:
    return Ledger(
        sim_engine(), cache_memory_bytes=1 << 30, max_cached_bytes=1 << 30, keys=KEYS, **options
    )


async def test_a_poisoned_and_a_normal_turn_ending_together_are_both_booked() -> None:
    books = ledger()
    # Two frames in one TCP write: both responses end in the same loop iteration.
    books.record(finished("resp_bad", "sk-a", POISONED), "websocket")
    books.record(finished("resp_ok", "sk-b"), "websocket")
    await scheduled_callbacks_ran()  # the booking was deferred with call_soon
    assert books.usage.of("a").output_tokens == 5
    assert books.usage.of("b").output_tokens == 5
    # And booking goes on for later turns.
    books.record(finished("resp_later", "sk-b"), "http")
    await scheduled_callbacks_ran()
    assert books.usage.of("b").responses == 2
    assert books.metrics.store_errors.labels("booking").value == 0


async def test_a_response_that_cannot_be_booked_is_counted_and_the_others_are_booked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    books = ledger()
    broken = replace(finished("resp_broken", "sk-a"), usage=None)  # a bug upstream
    books.record(broken, "websocket")
    books.record(finished("resp_ok", "sk-b"), "websocket")
    await scheduled_callbacks_ran()
    assert books.metrics.store_errors.labels("booking").value == 1
    assert "resp_broken" in caplog.text
    assert books.usage.of("b").responses == 1


async def test_a_poisoned_record_fails_its_commit_alone(tmp_path: Path) -> None:
    books = ledger(data_dir=tmp_path)
    await books.start()
    try:
        results = await asyncio.gather(
            books.persist(finished("resp_bad", "sk-a", POISONED)),
            books.persist(finished("resp_ok", "sk-b")),
            return_exceptions=True,
        )
        assert isinstance(results[0], StoreError) and results[0].code == "store_unavailable"
        assert results[1] is None
        assert books.store is not None
        assert await books.store.get("resp_ok", key_id("sk-b")) is not None
        await books.persist(finished("resp_after", "sk-b"))
        assert await books.store.get("resp_after", key_id("sk-b")) is not None
        assert books.metrics.store_errors.labels("record").value == 1
        assert books.drain.in_flight == 0
    finally:
        await books.close()


def test_whole_history_settings_choose_what_a_key_is_matched_by() -> None:
    """`whole_history`: bytes (the key's cache and its raw addresses), items (the cache,
    no raw addresses) or off (neither: every whole-history request renders whole)."""
    principal = "sk-a"
    owner = key_id(principal)
    on = ledger()
    assert on.history_cache(owner) is on.http_cache(owner)
    assert on.seen_items(principal) is on.http_cache(owner).seen
    assert on.seen_items("sk-b") is not on.seen_items(principal)
    items = ledger(whole_history="items")
    assert items.history_cache(owner) is items.http_cache(owner)
    assert items.seen_items(principal) is None
    off = ledger(whole_history="off")
    assert off.history_cache(owner) is None and off.seen_items(principal) is None
