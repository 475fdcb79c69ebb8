"""`--stream-coalesce-ms`: a WebSocket response's engine batches merged over a window
into fewer delta events, with the same text and event sequence; off by default."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest
from hotloop._core import ChatFormat, Prompt
from hotloop.bench.scripted import ScriptedClient
from hotloop.config import ServerConfig
from hotloop.engines.base import Sampling
from hotloop.protocol import CacheBudget, Connection, ConnectionCache
from hotloop.transport.asgi import Message
from hotloop.transport.websocket import Socket
from sdk_events import validate

FORMAT = ChatFormat.harmony()
ANSWER = FORMAT.completion_tokens(text="word " * 200)


class Buffering:
    """An engine session that samples one token per event-loop iteration into a buffer
    and hands over everything buffered when pulled, as the upstream connection does."""

    def __init__(self) -> None:
        self.pulls = 0

    async def generate(
        self, prompt: Prompt, sampling: Sampling, route_key: str | None = None
    ) -> AsyncIterator[list[int]]:
        buffered: list[int] = []
        more = asyncio.Event()

        async def sample() -> None:
            for token in ANSWER:
                buffered.append(token)
                more.set()
                await asyncio.sleep(0)

        sampler = asyncio.create_task(sample())
        try:
            handed = 0
            while handed < len(ANSWER):
                if not buffered:
                    more.clear()
                    await more.wait()
                batch, buffered[:] = list(buffered), []
                handed += len(batch)
                self.pulls += 1
                yield batch
        finally:
            sampler.cancel()

    async def close(self) -> None:
        """Nothing to release."""


async def stream_once(coalesce: float) -> tuple[list[dict[str, object]], Buffering]:
    session = Buffering()
    connection = Connection(
        chat_format=FORMAT,
        context_window=1 << 20,
        model="m",
        cache=ConnectionCache(1 << 30, CacheBudget(1 << 30)),
    )
    client = ScriptedClient(orjson.dumps({"type": "response.create", "input": "go"}).decode())
    sent: list[dict[str, object]] = []

    async def send(message: Message) -> None:
        sent.append(validate(message["text"]))
        if '"response.completed"' in message["text"]:
            client.finish()

    socket = Socket(connection, session, send, high_water=1 << 20, lifetime=60, coalesce=coalesce)
    await socket.run(client.receive)
    return sent, session


def deltas(events: list[dict[str, object]]) -> list[dict[str, object]]:
    return [e for e in events if e["type"] == "response.output_text.delta"]


async def test_batches_within_the_window_become_one_delta_event() -> None:
    plain, _ = await stream_once(0.0)
    merged, session = await stream_once(0.05)
    # The sampler produces the whole answer within a few windows: most of it is merged.
    assert len(deltas(merged)) < len(ANSWER) // 4
    assert session.pulls < len(ANSWER) // 4
    text = "".join(str(e["delta"]) for e in deltas(merged))
    assert text == "".join(str(e["delta"]) for e in deltas(plain))
    assert merged[-1]["type"] == plain[-1]["type"] == "response.completed"
    assert [e["sequence_number"] for e in merged] == list(range(len(merged)))


def test_coalescing_is_off_by_default_and_never_negative() -> None:
    assert ServerConfig().stream_coalesce_ms == 0
    assert ServerConfig.parse("stream_coalesce_ms", "2.5") == 2.5
    with pytest.raises(ValueError, match=">= 0"):
        ServerConfig.parse("stream_coalesce_ms", "-1")
