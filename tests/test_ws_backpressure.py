"""A client that does not read: generation pauses at the outbox's high-water mark, so
server memory stays bounded, and resumes, in order, once the client reads again.
Also: a client that disconnects mid-response cancels its generation. Against a real
upstream connection, with and without `--stream-coalesce-ms` (whose link leaves the
socket unread between asks): the upstream backs up instead of hotloop buffering, and a
client gone mid-stream closes the upstream exchange."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from hotloop._core import ChatFormat, Prompt
from hotloop.config import ServerConfig
from hotloop.engines.base import Sampling
from hotloop.engines.sim import SimScript, SimSpeed
from hotloop.lab.scripted import ScriptedClient
from hotloop.protocol import CacheBudget, Connection, ConnectionCache
from hotloop.transport import App
from hotloop.transport.asgi import Message
from hotloop.transport.websocket import Socket
from sdk_events import validate
from servers import serving, sim_engine

FORMAT = ChatFormat.harmony()
LONG = FORMAT.completion_tokens(text="token " * 3000)
HIGH_WATER = 4096


class Firehose:
    """An engine session that never waits: it yields one token at a time as fast as
    it is pulled, and records how far it got."""

    def __init__(self) -> None:
        self.yielded = 0
        self.largest_outbox = 0
        self.socket: Socket | None = None

    async def generate(
        self, prompt: Prompt, sampling: Sampling, route_key: str | None = None
    ) -> AsyncIterator[list[int]]:
        for token in LONG:
            assert self.socket is not None
            self.largest_outbox = max(self.largest_outbox, self.socket.outbox_bytes)
            self.yielded += 1
            yield [token]

    async def close(self) -> None:
        """Nothing to release."""


async def test_slow_reader_pauses_generation_and_memory_stays_bounded() -> None:
    session = Firehose()
    connection = Connection(
        chat_format=FORMAT,
        context_window=1 << 20,
        model="sim",
        cache=ConnectionCache(1 << 30, CacheBudget(1 << 30)),
    )
    reading = asyncio.Event()  # the client starts reading when this is set
    sent: list[str] = []
    client = ScriptedClient(
        orjson.dumps({"type": "response.create", "model": "sim", "input": "go"}).decode()
    )

    async def send(message: Message) -> None:
        await reading.wait()
        sent.append(message["text"])
        if '"response.completed"' in message["text"]:
            client.finish()

    socket = Socket(connection, session, send, high_water=HIGH_WATER, lifetime=3600)
    session.socket = socket
    run = asyncio.create_task(socket.run(client.receive))
    await socket.paused.wait()
    # Paused well before the end of the answer, with a bounded outbox.
    assert session.yielded < len(LONG) // 4
    assert socket.outbox_bytes <= HIGH_WATER + 1024
    reading.set()
    await run
    assert session.yielded == len(LONG)
    assert session.largest_outbox <= HIGH_WATER + 1024
    assert socket.stalls >= 1
    events = [validate(frame) for frame in sent]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"


class Watched:
    """Wraps a sim engine; records, across threads, when a generation is closed."""

    def __init__(self, speed: SimSpeed) -> None:
        self.inner = sim_engine(SimScript(text="word " * 2000), speed)
        self.closed = threading.Event()
        self.tokens = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def session(self, cache_salt: str | None = None) -> Watched.Session:
        return Watched.Session(self, cache_salt)

    class Session:
        def __init__(self, owner: Watched, cache_salt: str | None) -> None:
            self.owner = owner
            self.inner = owner.inner.session(cache_salt)

        async def generate(
            self, prompt: Prompt, sampling: Sampling, route_key: str | None = None
        ) -> AsyncIterator[list[int]]:
            try:
                async for ids in self.inner.generate(prompt, sampling, route_key):
                    self.owner.tokens += len(ids)
                    yield ids
            finally:
                self.owner.closed.set()

        async def close(self) -> None:
            await self.inner.close()


@pytest.mark.parametrize("coalesce_ms", [0.0, 5.0], ids=["every-event", "coalesced"])
def test_disconnect_mid_stream_cancels_generation(coalesce_ms: float) -> None:
    from websockets.sync.client import connect

    engine = Watched(SimSpeed(tokens_per_second=200.0, ttft=0.0, prefill_tokens_per_second=1e9))
    config = ServerConfig(engine="sim", stream_coalesce_ms=coalesce_ms)
    app = App(engine, config)  # type: ignore[arg-type]
    with serving(app) as base:
        with connect(base.replace("http://", "ws://") + "/v1/responses") as ws:
            create = {"type": "response.create", "model": "sim", "input": "long"}
            ws.send(orjson.dumps(create).decode())
            while validate(ws.recv())["type"] != "response.output_text.delta":
                pass
        assert engine.closed.wait(timeout=60)
        assert engine.tokens < 2000


class PacedOutVllm:
    """A vLLM that streams `LONG` as fast as its socket takes it, each event padded to
    `PAD` bytes of text (so the stream is far larger than every socket buffer on the
    way), and records when its writes back up (`backed_up`, with the bytes the reader
    had taken by then in `taken`) and whether it got to the end (`finished`)."""

    PAD = 24576

    def __init__(self) -> None:
        self.backed_up = asyncio.Event()
        self.finished = asyncio.Event()
        self.cut = asyncio.Event()
        """The reader closed the connection before the end of the stream."""
        self.written = 0
        self.taken = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
        )
        try:
            await self._stream(writer)
        except ConnectionError:
            self.cut.set()

    async def _stream(self, writer: asyncio.StreamWriter) -> None:
        for i, token in enumerate(LONG):
            finish = "stop" if i == len(LONG) - 1 else None
            choice = {"text": "x" * self.PAD, "token_ids": [token], "finish_reason": finish}
            event = b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\n"
            writer.write(event)
            self.written += len(event)
            # Above asyncio's high-water mark the kernel's buffers are full: the client
            # is not reading as fast as we write.
            buffered = writer.transport.get_write_buffer_size()
            if buffered > 1 << 16:
                self.taken = self.written - buffered
                self.backed_up.set()
            await writer.drain()
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()
        writer.close()
        self.finished.set()


async def upstream_engine(port: int) -> Any:
    from hotloop.engines.upstream import UpstreamConfig, UpstreamEngine

    config = UpstreamConfig(
        dialect="vllm",
        replicas=(f"http://127.0.0.1:{port}",),
        model="served",
        served_model="served",
        context_window=1 << 20,
    )
    engine = UpstreamEngine(config, FORMAT)
    await engine.start()
    return engine


def served_connection() -> Connection:
    return Connection(
        chat_format=FORMAT,
        context_window=1 << 20,
        model="served",
        cache=ConnectionCache(1 << 30, CacheBudget(1 << 30)),
    )


COALESCE = pytest.mark.parametrize("coalesce", [0.0, 0.005], ids=["every-event", "coalesced"])


@COALESCE
async def test_slow_reader_pauses_the_upstream_read(coalesce: float) -> None:
    """The upstream engine reads the vLLM stream only as the socket pulls ids: with the
    client not reading, the upstream's writes back up (the stream is ~70 MB, far more
    than the socket buffers) instead of hotloop buffering it."""
    upstream = PacedOutVllm()
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    engine = await upstream_engine(server.sockets[0].getsockname()[1])
    connection = served_connection()
    reading = asyncio.Event()
    completed: list[dict[str, Any]] = []
    client = ScriptedClient(
        orjson.dumps({"type": "response.create", "model": "sim", "input": "go"}).decode()
    )

    async def send(message: Message) -> None:
        await reading.wait()
        if '"response.completed"' in message["text"]:
            completed.append(orjson.loads(message["text"]))
            client.finish()

    session = engine.session()
    socket = Socket(
        connection, session, send, high_water=HIGH_WATER, lifetime=3600, coalesce=coalesce
    )
    run = asyncio.create_task(socket.run(client.receive))
    try:
        await socket.paused.wait()
        # From here hotloop pulls nothing from the engine: the upstream must back up
        # before the end of its stream, having handed over at most the socket buffers.
        upstream.backed_up.clear()
        backed_up = asyncio.create_task(upstream.backed_up.wait())
        finished = asyncio.create_task(upstream.finished.wait())
        await asyncio.wait({backed_up, finished}, return_when=asyncio.FIRST_COMPLETED)
        assert upstream.backed_up.is_set() and not upstream.finished.is_set()
        total = len(LONG) * upstream.PAD
        assert upstream.taken < total // 2, f"{upstream.taken} of {total} bytes read"
        reading.set()
        await run
        await finished
        assert completed[0]["response"]["usage"]["output_tokens"] == len(LONG)
    finally:
        await session.close()
        await engine.close()
        server.close()
        await server.wait_closed()


@COALESCE
async def test_a_client_gone_mid_stream_closes_the_upstream_exchange(coalesce: float) -> None:
    """The client disconnects after its first delta: the generation is cancelled and its
    upstream connection closed (the replica's next write fails) before the replica
    finishes, with or without coalescing holding the socket unread."""
    upstream = PacedOutVllm()
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    engine = await upstream_engine(server.sockets[0].getsockname()[1])
    client = ScriptedClient(
        orjson.dumps({"type": "response.create", "model": "sim", "input": "go"}).decode()
    )
    deltas = 0

    async def send(message: Message) -> None:
        nonlocal deltas
        if '"response.output_text.delta"' in message["text"]:
            deltas += 1
            client.finish()

    session = engine.session()
    socket = Socket(
        served_connection(), session, send, high_water=1 << 20, lifetime=3600, coalesce=coalesce
    )
    try:
        await asyncio.wait_for(socket.run(client.receive), 30)
        await asyncio.wait_for(upstream.cut.wait(), 30)
        assert deltas >= 1 and not upstream.finished.is_set()
        assert upstream.written < len(LONG) * upstream.PAD // 2
    finally:
        await session.close()
        await engine.close()
        server.close()
        await server.wait_closed()
