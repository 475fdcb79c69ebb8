"""The upstream engine's llama.cpp dialect against a real `llama-server` on loopback
serving SmolLM2: streamed ids, and the server's own timings showing that turns 2+ of a
conversation evaluate only their new prompt tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from engine_conversation import IM_END, first_turn, next_turn
from hotloop._core import Prompt
from hotloop.engines.base import ENGINE_CACHED, Sampling
from hotloop.engines.upstream import UpstreamConfig, UpstreamEngine, UpstreamSession
from hotloop.lab.llama_server import LlamaServer
from hotloop.native_deps import ensure_llama_server, smollm2_gguf_path

pytestmark = pytest.mark.model

SAMPLING = Sampling(max_output_tokens=24, temperature=0.0, stop_tokens=(IM_END,))


@pytest.fixture(scope="module")
def llama_server(pytestconfig: pytest.Config) -> Path:
    """The cached binary; the first run on a machine builds it (several minutes), with
    its progress shown instead of captured: `make native` does not build it, since the
    default engine does not need it."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        return ensure_llama_server()


@pytest.fixture
async def engine(llama_server: Path) -> AsyncIterator[UpstreamEngine]:
    server = LlamaServer(llama_server, smollm2_gguf_path(), n_ctx=4096, parallel=2, threads=1)
    await server.start()
    config = UpstreamConfig(
        dialect="llamacpp", replicas=(server.url,), model="smollm2", context_window=4096
    )
    engine = UpstreamEngine(config, chat_format=object())
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()
        await server.stop()
        # pytest shows captured output of failing tests only: the server's side of it.
        print("\n".join(server.log))


async def collect(session: UpstreamSession, ids: list[int]) -> list[int]:
    out: list[int] = []
    async for batch in session.generate(Prompt.from_tokens(ids), SAMPLING):
        out.extend(batch)
    return out


async def test_turns_after_the_first_evaluate_only_new_prompt_tokens(
    engine: UpstreamEngine,
) -> None:
    session = engine.session()
    prompt = first_turn("What is 2+2?")
    reply = await collect(session, prompt)
    assert reply
    assert session.last_timings is not None
    assert session.last_timings["prompt_n"] == len(prompt)

    for question in ("And 3+3?", "And 4+4?"):
        following = next_turn(prompt, reply, question)
        # The server's slot holds the previous prompt and the reply but its last id
        # (sampled, never decoded): everything else is served from its KV cache.
        new_tokens = len(following) - (len(prompt) + len(reply) - 1)
        reply = await collect(session, following)
        timings = session.last_timings
        assert timings is not None
        assert timings["prompt_n"] == new_tokens
        assert timings["cache_n"] == len(following) - new_tokens
        # The figure a response's usage reports as the engine's (`engine_cached_tokens`).
        assert ENGINE_CACHED.get() == timings["cache_n"]
        prompt = following
    await session.close()


async def test_two_sessions_keep_their_own_slots(engine: UpstreamEngine) -> None:
    a, b = engine.session(), engine.session()
    pa = first_turn("Name three fruits.")
    pb = first_turn("Name three colours.")
    ra = await collect(a, pa)
    rb = await collect(b, pb)
    pa2 = next_turn(pa, ra, "Which is sweetest?")
    await collect(a, pa2)
    assert a.last_timings is not None
    assert a.last_timings["cache_n"] > len(pa) // 2
    pb2 = next_turn(pb, rb, "Which is brightest?")
    await collect(b, pb2)
    assert b.last_timings is not None
    assert b.last_timings["cache_n"] > len(pb) // 2
    await a.close()
    await b.close()


async def test_a_prewarm_fills_the_slot_and_the_next_turn_hits_it(engine: UpstreamEngine) -> None:
    """`n_predict: 0` with `cache_prompt`: the server evaluates the prompt and samples
    nothing; the turn on that prompt then finds all of it but the last id cached."""
    session = engine.session()
    prompt = first_turn("Name three rivers in Europe.")
    prewarm = Sampling(max_output_tokens=0)
    assert [ids async for ids in session.generate(Prompt.from_tokens(prompt), prewarm)] == []
    warm = session.last_timings
    assert warm is not None and warm["prompt_n"] == len(prompt)
    assert await collect(session, prompt)
    timings = session.last_timings
    assert timings is not None
    assert timings["cache_n"] == len(prompt) - 1
    await session.close()
