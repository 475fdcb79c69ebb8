"""The socket's sends: the task that queues frames sends them itself, one sender at a
time. A sender cancelled while uvicorn waits for the transport must not lose the frame
it was sending: the next sender sends it, in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
from hotloop._core import ChatFormat, Prompt
from hotloop.engines.base import Sampling
from hotloop.protocol import CacheBudget, Connection, ConnectionCache
from hotloop.transport.asgi import Message
from hotloop.transport.websocket import Socket
from sdk_events import validate

FORMAT = ChatFormat.harmony()
LONG = FORMAT.completion_tokens(text="token " * 200)


class OneAtATime:
    """An engine session that yields one token per step."""

    async def generate(
        self, prompt: Prompt, sampling: Sampling, route_key: str | None = None
    ) -> AsyncIterator[list[int]]:
        for token in LONG:
            yield [token]

    async def close(self) -> None:
        """Nothing to release."""


async def test_cancel_while_the_generation_sends_loses_no_frame() -> None:
    connection = Connection(
        chat_format=FORMAT,
        context_window=1 << 20,
        model="sim",
        cache=ConnectionCache(1 << 30, CacheBudget(1 << 30)),
    )
    transport_ready = asyncio.Event()  # the transport takes delta frames once set
    delta_waiting = asyncio.Event()
    finished = asyncio.Event()
    sent: list[str] = []

    async def send(message: Message) -> None:
        text = message["text"]
        if '"response.output_text.delta"' in text and not transport_ready.is_set():
            delta_waiting.set()
            await transport_ready.wait()
        sent.append(text)
        if '"response.incomplete"' in text:
            finished.set()

    frames = [
        orjson.dumps({"type": "response.create", "model": "sim", "input": "go"}).decode(),
        orjson.dumps({"type": "response.cancel"}).decode(),
    ]

    async def receive() -> Message:
        if len(frames) == 2:
            return {"type": "websocket.receive", "text": frames.pop(0)}
        if frames:
            # The generation is the sender now, waiting inside `send` with a delta.
            await delta_waiting.wait()
            return {"type": "websocket.receive", "text": frames.pop(0)}
        transport_ready.set()
        await finished.wait()
        return {"type": "websocket.disconnect", "code": 1000}

    socket = Socket(connection, OneAtATime(), send, high_water=1 << 20, lifetime=3600)
    await socket.run(receive)

    events = [validate(frame) for frame in sent]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds.count("response.output_text.delta") == 1
    assert kinds.index("response.output_text.delta") < kinds.index("response.incomplete")
    assert kinds[-1] == "response.incomplete"
