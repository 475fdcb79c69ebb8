"""Replicas that misbehave (issue 21: defect 8 and the upstream minors), against in-test
servers (tests/fake_upstreams.py): an endless event line fails the response with
`upstream_protocol` and marks the replica unhealthy, holding at most the line bound; a
replica that ignores `max_tokens` is cut at the budget and its request cancelled; one
that keeps the stream alive with comments forever meets the response deadline."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson
import pytest
from fake_upstreams import FakeUpstream, Script, serving
from hotloop._core import ChatFormat, Prompt, ResponseReader
from hotloop.config import ServerConfig
from hotloop.engines.base import EngineError, Sampling
from hotloop.engines.upstream import UpstreamConfig, UpstreamEngine
from hotloop.transport import App

PROMPT = [1, 2, 3, 4, 5]
SAMPLING = Sampling(max_output_tokens=16, temperature=None, top_p=None, stop_tokens=(7,))
MIB = 1024 * 1024
TOKEN = b'data: {"choices":[{"index":0,"text":"","token_ids":[100],"finish_reason":null}]}\n\n'


@pytest.fixture
def chat_format() -> Any:
    return object()


async def generate(engine: UpstreamEngine) -> tuple[list[int], EngineError | None]:
    """The ids a response got, and the failure that ended it (None: it ended)."""
    session = engine.session()
    received: list[int] = []
    try:
        async for batch in session.generate(Prompt.from_tokens(PROMPT), SAMPLING):
            received.extend(batch)
    except EngineError as e:
        return received, e
    finally:
        await session.close()
    return received, None


async def started(chat_format: Any, url: str, **options: Any) -> UpstreamEngine:
    config = UpstreamConfig(
        dialect="vllm", replicas=(url,), model="served", context_window=4096, **options
    )
    engine = UpstreamEngine(config, chat_format)
    await engine.start()
    return engine


def test_the_reader_holds_at_most_the_line_bound() -> None:
    """Before: the incomplete line grew with every read (2 GiB of RSS for 2 GiB sent)."""
    reader = ResponseReader("vllm", 64 * 1024)
    reader.feed(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: ")
    held = 0
    for _ in range(1000):
        reader.feed(b"x" * 4096)
        held = max(held, reader.buffered)
        if reader.failure is not None:
            break
    assert held <= 64 * 1024
    assert reader.buffered == 0
    assert reader.failure is not None
    assert reader.failure[0] == "upstream_protocol"


async def test_an_endless_line_fails_upstream_protocol_and_marks_the_replica(
    chat_format: Any,
) -> None:
    """Before: the line was buffered whole (here 64 MiB, then silence: a timeout after
    the read timeout, with the replica still healthy)."""
    endless = Script(
        hold_after=1, endless_start=b"data: ", endless=b"x" * 65536, endless_limit=64 * MIB
    )
    async with serving(FakeUpstream("vllm", endless)) as (replica,):
        engine = await started(chat_format, replica.url, max_line_bytes=MIB, read_timeout=5.0)
        try:
            received, failure = await generate(engine)
            assert received == Script().reply[:1]
            assert failure is not None and failure.code == "upstream_protocol", failure
            assert not engine.replicas[0].healthy(time.monotonic())
            await replica.disconnected.wait()
            # The replica was cut off near the bound, not after all it had to send.
            assert replica.endless_sent < 64 * MIB
        finally:
            await engine.close()


async def test_a_replica_ignoring_max_tokens_is_cut_at_the_budget(chat_format: Any) -> None:
    """Before: every id it sent was taken, for as long as it sent them."""
    flood = Script(hold_after=2, endless=TOKEN, endless_limit=len(TOKEN) * 100_000)
    async with serving(FakeUpstream("vllm", flood)) as (replica,):
        engine = await started(chat_format, replica.url)
        try:
            received, failure = await generate(engine)
            assert failure is None
            assert len(received) == SAMPLING.max_output_tokens
            assert received == Script().reply[:2] + [100] * 14
            # Cancelled there: the connection was closed under the stream.
            await replica.disconnected.wait()
        finally:
            await engine.close()


async def test_keep_alive_comments_forever_meet_the_response_deadline(chat_format: Any) -> None:
    """Before: each comment reset the read timeout, and the response never ended."""
    chatty = Script(hold_after=1, endless=b": keep-alive\n\n", endless_every=0.02)
    async with serving(FakeUpstream("vllm", chatty)) as (replica,):
        engine = await started(chat_format, replica.url, read_timeout=60.0, response_timeout=0.3)
        try:
            received, failure = await generate(engine)
            assert received == Script().reply[:1]
            assert failure is not None and failure.code == "upstream_timeout"
            assert "no end of the response within 0.3s" in failure.message
            await replica.disconnected.wait()
        finally:
            await engine.close()


async def test_the_response_past_the_budget_ends_incomplete(chat_format: Any) -> None:
    """The whole path: a replica that goes on past `max_tokens` gives the client a
    `response.incomplete` (max_output_tokens) of exactly that many tokens."""
    harmony = ChatFormat.harmony()
    answer = harmony.completion_tokens(text="Hello")[:-1]  # no stop token
    word = harmony.tokenizer.encode(" word")
    event = b'data: {"choices":[{"index":0,"token_ids":%b,"finish_reason":null}]}\n\n'
    flood = Script(
        reply=[*answer, *word],  # the last one never goes: the flood comes instead
        hold_after=len(answer),
        endless=event % orjson.dumps(word),
        endless_limit=len(event) * 100_000,
    )
    async with serving(FakeUpstream("vllm", flood)) as (replica,):
        config = UpstreamConfig(
            dialect="vllm", replicas=(replica.url,), model="m", context_window=1 << 16
        )
        app = App.from_config(
            ServerConfig(engine="upstream", data_dir=""), UpstreamEngine(config, harmony)
        )
        await app.start()
        try:
            transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
            async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
                body = {"model": "m", "input": "hi", "store": False, "max_output_tokens": 40}
                reply = await client.post("/v1/responses", json=body)
            response = reply.json()
            assert response["status"] == "incomplete", response
            assert response["incomplete_details"] == {"reason": "max_output_tokens"}
            assert response["usage"]["output_tokens"] == 40
            await replica.disconnected.wait()
        finally:
            await app.close()
