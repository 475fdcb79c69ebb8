"""`--stream-coalesce-ms`: a WebSocket response's engine batches merged over a window
into fewer delta events, with the same text and event sequence; off by default."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from types import SimpleNamespace

import orjson
import pytest
from hotloop._core import ChatFormat, Prompt
from hotloop.config import ServerConfig
from hotloop.engines import base
from hotloop.engines.base import Sampling
from hotloop.lab.scripted import ScriptedClient
from hotloop.protocol import CacheBudget, Connection, ConnectionCache
from hotloop.transport.asgi import Message
from hotloop.transport.websocket import Socket
from sdk_events import validate

FORMAT = ChatFormat.harmony()
ANSWER = FORMAT.completion_tokens(text="word " * 200)


WINDOW = 0.05
PER_WINDOW = 16
"""Ids the engine samples while the coalescing waits out one window."""


class Buffering:
    """An engine session that buffers what it samples and hands over everything buffered
    when pulled, as the upstream connection does. Its sampling is driven by events, not
    the clock: one id before the first pull (the first token), then `PER_WINDOW` ids each
    time the coalescing waits out a window (`window_passed`). Without coalescing it
    samples one id per pull."""

    def __init__(self) -> None:
        self.pulls = 0
        self._sampled = 0
        self._buffered: list[int] = []

    def _sample(self, count: int) -> None:
        ids = ANSWER[self._sampled : self._sampled + count]
        self._sampled += len(ids)
        self._buffered += ids

    async def window_passed(self, seconds: float) -> None:
        """Stands for the coalescing's `asyncio.sleep(window)`."""
        assert seconds == WINDOW
        self._sample(PER_WINDOW)

    async def generate(
        self, prompt: Prompt, sampling: Sampling, route_key: str | None = None
    ) -> AsyncIterator[list[int]]:
        self._sample(1)
        while self._buffered:
            batch, self._buffered = self._buffered, []
            self.pulls += 1
            yield batch
            if not self._buffered:
                self._sample(1)  # nobody waited: the engine had one more id ready

    async def close(self) -> None:
        """Nothing to release."""


async def stream_once(
    coalesce: float, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[dict[str, object]], Buffering]:
    session = Buffering()
    # The coalescing's wait is the session's window: what it samples meanwhile is set
    # by the test, not by how busy the machine is.
    monkeypatch.setattr(base, "asyncio", SimpleNamespace(sleep=session.window_passed))
    connection = Connection(
        chat_format=FORMAT,
        context_window=1 << 20,
        model="m",
        cache=ConnectionCache(1 << 30, CacheBudget(1 << 30)),
    )
    client = ScriptedClient(
        orjson.dumps({"type": "response.create", "model": "sim", "input": "go"}).decode()
    )
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


async def test_batches_within_the_window_become_one_delta_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain, unmerged = await stream_once(0.0, monkeypatch)
    merged, session = await stream_once(WINDOW, monkeypatch)
    assert unmerged.pulls == len(ANSWER)
    # One pull per id up to the first delta's (`<|channel|>final<|message|>` and the
    # first word), which is not delayed; then one per window, holding what it sampled.
    other = FORMAT.completion_tokens(text="no")
    first_delta = next(i for i, (a, b) in enumerate(zip(ANSWER, other, strict=False)) if a != b) + 1
    assert session.pulls == first_delta + math.ceil((len(ANSWER) - first_delta) / PER_WINDOW)
    assert len(deltas(merged)) <= session.pulls < len(deltas(plain))
    text = "".join(str(e["delta"]) for e in deltas(merged))
    assert text == "".join(str(e["delta"]) for e in deltas(plain))
    assert merged[-1]["type"] == plain[-1]["type"] == "response.completed"
    assert [e["sequence_number"] for e in merged] == list(range(len(merged)))


def test_coalescing_is_off_by_default_and_never_negative() -> None:
    assert ServerConfig().stream_coalesce_ms == 0
    assert ServerConfig.parse("stream_coalesce_ms", "2.5") == 2.5
    with pytest.raises(ValueError, match=">= 0"):
        ServerConfig.parse("stream_coalesce_ms", "-1")
