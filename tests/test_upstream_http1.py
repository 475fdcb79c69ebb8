"""The upstream engine's own HTTP/1.1 client (`hotloop.engines.http1`) against raw
loopback servers that frame their answers the ways real servers do (chunked in pieces,
length-delimited, closed idle connections, a body cut short): the ids come through
whole, keep-alive connections are reused and never reused broken, and headers cannot
be used to smuggle a second request."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
import uvloop
from fake_upstreams import FakeUpstream, Script, serving
from hotloop._core import Prompt
from hotloop.engines import base, http1
from hotloop.engines.base import EngineError, Sampling
from hotloop.engines.upstream import UpstreamConfig, UpstreamEngine

PROMPT = [1, 2, 3]
SAMPLING = Sampling(max_output_tokens=16)
REPLY = [11, 12, 13, 14]

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def events(reply: list[int] = REPLY) -> list[bytes]:
    out = []
    for i, token in enumerate(reply):
        finish = "stop" if i == len(reply) - 1 else None
        choice = {"index": 0, "text": "", "token_ids": [token], "finish_reason": finish}
        out.append(b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


def chunked_stream() -> bytes:
    """A whole 200 response streaming `events()` in one chunk each, as vLLM frames it."""
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events()) + b"0\r\n\r\n"
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n" + body
    )


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    return head


@asynccontextmanager
async def raw_server(handle: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A loopback server running `handle` per connection; yields its URL and a list
    that counts the connections accepted."""
    accepted: list[int] = []

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handle(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(counted, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", accepted
    finally:
        server.close()
        await server.wait_closed()


async def engine_for(url: str, **options: Any) -> UpstreamEngine:
    config = UpstreamConfig(
        dialect="vllm",
        replicas=(url,),
        model="m",
        served_model="m",
        context_window=4096,
        **options,
    )
    engine = UpstreamEngine(config, object())  # type: ignore[arg-type]
    await engine.start()
    return engine


async def collect(engine: UpstreamEngine, route_key: str | None = None) -> list[int]:
    session = engine.session()
    out: list[int] = []
    try:
        async for batch in session.generate(Prompt.from_tokens(PROMPT), SAMPLING, route_key):
            out.extend(batch)
    finally:
        await session.close()
    return out


async def test_a_stream_written_byte_by_byte_decodes_whole_and_the_connection_is_reused() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            response = chunked_stream()
            for i in range(len(response)):
                writer.write(response[i : i + 1])
                await writer.drain()

    async with raw_server(handle) as (url, accepted):
        engine = await engine_for(url)
        assert await collect(engine) == REPLY
        assert await collect(engine) == REPLY
        assert len(accepted) == 1  # the second turn went over the kept-alive connection
        await engine.close()


class Request:
    """Stands for a turn's request (weakly referable, unlike a bytes frame)."""


async def opening_turn_is_not_held() -> None:
    """A transport keeps the context it was created in; a turn's context holds its
    request (`SERVING`). The pooled connection must not keep that request alive."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(chunked_stream())
            await writer.drain()

    turn_request: contextvars.ContextVar[Request | None] = contextvars.ContextVar("request")

    async def turn(request: Request) -> list[int]:
        turn_request.set(request)
        return await collect(engine)

    async with raw_server(handle) as (url, accepted):
        engine = await engine_for(url)
        request = Request()
        gone = weakref.ref(request)
        assert await asyncio.create_task(turn(request)) == REPLY
        del request
        await asyncio.sleep(0)  # the finished task's done callbacks, which hold it, run
        gc.collect()
        assert gone() is None, "the idle connection holds the turn's context"
        assert await collect(engine) == REPLY
        assert len(accepted) == 1  # and the connection was kept and reused
        await engine.close()


async def test_a_kept_alive_connection_does_not_hold_the_turn_that_opened_it() -> None:
    await opening_turn_is_not_held()


def test_a_kept_alive_connection_does_not_hold_the_turn_that_opened_it_on_uvloop() -> None:
    # `hotloop serve`'s loop: its transports keep their context as asyncio's do.
    uvloop.run(opening_turn_is_not_held())


async def test_a_length_delimited_stream_and_an_idle_connection_the_server_closed() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        body = b"".join(events())
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        # Then the server closes the kept-alive connection while it is idle.

    async with raw_server(handle) as (url, accepted):
        engine = await engine_for(url)
        assert await collect(engine) == REPLY
        assert await collect(engine) == REPLY
        assert len(accepted) == 2
        assert engine.replicas[0].failures == 0
        await engine.close()


async def test_a_body_cut_after_the_first_token_is_a_transport_failure() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        first = events()[0]
        writer.write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n"
            % (len(first), first)
        )
        await writer.drain()

    async with raw_server(handle) as (url, accepted):
        engine = await engine_for(url)
        received: list[int] = []
        session = engine.session()
        with pytest.raises(EngineError) as info:
            async for batch in session.generate(Prompt.from_tokens(PROMPT), SAMPLING):
                received.extend(batch)
        assert info.value.code == "upstream_unavailable"
        assert not info.value.before_first_token
        assert received == REPLY[:1]
        assert len(accepted) == 1
        await session.close()
        await engine.close()


async def test_a_session_header_with_a_line_break_cannot_inject_a_header() -> None:
    async with serving(FakeUpstream("vllm")) as (server,):
        engine = await engine_for(server.url)
        with pytest.raises(EngineError) as info:
            await collect(engine, route_key="conv\r\nx-injected: 1")
        assert info.value.code == "upstream_rejected"
        assert server.requests == []
        assert await collect(engine, route_key="conv") == Script().reply
        assert server.session_ids == ["conv"]
        await engine.close()


async def test_no_free_connection_within_the_connect_timeout_is_a_timeout() -> None:
    async with serving(FakeUpstream("vllm", Script(hold_after=1))) as (server,):
        engine = await engine_for(server.url, max_connections=1, connect_timeout=0.2)
        holder = engine.session()
        stream = holder.generate(Prompt.from_tokens(PROMPT), SAMPLING)
        assert (await anext(stream))[:1] == Script().reply[:1]
        with pytest.raises(EngineError) as info:
            await collect(engine)
        assert info.value.code == "upstream_timeout"
        await stream.aclose()  # type: ignore[attr-defined]
        await server.disconnected.wait()
        await holder.close()
        await engine.close()


async def test_a_paced_consumer_takes_what_arrived_between_its_asks_in_one_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--stream-coalesce-ms`: while the consumer waits between asks, the socket is left
    unread, so the events the replica wrote one by one meanwhile come in one read;
    unpaced, each is read as it arrives."""
    reply = [20, 21, 22, 23, 24, 25, 26]
    reads: list[int] = []
    feed = http1.Link.data_received

    def counted(link: http1.Link, data: bytes) -> None:
        reads.append(len(data))
        feed(link, data)

    monkeypatch.setattr(http1.Link, "data_received", counted)

    async def run(paced: bool) -> tuple[list[list[int]], int, int]:
        """The batches, the reads while the replica wrote, the reads the ask took."""
        asked = asyncio.Event()
        written = asyncio.Event()
        taken = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            chunks = [b"%x\r\n%s\r\n" % (len(e), e) for e in events(reply)] + [b"0\r\n\r\n"]
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n" + chunks[0]
            )
            await writer.drain()
            await asked.wait()
            for chunk in chunks[1:-3]:  # each its own write, the loop polling between
                writer.write(chunk)
                await writer.drain()
                await asyncio.sleep(0.005)
            written.set()
            await taken.wait()
            writer.write(b"".join(chunks[-3:]))
            await writer.drain()

        async with raw_server(handle) as (url, _):
            engine = await engine_for(url)
            session = engine.session()
            base.PACED.set(paced)
            stream = session.generate(Prompt.from_tokens(PROMPT), SAMPLING)
            batches = [await anext(stream)]
            start = len(reads)
            asked.set()
            await written.wait()
            before = len(reads)
            batches.append(await anext(stream))
            held_reads = len(reads) - before
            taken.set()
            batches += [batch async for batch in stream]
            await session.close()
            await engine.close()
        return batches, before - start, held_reads

    paced, meanwhile, at_ask = await run(True)
    assert paced[:2] == [[20], [21, 22, 23, 24, 25]]
    assert [i for batch in paced for i in batch] == reply
    assert (meanwhile, at_ask) == (0, 1)  # the five events, written apart, in one read
    unpaced, meanwhile, at_ask = await run(False)
    assert unpaced[:2] == paced[:2]  # handed over together too
    assert [i for batch in unpaced for i in batch] == reply
    assert (meanwhile, at_ask) == (5, 0)  # but each read as it came
