"""The upstream engine's vLLM and SGLang dialects against in-test servers that follow
those engines' documented shapes: request bodies, streamed ids, replica pinning and
failover, error codes, timeouts and cancellation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from engine_conversation import IdsPrompt
from fake_upstreams import FakeUpstream, Script, closed_port_url, serving
from hotloop.engines.base import EngineError, Sampling
from hotloop.engines.upstream import (
    UpstreamConfig,
    UpstreamEngine,
    UpstreamSession,
    chat_format_from,
)
from hotloop.native_deps import smollm2_gguf_path

PROMPT = [1, 2, 3, 4, 5]
SAMPLING = Sampling(max_output_tokens=16, temperature=0.5, top_p=0.9, stop_tokens=(7,))
REPLY = Script().reply


@pytest.fixture
def chat_format() -> Any:
    # The upstream engine only hands its chat format to the protocol layer.
    return object()


async def started(chat_format: Any, dialect: str, *urls: str, **options: Any) -> UpstreamEngine:
    config = UpstreamConfig(
        dialect=dialect, replicas=urls, model="served", context_window=4096, **options
    )
    engine = UpstreamEngine(config, chat_format)
    await engine.start()
    return engine


async def collect(session: UpstreamSession, ids: list[int] = PROMPT) -> list[int]:
    out: list[int] = []
    async for batch in session.generate(IdsPrompt(ids), SAMPLING):  # type: ignore[arg-type]
        out.extend(batch)
    return out


@pytest.fixture
async def vllm() -> AsyncIterator[FakeUpstream]:
    async with serving(FakeUpstream("vllm")) as (server,):
        yield server


async def test_vllm_request_and_stream(chat_format: Any, vllm: FakeUpstream) -> None:
    engine = await started(chat_format, "vllm", vllm.url)
    session = engine.session()
    assert await collect(session) == REPLY
    (request,) = vllm.requests
    assert request == {
        "model": "served-by-fake",  # from the replica's /v1/models
        "prompt": PROMPT,
        "max_tokens": 16,
        "stream": True,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stop_token_ids": [7],
        "temperature": 0.5,
        "top_p": 0.9,
    }
    await session.close()
    await engine.close()


async def test_vllm_model_name_is_asked_once_per_replica(chat_format: Any) -> None:
    async with serving(FakeUpstream("vllm")) as (server,):
        config = UpstreamConfig(
            dialect="vllm", replicas=(server.url,), model="clients-name", context_window=4096
        )
        engine = UpstreamEngine(config, chat_format)
        await engine.start()
        sessions = [engine.session() for _ in range(2)]
        for session in sessions * 2:
            await collect(session)
        assert [r["model"] for r in server.requests] == ["served-by-fake"] * 4
        assert server.model_lookups == 1
        for session in sessions:
            await session.close()
        await engine.close()


@pytest.mark.parametrize("incremental", [False, True])
async def test_sglang_request_and_both_streaming_modes(chat_format: Any, incremental: bool) -> None:
    async with serving(FakeUpstream("sglang", Script(incremental=incremental))) as (server,):
        engine = await started(chat_format, "sglang", server.url)
        session = engine.session()
        assert await collect(session) == REPLY
        (request,) = server.requests
        assert request == {
            "input_ids": PROMPT,
            "sampling_params": {
                "max_new_tokens": 16,
                "stop_token_ids": [7],
                "skip_special_tokens": False,
                "temperature": 0.5,
                "top_p": 0.9,
            },
            "stream": True,
        }
        await session.close()
        await engine.close()


async def test_sessions_pin_to_replicas_for_every_turn(chat_format: Any) -> None:
    async with serving(FakeUpstream("vllm"), FakeUpstream("vllm")) as (r1, r2):
        engine = await started(chat_format, "vllm", r1.url, r2.url)
        a, b = engine.session(), engine.session()
        for _ in range(3):
            await collect(a)
            await collect(b)
        # Least-loaded pinning spreads the two sessions; each stays where it started.
        assert len(r1.requests) == len(r2.requests) == 3
        assert a.replica is not None and b.replica is not None
        assert {a.replica.url, b.replica.url} == {r1.url, r2.url}
        await a.close()
        await b.close()
        await engine.close()


async def test_a_refused_replica_is_skipped_before_the_first_token(
    chat_format: Any, vllm: FakeUpstream
) -> None:
    dead = closed_port_url()
    engine = await started(chat_format, "vllm", dead, vllm.url)
    first = engine.session()
    assert await collect(first) == REPLY  # retried on the live replica
    assert first.replica is not None and first.replica.url == vllm.url
    assert engine.replicas[0].failures == 1
    # New sessions avoid the replica in cooldown even though it has fewer sessions.
    second = engine.session()
    await collect(second)
    assert second.replica is not None and second.replica.url == vllm.url
    assert len(vllm.requests) == 2
    await first.close()
    await second.close()
    await engine.close()


async def test_a_5xx_before_the_first_token_retries_elsewhere(chat_format: Any) -> None:
    failing = FakeUpstream("vllm", Script(status=503))
    async with serving(failing, FakeUpstream("vllm")) as (bad, good):
        engine = await started(chat_format, "vllm", bad.url, good.url)
        session = engine.session()
        assert await collect(session) == REPLY
        assert len(bad.requests) == 1 and len(good.requests) == 1
        await session.close()
        await engine.close()


async def test_every_replica_failing_is_upstream_error(chat_format: Any) -> None:
    async with serving(FakeUpstream("vllm", Script(status=500))) as (bad,):
        engine = await started(chat_format, "vllm", bad.url, closed_port_url())
        session = engine.session()
        with pytest.raises(EngineError) as info:
            await collect(session)
        assert info.value.code in {"upstream_error", "upstream_unavailable"}
        assert info.value.before_first_token
        await session.close()
        await engine.close()


async def test_a_4xx_is_rejected_without_retry(chat_format: Any) -> None:
    async with serving(FakeUpstream("vllm", Script(status=400)), FakeUpstream("vllm")) as (
        bad,
        good,
    ):
        engine = await started(chat_format, "vllm", bad.url, good.url)
        session = engine.session()
        with pytest.raises(EngineError) as info:
            await collect(session)
        assert info.value.code == "upstream_rejected"
        assert "scripted failure" in info.value.message
        assert good.requests == []
        await session.close()
        await engine.close()


async def test_a_stream_cut_after_the_first_token_fails_without_retry(chat_format: Any) -> None:
    async with serving(FakeUpstream("sglang", Script(drop_after=2)), FakeUpstream("sglang")) as (
        cut,
        other,
    ):
        engine = await started(chat_format, "sglang", cut.url, other.url)
        session = engine.session()
        received: list[int] = []
        with pytest.raises(EngineError) as info:
            async for batch in session.generate(IdsPrompt(PROMPT), SAMPLING):  # type: ignore[arg-type]
                received.extend(batch)
        assert info.value.code == "upstream_error"
        assert not info.value.before_first_token
        assert received == REPLY[:2]
        assert other.requests == []
        await session.close()
        await engine.close()


async def test_silence_is_a_timeout(chat_format: Any) -> None:
    async with serving(FakeUpstream("vllm", Script(hold_after=0))) as (silent,):
        engine = await started(chat_format, "vllm", silent.url, read_timeout=0.2)
        session = engine.session()
        with pytest.raises(EngineError) as info:
            await collect(session)
        assert info.value.code == "upstream_timeout"
        await silent.disconnected.wait()
        await session.close()
        await engine.close()


async def test_closing_the_stream_disconnects_from_the_upstream(chat_format: Any) -> None:
    async with serving(FakeUpstream("vllm", Script(hold_after=2))) as (server,):
        engine = await started(chat_format, "vllm", server.url)
        session = engine.session()
        stream = session.generate(IdsPrompt(PROMPT), SAMPLING)  # type: ignore[arg-type]
        assert await anext(stream) == REPLY[:1]
        await stream.aclose()
        # The upstream sees the client go away, which is how vLLM/SGLang abort a request.
        await server.disconnected.wait()
        await session.close()
        await engine.close()


def test_unknown_dialect_is_a_configuration_error(chat_format: Any) -> None:
    with pytest.raises(ValueError, match="unknown upstream dialect"):
        UpstreamEngine(
            UpstreamConfig(dialect="tgi", replicas=("http://x",), model="m", context_window=1),
            chat_format,
        )


def test_chat_formats_from_configuration() -> None:
    harmony = chat_format_from(
        UpstreamConfig(dialect="vllm", replicas=("http://x",), model="gpt-oss", context_window=1)
    )
    assert harmony.name == "harmony"
    assert harmony.stop_tokens == [200002, 200012]  # <|return|>, <|call|>
    chatml = chat_format_from(
        UpstreamConfig(
            dialect="llamacpp",
            replicas=("http://x",),
            model="smollm2",
            context_window=1,
            chat_format="chatml",
            tokenizer=str(smollm2_gguf_path()),
        )
    )
    assert chatml.name == "chatml"
    assert chatml.tokenizer.vocab_size == 49152
