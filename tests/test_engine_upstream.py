"""The upstream engine's vLLM and SGLang dialects against in-test servers that follow
those engines' documented shapes: request bodies, streamed ids, replica pinning and
failover, error codes, timeouts and cancellation."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import orjson
import pytest
from fake_upstreams import FakeUpstream, Script, closed_port_url, serving
from hotloop._core import Prompt, RequestBodies
from hotloop.engines import upstream
from hotloop.engines.base import ENGINE_CACHED, EngineError, Sampling
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


@asynccontextmanager
async def one_session(
    chat_format: Any, dialect: str, *urls: str, **options: Any
) -> AsyncIterator[UpstreamSession]:
    """A started engine over `urls` and one session on it, both closed afterwards."""
    engine = await started(chat_format, dialect, *urls, **options)
    session = engine.session()
    try:
        yield session
    finally:
        await session.close()
        await engine.close()


async def collect(session: UpstreamSession, ids: list[int] = PROMPT) -> list[int]:
    out: list[int] = []
    async for batch in session.generate(Prompt.from_tokens(ids), SAMPLING):
        out.extend(batch)
    return out


@pytest.fixture
async def vllm() -> AsyncIterator[FakeUpstream]:
    async with serving(FakeUpstream("vllm")) as (server,):
        yield server


async def test_vllm_request_and_stream(chat_format: Any, vllm: FakeUpstream) -> None:
    async with one_session(chat_format, "vllm", vllm.url) as session:
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
            "stream_options": {"include_usage": True},
            "temperature": 0.5,
            "top_p": 0.9,
        }


async def test_the_engines_cached_figure_is_known_with_the_last_ids(chat_format: Any) -> None:
    """vLLM's usage chunk follows the finishing event: it is read before the last ids
    go out, so a consumer that stops at the stop token (as the protocol layer does)
    still has the figure; without the details it stays unknown."""
    for cached, expected in ((64, 64), (None, None)):
        async with (
            serving(FakeUpstream("vllm", Script(cached_tokens=cached))) as (server,),
            one_session(chat_format, "vllm", server.url) as session,
        ):
            stream = session.generate(Prompt.from_tokens(PROMPT), SAMPLING)
            out: list[int] = []
            async for batch in stream:
                out += batch
                if SAMPLING.stop_tokens[0] in batch:
                    break
            await stream.aclose()
            assert out == REPLY
            assert ENGINE_CACHED.get() == expected


async def test_each_turn_sends_exactly_its_prompt_ids(chat_format: Any, vllm: FakeUpstream) -> None:
    # The core writes every body whole from the ids: a grown prompt, one changed inside
    # the last one's prefix and a shorter one must each arrive exactly as given, in the
    # bytes a JSON serializer writes for the same request (compact, fields in order).
    first = [(i * 7919) % 201_088 for i in range(1000)]
    grown = [*first, 200_012, 0, 17]
    changed = [*grown[:300], 5, *grown[301:]]
    turns = [first, grown, changed, changed[:200], []]
    async with one_session(chat_format, "vllm", vllm.url) as session:
        for ids in turns:
            await collect(session, ids)
    assert [request["prompt"] for request in vllm.requests] == turns
    assert vllm.bodies == [orjson.dumps(request) for request in vllm.requests]


def test_request_bodies_equal_a_json_serialization_of_the_same_request() -> None:
    # Prompts that grow, change inside their prefix and shrink, with ids of every
    # length (the core writes those below 10^7 in one store, the rest digit by digit),
    # under each dialect's field and fields: byte for byte what orjson writes. The
    # process's one buffer is written over by the next body unless a view of it is
    # still held (a transport's unfinished write): then the held bytes stay as sent.
    rng = random.Random(7)
    bodies = RequestBodies()
    ids: list[int] = []
    held: list[tuple[memoryview, bytes]] = []
    lengths = [10**k for k in range(10)] + [1 << 18, 2**32]
    for _ in range(200):
        step = rng.random()
        if step < 0.6:
            ids += [rng.randrange(rng.choice(lengths)) for _ in range(rng.randrange(400))]
        elif step < 0.8 and ids:
            ids[rng.randrange(len(ids))] = rng.randrange(201_088)
        else:
            ids = ids[: rng.randrange(len(ids) + 1)]
        dialect = rng.choice(list(upstream.DIALECTS.values()))
        fields = dialect.body("m", SAMPLING)
        fields["n"] = rng.randrange(10 ** rng.randrange(1, 9))
        body = upstream.request_body(dialect, bodies, Prompt.from_tokens(ids), orjson.dumps(fields))
        assert body == orjson.dumps({dialect.prompt_field: ids, **fields})
        if rng.random() < 0.2:
            held.append((body, bytes(body)))  # as a transport holds one mid-write
        else:
            body.release()
        if held and rng.random() < 0.3:
            view, sent = held.pop(0)
            assert view == sent
            view.release()
    for view, sent in held:
        assert view == sent


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
        async with one_session(chat_format, "sglang", server.url) as session:
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


@pytest.mark.parametrize(
    ("dialect", "limit"), [("vllm", ("max_tokens", 1)), ("sglang", ("max_new_tokens", 0))]
)
async def test_a_prewarm_prefills_and_hands_over_no_id(
    chat_format: Any, dialect: str, limit: tuple[str, int]
) -> None:
    """`max_output_tokens` 0: vLLM (which refuses 0) is asked for one id, read to
    the end and discarded; SGLang for none. The engine's cached figure still arrives."""
    prewarm = Sampling(max_output_tokens=0)
    async with (
        serving(FakeUpstream(dialect, Script(cached_tokens=3))) as (server,),
        one_session(chat_format, dialect, server.url) as session,
    ):
        out = [ids async for ids in session.generate(Prompt.from_tokens(PROMPT), prewarm)]
        assert out == []
        assert ENGINE_CACHED.get() == 3
        (request,) = server.requests
        params = request if dialect == "vllm" else request["sampling_params"]
        assert params[limit[0]] == limit[1]
        # The connection went back to the pool: the next turn reuses it.
        assert await collect(session) == REPLY


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
        async with one_session(chat_format, "vllm", bad.url, good.url) as session:
            assert await collect(session) == REPLY
            assert len(bad.requests) == 1 and len(good.requests) == 1


async def test_every_replica_failing_is_upstream_error(chat_format: Any) -> None:
    async with serving(FakeUpstream("vllm", Script(status=500))) as (bad,):
        async with one_session(chat_format, "vllm", bad.url, closed_port_url()) as session:
            with pytest.raises(EngineError) as info:
                await collect(session)
            assert info.value.code in {"upstream_error", "upstream_unavailable"}
            assert info.value.before_first_token


async def test_a_4xx_is_rejected_without_retry(chat_format: Any) -> None:
    async with serving(FakeUpstream("vllm", Script(status=400)), FakeUpstream("vllm")) as (
        bad,
        good,
    ):
        async with one_session(chat_format, "vllm", bad.url, good.url) as session:
            with pytest.raises(EngineError) as info:
                await collect(session)
            assert info.value.code == "upstream_rejected"
            assert "scripted failure" in info.value.message
            assert good.requests == []


async def test_a_stream_cut_after_the_first_token_fails_without_retry(chat_format: Any) -> None:
    async with serving(FakeUpstream("sglang", Script(drop_after=2)), FakeUpstream("sglang")) as (
        cut,
        other,
    ):
        async with one_session(chat_format, "sglang", cut.url, other.url) as session:
            received: list[int] = []
            with pytest.raises(EngineError) as info:
                async for batch in session.generate(Prompt.from_tokens(PROMPT), SAMPLING):
                    received.extend(batch)
            assert info.value.code == "upstream_error"
            assert "the engine went away mid-response" in info.value.message
            assert not info.value.before_first_token
            assert received == REPLY[:2]
            assert other.requests == []


async def test_silence_is_a_timeout(chat_format: Any) -> None:
    async with serving(FakeUpstream("vllm", Script(hold_after=0))) as (silent,):
        async with one_session(chat_format, "vllm", silent.url, read_timeout=0.2) as session:
            with pytest.raises(EngineError) as info:
                await collect(session)
            assert info.value.code == "upstream_timeout"
            await silent.disconnected.wait()


async def test_closing_the_stream_disconnects_from_the_upstream(chat_format: Any) -> None:
    async with serving(FakeUpstream("vllm", Script(hold_after=2))) as (server,):
        async with one_session(chat_format, "vllm", server.url) as session:
            stream = session.generate(Prompt.from_tokens(PROMPT), SAMPLING)
            # The first batch holds what the first read held (one event or both).
            assert (await anext(stream))[:1] == REPLY[:1]
            await stream.aclose()
            # The upstream sees the client go away, which is how vLLM/SGLang abort a request.
            await server.disconnected.wait()


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


async def test_the_chat_format_is_built_at_start_not_by_the_first_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first connection must not pay for the harmony vocabulary (or a chatml
    tokenizer): `start` builds it, and a wrong format fails the start, not a request."""
    built: list[str] = []

    def counted(config: UpstreamConfig) -> Any:
        built.append(config.chat_format)
        return chat_format_from(config)

    monkeypatch.setattr(upstream, "chat_format_from", counted)
    config = UpstreamConfig(dialect="vllm", replicas=("http://x",), model="m", context_window=1)
    engine = UpstreamEngine(config)
    assert built == []
    await engine.start()
    assert built == ["harmony"]
    assert engine.chat_format.name == "harmony"
    assert built == ["harmony"]
    await engine.close()
    wrong = UpstreamEngine(replace(config, chat_format="alpaca"))
    with pytest.raises(ValueError, match="unknown chat format"):
        await wrong.start()


async def test_a_connection_closed_before_answering_is_retried_on_the_same_replica(
    chat_format: Any,
) -> None:
    # What a keep-alive race looks like from the client: the server accepts the request,
    # then closes the connection without a byte of response. A raw server does it once.
    requests = 0
    body = b"".join(
        b"data: "
        + orjson.dumps({"choices": [{"index": 0, "token_ids": [t], "finish_reason": None}]})
        + b"\n\n"
        for t in REPLY[:-1]
    )
    body += (
        b"data: "
        + orjson.dumps(
            {"choices": [{"index": 0, "token_ids": REPLY[-1:], "finish_reason": "stop"}]}
        )
        + b"\n\ndata: [DONE]\n\n"
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        requests += 1
        if requests > 1:
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    engine = await started(chat_format, "vllm", f"http://127.0.0.1:{port}", served_model="m")
    session = engine.session()
    assert await collect(session) == REPLY
    assert requests == 2
    assert engine.replicas[0].failures == 0
    await session.close()
    await engine.close()
    server.close()
    await server.wait_closed()


@pytest.mark.parametrize(
    ("dialect", "field", "told"),
    [("vllm", "cache_salt", 64), ("sglang", "extra_key", 64), ("llamacpp", None, None)],
)
async def test_a_sessions_salt_goes_where_the_server_partitions_its_cache(
    chat_format: Any, dialect: str, field: str | None, told: int | None
) -> None:
    """A salted session's requests carry its salt in the field that keys the server's
    prefix cache; llama.cpp server has none, so its figure, which may count another
    tenant's prompt, is not told to a salted session (an unsalted one still gets it)."""
    async with serving(FakeUpstream(dialect, Script(cached_tokens=64))) as (server,):
        engine = await started(chat_format, dialect, server.url)
        for salt, expected in ((None, 64), ("tenant-salt", told)):
            session = engine.session(salt)
            assert await collect(session) == REPLY
            assert ENGINE_CACHED.get() == expected
            await session.close()
        unsalted, salted = server.requests
        assert {"cache_salt", "extra_key"}.isdisjoint(unsalted)
        if field is None:
            assert {"cache_salt", "extra_key"}.isdisjoint(salted)
        else:
            assert salted[field] == "tenant-salt"
        await engine.close()


async def collect_routed(session: UpstreamSession, route_key: str) -> list[int]:
    out: list[int] = []
    async for batch in session.generate(Prompt.from_tokens(PROMPT), SAMPLING, route_key):
        out.extend(batch)
    return out
