"""A client that does not read: generation pauses at the outbox's high-water mark, so
server memory stays bounded, and resumes, in order, once the client reads again.
Also: a client that disconnects mid-response cancels its generation."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import orjson
from hotloop._core import ChatFormat, Prompt
from hotloop.bench.scripted import ScriptedClient
from hotloop.config import ServerConfig
from hotloop.engines.base import Sampling
from hotloop.engines.sim import SimScript, SimSpeed
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
    client = ScriptedClient(orjson.dumps({"type": "response.create", "input": "go"}).decode())

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

    def session(self) -> Watched.Session:
        return Watched.Session(self)

    class Session:
        def __init__(self, owner: Watched) -> None:
            self.owner = owner
            self.inner = owner.inner.session()

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


def test_disconnect_mid_stream_cancels_generation() -> None:
    from websockets.sync.client import connect

    engine = Watched(SimSpeed(tokens_per_second=200.0, ttft=0.0, prefill_tokens_per_second=1e9))
    app = App(engine, ServerConfig(engine="sim"))  # type: ignore[arg-type]
    with serving(app) as base:
        ws = connect(base.replace("http://", "ws://") + "/v1/responses")
        ws.send(orjson.dumps({"type": "response.create", "input": "long"}).decode())
        while validate(ws.recv())["type"] != "response.output_text.delta":
            pass
        ws.close()
        assert engine.closed.wait(timeout=60)
        assert engine.tokens < 2000
