"""The drain in isolation: in-flight accounting through the drained engine, refusal
once draining, the deadline; and API keys."""

from __future__ import annotations

import asyncio

import pytest
from hotloop._core import ChatFormat, Prompt
from hotloop.auth import ApiKeys, AuthError, Credential, key_id, keyed_label
from hotloop.engines.base import EngineError, Sampling, close_stream
from hotloop.engines.sim import SimEngine, SimSpeed
from hotloop.shutdown import Drain, ShuttingDown
from loop_order import scheduled_callbacks_ran

FORMAT = ChatFormat.harmony()


async def test_wait_returns_when_the_last_response_finishes() -> None:
    drain = Drain()
    drain.admit()
    drain.admit()
    waiter = asyncio.create_task(drain.wait(deadline=3600))
    await scheduled_callbacks_ran()
    assert drain.draining and not waiter.done()
    with pytest.raises(ShuttingDown):
        drain.admit()
    drain.release()
    await scheduled_callbacks_ran()
    assert not waiter.done()
    drain.release()
    assert await waiter
    assert drain.in_flight == 0


async def test_every_connection_waits_on_the_same_drain() -> None:
    drain = Drain()
    drain.admit()
    waiters = [asyncio.create_task(drain.wait(deadline=3600)) for _ in range(3)]
    await scheduled_callbacks_ran()
    assert not any(w.done() for w in waiters)
    drain.release()
    assert await asyncio.gather(*waiters) == [True, True, True]


async def test_wait_gives_up_at_the_deadline() -> None:
    drain = Drain()
    drain.admit()
    assert not await drain.wait(deadline=0)


async def test_idle_drain_is_immediate() -> None:
    assert await Drain().wait(deadline=0)


async def test_a_generation_is_in_flight_until_its_stream_is_closed() -> None:
    drain = Drain()
    engine = drain.engine(SimEngine(FORMAT, speed=SimSpeed(1e6, ttft=0.0)))
    session = engine.session()
    prompt = Prompt.from_tokens([1, 2, 3])
    whole = session.generate(prompt, Sampling(1 << 10))
    assert drain.in_flight == 1
    got = [ids async for ids in whole]
    assert [i for batch in got for i in batch] == FORMAT.completion_tokens(text="Done.")
    assert drain.in_flight == 1  # until the consumer closes it, finished or not
    await close_stream(whole)
    await close_stream(whole)  # closing twice releases once
    assert drain.in_flight == 0
    cut = session.generate(prompt, Sampling(1 << 10))
    async for _ in cut:
        break
    await close_stream(cut)
    assert drain.in_flight == 0
    waiter = asyncio.create_task(drain.wait(deadline=3600))
    await scheduled_callbacks_ran()
    with pytest.raises(EngineError) as refused:
        session.generate(prompt, Sampling(1 << 10))
    assert refused.value.code == "server_shutting_down"
    assert await waiter


def test_api_keys() -> None:
    keys = ApiKeys(["sk-one", "two:sk-two"], label_secret="s")
    assert keys.enabled
    assert keys.authenticate(b"Bearer sk-two") == Credential("sk-two", key_id("sk-two"), "two")
    assert keys.authenticate(b"bearer  sk-one ") == Credential(
        "sk-one", key_id("sk-one"), keyed_label("sk-one", b"s")
    )
    for header, code in (
        (None, "missing_api_key"),
        (b"", "missing_api_key"),
        (b"sk-one", "invalid_api_key"),
        (b"Basic sk-one", "invalid_api_key"),
        (b"Bearer sk-three", "invalid_api_key"),
    ):
        with pytest.raises(AuthError) as refused:
            keys.authenticate(header)
        assert refused.value.code == code
    assert ApiKeys().authenticate(None) is None
    assert key_id("sk-one").startswith("key_") and "sk-one" not in key_id("sk-one")
