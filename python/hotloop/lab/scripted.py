"""A scripted WebSocket client for driving one `hotloop.transport.websocket.Socket` in
process, without a network: it hands the socket the given client frames, then waits
until told the exchange is over and disconnects. The in-process streaming measurement
(`benches/bench_ws_stream.py`) and the socket tests use it; it owns nothing else."""

from __future__ import annotations

import asyncio

from hotloop.transport.asgi import Message


class ScriptedClient:
    """`receive` for `Socket.run`: the frames in order, then a disconnect once
    `finish()` was called (typically from the test's `send` on a terminal event)."""

    def __init__(self, *frames: str) -> None:
        self._frames = list(frames)
        self._done = asyncio.Event()

    def finish(self) -> None:
        self._done.set()

    async def receive(self) -> Message:
        if self._frames:
            return {"type": "websocket.receive", "text": self._frames.pop(0)}
        await self._done.wait()
        return {"type": "websocket.disconnect", "code": 1000}
