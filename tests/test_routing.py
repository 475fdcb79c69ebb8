"""Routing to upstream replicas: rendezvous hashing of a conversation key (spread,
stability when a replica leaves or joins, the same choice in any process and any
replica order), replica health, the `pinned` mode for one node and the cluster-router
mode, against the in-test vLLM servers."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from fake_upstreams import FakeUpstream, closed_port_url, serving
from hotloop._core import Prompt
from hotloop.engines.base import Sampling
from hotloop.engines.upstream import Replica, UpstreamConfig, UpstreamEngine, rendezvous

URLS = tuple(f"http://10.0.0.{i}:8000" for i in range(1, 6))
KEYS = [f"resp_{i:05d}" for i in range(10_000)]
SAMPLING = Sampling(max_output_tokens=16, stop_tokens=(7,))


def replicas(urls: tuple[str, ...] = URLS) -> list[Replica]:
    return [Replica(url) for url in urls]


def choices(pool: list[Replica]) -> dict[str, str]:
    return {key: rendezvous(key, pool).url for key in KEYS}


def test_keys_spread_evenly_over_the_replicas() -> None:
    counts = Counter(choices(replicas()).values())
    assert set(counts) == set(URLS)
    share = len(KEYS) / len(URLS)
    assert all(0.9 * share < n < 1.1 * share for n in counts.values()), counts


def test_a_replica_leaving_moves_only_its_own_keys() -> None:
    before = choices(replicas())
    gone = URLS[2]
    after = choices(replicas(tuple(u for u in URLS if u != gone)))
    moved = {key for key in KEYS if before[key] != after[key]}
    # Exactly the keys the departed replica held move (about 1/N), and they spread
    # over the others instead of piling onto one.
    assert moved == {key for key in KEYS if before[key] == gone}
    assert 0.9 / len(URLS) < len(moved) / len(KEYS) < 1.1 / len(URLS)
    assert len(Counter(after[key] for key in moved)) == len(URLS) - 1


def test_a_replica_joining_takes_only_keys_it_now_wins() -> None:
    before = choices(replicas(URLS[:4]))
    after = choices(replicas())
    moved = [key for key in KEYS if before[key] != after[key]]
    assert all(after[key] == URLS[4] for key in moved)
    assert 0.9 / len(URLS) < len(moved) / len(KEYS) < 1.1 / len(URLS)


def test_the_choice_depends_on_the_urls_not_their_order() -> None:
    assert choices(replicas()) == choices(replicas(tuple(reversed(URLS))))


def test_the_weights_are_fixed_by_url_and_key() -> None:
    # blake2b of URL, NUL, key: the same in every process on every machine (Python's
    # own `hash` is salted per process and would send a conversation to a different
    # replica from every node).
    assert Replica("http://10.0.0.1:8000").weight(b"resp_00000") == 0x885D4B81C9008465


def engine(*urls: str, **options: Any) -> UpstreamEngine:
    config = UpstreamConfig(
        dialect="vllm",
        replicas=urls,
        model="m",
        served_model="m",
        context_window=4096,
        **options,
    )
    # The routing never looks at the chat format.
    return UpstreamEngine(config, object())  # type: ignore[arg-type]


async def generate(engine: UpstreamEngine, key: str | None) -> None:
    session = engine.session()
    try:
        async for _ in session.generate(Prompt.from_tokens([1, 2, 3]), SAMPLING, key):
            pass
    finally:
        await session.close()


async def test_every_session_sends_a_conversation_to_its_replica() -> None:
    async with serving(*(FakeUpstream("vllm") for _ in range(3))) as fakes:
        urls = tuple(f.url for f in fakes)
        # Two engines with the replicas listed in different orders: two nodes.
        nodes = [engine(*urls), engine(*reversed(urls))]
        for node in nodes:
            await node.start()
        # The fakes listen on ports chosen by the OS, so which replica owns which key
        # changes from run to run: take keys until every replica owns four (twelve
        # fixed keys left one replica with none in about 2% of runs).
        owned: Counter[str] = Counter()
        keys = []
        for i in range(10_000):
            key = f"conversation-{i}"
            owner = rendezvous(key, nodes[0].replicas).url
            if owned[owner] < 4:
                owned[owner] += 1
                keys.append(key)
            if len(keys) == 4 * len(urls):
                break
        for node in nodes:
            for key in keys:
                for _ in range(2):  # two turns, each a fresh session (HTTP)
                    await generate(node, key)
        for fake in fakes:
            # Each replica saw whole conversations: 4 turns of each key it owns.
            assert all(n == 4 for n in Counter(fake.session_ids).values())
            expected = {k for k in keys if rendezvous(k, nodes[0].replicas).url == fake.url}
            assert set(fake.session_ids) == expected
        assert all(fake.session_ids for fake in fakes)
        for node in nodes:
            await node.close()


async def test_a_failed_replica_hands_only_its_conversations_to_their_second_choice() -> None:
    async with serving(FakeUpstream("vllm"), FakeUpstream("vllm")) as (a, b):
        dead = closed_port_url()
        node = engine(dead, a.url, b.url)
        await node.start()
        owners = {key: rendezvous(key, node.replicas).url for key in KEYS[:60]}
        for key in owners:
            await generate(node, key)
        # The dead replica failed once (marked unhealthy) and is skipped afterwards;
        # its keys went to their next choice, the others to their first.
        assert node.replicas[0].failures == 1
        healthy = node.replicas[1:]
        for fake in (a, b):
            expected = [k for k in owners if rendezvous(k, healthy).url == fake.url]
            assert fake.session_ids == expected
        moved = [k for k, url in owners.items() if url == dead]
        assert moved and all(rendezvous(k, healthy).url in (a.url, b.url) for k in moved)
        await node.close()


async def test_pinned_routing_ignores_the_conversation_key() -> None:
    async with serving(FakeUpstream("vllm"), FakeUpstream("vllm")) as (a, b):
        node = engine(a.url, b.url, routing="pinned")
        await node.start()
        session = node.session()
        for key in ("one", "two", "three"):
            async for _ in session.generate(Prompt.from_tokens([1]), SAMPLING, key):
                pass
        await session.close()
        # One connection, one replica, whatever the keys; the key still rides along.
        assert sorted([len(a.requests), len(b.requests)]) == [0, 3]
        assert a.session_ids + b.session_ids == ["one", "two", "three"]
        await node.close()


async def test_a_cluster_router_gets_every_request_with_the_session_header() -> None:
    async with serving(FakeUpstream("vllm")) as (router,):
        node = engine(router=router.url)
        await node.start()
        for key in ("conv-a", "conv-b", "conv-a"):
            await generate(node, key)
        assert router.session_ids == ["conv-a", "conv-b", "conv-a"]
        await node.close()


def test_unknown_routing_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="unknown upstream routing"):
        engine("http://x", routing="random")
