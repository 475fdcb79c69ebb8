"""The Redis read cache in front of PostgreSQL (both real servers started by the tests):
committed responses are copied to it and read from it, a chain comes back in one
round trip when every record is cached, a delete invalidates, a cold or dead cache
falls back to the store, and the cache never decides what is stored."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
from hotloop.store import open_store
from hotloop.store.redis_cache import CachedStore
from pg_server import PostgresServer
from redis_server import RedisServer
from test_store import long_running, response


@pytest.fixture
async def cached(
    postgres_server: PostgresServer, redis_server: RedisServer
) -> AsyncIterator[CachedStore]:
    store = await open_store(postgres_server.fresh_database(), cache=redis_server.fresh_url())
    assert isinstance(store, CachedStore)
    yield store
    await store.close()


async def test_a_committed_response_is_read_from_the_cache(cached: CachedStore) -> None:
    await cached.put(response("resp_c", owner="key_a"))
    await cached.copied()
    assert orjson.loads(await cached.get("resp_c", "key_a") or b"")["id"] == "resp_c"
    assert (cached.hits, cached.misses) == (1, 0)
    # The owner is checked on a hit as in the store.
    assert await cached.get("resp_c", "key_b") is None


async def test_a_chain_is_served_whole_from_the_cache(cached: CachedStore) -> None:
    for n, previous in ((1, None), (2, "resp_1"), (3, "resp_2")):
        await cached.put(response(f"resp_{n}", previous=previous))
        await cached.copied()
    chain = await cached.load_chain("resp_3", None)
    assert chain is not None and [r.id for r in chain.responses] == ["resp_1", "resp_2", "resp_3"]
    assert cached.hits == 1 and cached.misses == 0


async def test_a_long_running_response_is_cached_with_its_model_turns(
    cached: CachedStore,
) -> None:
    await cached.put(long_running("resp_l"))
    await cached.copied()
    chain = await cached.load_chain("resp_l", None)
    assert chain is not None and cached.hits == 1
    head = chain.head
    assert head.model_turns == long_running("resp_l").model_turns
    assert list(head.output_token_ids) == [1, 2, 3, 4, 5]


async def test_a_miss_reads_the_store_and_fills_the_cache(
    postgres_server: PostgresServer, redis_server: RedisServer
) -> None:
    database = postgres_server.fresh_database()
    plain = await open_store(database)
    for n, previous in ((1, None), (2, "resp_1")):
        await plain.put(response(f"resp_{n}", previous=previous))
    await plain.close()
    store = await open_store(database, cache=redis_server.fresh_url())
    assert isinstance(store, CachedStore)
    try:
        first = await store.load_chain("resp_2", None)
        again = await store.load_chain("resp_2", None)
        assert first == again and first is not None
        assert (store.hits, store.misses) == (1, 1)
    finally:
        await store.close()


async def test_a_delete_invalidates(cached: CachedStore) -> None:
    for n, previous in ((1, None), (2, "resp_1"), (3, "resp_2")):
        await cached.put(response(f"resp_{n}", previous=previous))
        await cached.copied()
    assert await cached.delete("resp_2", None)
    assert await cached.get("resp_2", None) is None
    # A chain through the deleted response is gone too.
    assert await cached.load_chain("resp_3", None) is None


async def test_a_dead_cache_costs_only_hits(postgres_server: PostgresServer) -> None:
    store = await open_store(postgres_server.fresh_database(), cache="redis://127.0.0.1:1/0")
    assert isinstance(store, CachedStore)
    try:
        await store.put(response("resp_d"))
        await store.copied()
        assert await store.get("resp_d", None) is not None
        assert await store.load_chain("resp_d", None) is not None
    finally:
        await store.close()
