"""The process-wide cache budget when one response id lives in several caches (the
HTTP cache of a key, and every socket that continued the stored response): entries
are named by (cache, id), and the budget's byte count is always exactly the sum of
the live entries and never above its cap. Random interleavings of put, get, evict and
close over several caches, with real checkpoints of different sizes."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hotloop._core import ChatFormat, Checkpoint, Conversation, parse_request
from hotloop.config import ServerConfig
from hotloop.protocol import CacheBudget, ConnectionCache
from hotloop.protocol.connection_cache import Mark, history_key
from hotloop.transport import App
from hypothesis import given, settings
from hypothesis import strategies as st
from sdk_events import validate
from servers import serving, sim_engine
from websockets.sync.client import connect

IDS = [f"resp_{i}" for i in range(4)]
KEY = "sk-cache"
AUTH = {"authorization": f"Bearer {KEY}"}
TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/v1/responses"


@cache
def checkpoints() -> list[Checkpoint]:
    """Real checkpoints of growing size: conversations of 1-4 user turns."""
    made = []
    conversation = Conversation(ChatFormat.harmony(), context_window=1 << 20)
    for turn in range(4):
        text = f"turn {turn} " + "word " * (200 * (turn + 1))
        conversation.extend(parse_request(b'{"input": "' + text.encode() + b'"}'))
        made.append(conversation.checkpoint())
    return made


def live_bytes(caches: list[ConnectionCache]) -> int:
    return sum(cache.used_bytes for cache in caches)


def test_one_id_in_two_caches_is_two_entries() -> None:
    """An id rebuilt into a socket's cache while the HTTP cache holds it: the socket
    closing left the HTTP entry without a budget entry (KeyError on its next hit)
    and its bytes counted forever."""
    budget = CacheBudget(1 << 30)
    http = ConnectionCache(1 << 30, budget)
    socket = ConnectionCache(1 << 30, budget)
    checkpoint = checkpoints()[0]
    http.put("resp_1", checkpoint, None, "resp_1")
    socket.put("resp_1", checkpoint, None, "resp_1")
    assert budget.used_bytes == 2 * checkpoint.memory_bytes
    socket.clear()
    assert http.get("resp_1") is not None
    assert budget.used_bytes == checkpoint.memory_bytes
    http.clear()
    assert budget.used_bytes == 0


def test_a_re_put_replaces_its_bytes() -> None:
    budget = CacheBudget(1 << 30)
    cache_ = ConnectionCache(1 << 30, budget)
    small, large = checkpoints()[0], checkpoints()[3]
    cache_.put("resp_1", large, None, "resp_1")
    cache_.put("resp_1", small, None, "resp_1")
    assert cache_.used_bytes == budget.used_bytes == small.memory_bytes


def test_evict_everywhere_only_touches_the_owners_caches() -> None:
    budget = CacheBudget(1 << 30)
    mine = [ConnectionCache(1 << 30, budget, "key_a") for _ in range(2)]
    theirs = ConnectionCache(1 << 30, budget, "key_b")
    for held in [*mine, theirs]:
        held.put("resp_1", checkpoints()[0], None, "resp_1")
    assert budget.evict_everywhere("resp_1", "key_a") == 2
    assert all("resp_1" not in held for held in mine) and "resp_1" in theirs
    assert budget.used_bytes == checkpoints()[0].memory_bytes


def test_evict_everywhere_drops_the_copies_held_by_content() -> None:
    """A socket's response is kept in its key's HTTP cache by content too (for a
    whole-history retry): deleting the response drops that copy, and the raw addresses
    naming it (`ConnectionCache.seen`)."""
    budget = CacheBudget(1 << 30)
    socket, http, theirs = (ConnectionCache(1 << 30, budget, key) for key in ("a", "a", "b"))
    body = b'{"input":[{"role":"user","content":"hi"}]}'
    request = parse_request(body, None, http.seen)
    mark = Mark(request.prefix_digest, request.history_digests()[-1])
    socket.put("resp_1", checkpoints()[0], None, "resp_1", mark=mark)
    for held in (http, theirs):
        held.put(history_key(mark.digest), checkpoints()[1], None, "resp_1", mark=mark)
    assert http.seen.remember(request) and len(http.seen) == 1
    assert budget.evict_everywhere("resp_1", "a") == 1
    assert http.find(mark.digest) is None and len(http.seen) == 0
    assert theirs.find(mark.digest) is not None


OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "get", "evict", "close"]),
        st.integers(0, 2),  # which cache
        st.sampled_from(IDS),
        st.integers(0, 3),  # which checkpoint
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, cap_turns=st.integers(1, 6), per_cache_turns=st.integers(1, 6))
def test_accounting_is_exact_under_any_interleaving(
    ops: list[tuple[str, int, str, int]], cap_turns: int, per_cache_turns: int
) -> None:
    sizes = [c.memory_bytes for c in checkpoints()]
    largest = max(sizes)
    budget = CacheBudget(cap_turns * largest)
    # Two keys' caches and an unauthenticated one: the fair shares move entries around.
    caches = [
        ConnectionCache(per_cache_turns * largest, budget, owner)
        for owner in ("key_a", "key_b", None)
    ]
    for op, which, response_id, size in ops:
        target = caches[which]
        if op == "put":
            target.put(response_id, checkpoints()[size], None, response_id)
            assert response_id in target  # the newest entry always stays
        elif op == "get":
            target.get(response_id)
        elif op == "evict":
            target.evict(response_id)
        else:
            target.clear()
        assert budget.used_bytes == live_bytes(caches)
        assert budget.used_bytes <= budget.max_bytes
        assert all(c.used_bytes <= c.max_bytes for c in caches)
    for target in caches:
        target.clear()
    assert budget.used_bytes == 0


def test_one_keys_warm_ups_do_not_evict_another_keys_state() -> None:
    """Issue 21 minor: the budget was one LRU across tenants, so one tenant's warm-ups
    evicted another's `store: false` state (gone for good: nothing to rebuild it from).
    The key holding the most bytes now gives back first."""
    sizes = [c.memory_bytes for c in checkpoints()]
    budget = CacheBudget(4 * max(sizes))
    victim = ConnectionCache(1 << 30, budget, "key_victim")
    victim.put("resp_victim", checkpoints()[3], None, "resp_victim")
    flooder = ConnectionCache(1 << 30, budget, "key_flood")
    for n in range(40):
        flooder.put(f"resp_flood_{n}", checkpoints()[n % 4], None, f"resp_flood_{n}")
        assert budget.used_bytes <= budget.max_bytes
    assert "resp_victim" in victim
    assert "resp_flood_39" in flooder
    assert flooder.used_bytes >= victim.used_bytes
    # Past its share, the victim gives back too: its least recently used entry first.
    for n in range(8):
        victim.put(f"resp_more_{n}", checkpoints()[3], None, f"resp_more_{n}")
    assert "resp_victim" not in victim and "resp_more_7" in victim
    assert budget.used_bytes == live_bytes([victim, flooder]) <= budget.max_bytes


# ---------------------------------------------------------------- over a real server


def ws_turn(ws: Any, **body: Any) -> dict[str, Any]:
    ws.send(orjson.dumps({"type": "response.create", "model": "sim", **body}).decode())
    while (frame := validate(ws.recv()))["type"] not in TERMINAL:
        pass
    return frame


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    settings_ = ServerConfig(engine="sim", api_keys=(KEY,), data_dir=str(tmp_path))
    with serving(App.from_config(settings_, sim_engine())) as base:
        yield base


def test_http_continues_after_a_socket_that_continued_the_same_response_closes(
    served: str,
) -> None:
    """Every HTTP continuation of it was a 500 (KeyError in the budget)."""
    first = httpx.post(served + "/v1/responses", json={"model": "sim", "input": "hi"}, headers=AUTH)
    parent = first.json()["id"]
    with connect(ws_url(served), additional_headers=AUTH) as ws:
        frame = ws_turn(ws, input="over the socket", previous_response_id=parent)
        assert frame["type"] == "response.completed", frame
    for text in ("again over HTTP", "and again"):
        reply = httpx.post(
            served + "/v1/responses",
            json={"model": "sim", "input": text, "previous_response_id": parent},
            headers=AUTH,
        )
        assert reply.status_code == 200, reply.text


def test_two_sockets_continuing_one_stored_response_outlive_each_other(served: str) -> None:
    """When one closed, the other was dropped without a close frame on its next hit."""
    first = httpx.post(served + "/v1/responses", json={"model": "sim", "input": "hi"}, headers=AUTH)
    parent = first.json()["id"]
    with connect(ws_url(served), additional_headers=AUTH) as kept:
        with connect(ws_url(served), additional_headers=AUTH) as closing:
            assert ws_turn(closing, input="a", previous_response_id=parent)["type"] == (
                "response.completed"
            )
            assert ws_turn(kept, input="b", previous_response_id=parent)["type"] == (
                "response.completed"
            )
        frame = ws_turn(kept, input="c", previous_response_id=parent)
        assert frame["type"] == "response.completed", frame


def test_a_response_deleted_over_http_is_not_continuable_on_its_socket(served: str) -> None:
    """It stayed continuable on the socket that created it (the delete evicted it
    only from the HTTP cache)."""
    with connect(ws_url(served), additional_headers=AUTH) as ws:
        created = ws_turn(ws, input="keep this", store=True)["response"]["id"]
        deleted = httpx.delete(served + f"/v1/responses/{created}", headers=AUTH)
        assert deleted.status_code == 200, deleted.text
        frame = ws_turn(ws, input="go on", previous_response_id=created)
    assert frame["type"] == "error", frame
    assert frame["error"]["code"] == "previous_response_not_found"
