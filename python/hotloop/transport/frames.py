"""hotloop's uvicorn WebSocket protocol: uvicorn's websockets-sansio implementation
plus one ASGI extension, `hotloop.websocket.send_frames`, that writes a list of text
payloads (UTF-8 JSON events, as the `Connection` builds them) as text frames in one
transport write.

Why: while a model streams, the server sends one small frame per engine batch, and at
4,000 tokens/s that per-frame path is most of the server's CPU per token. Through the
standard `websocket.send` each frame is decoded to str, encoded back, wrapped in a
websockets `Frame`, serialised and written on its own; here it is a header and the
payload, and the frames that are ready together (the closing events of an item and the
response) go out in one write.

The extension is offered only when the connection negotiated no WebSocket extension
(permessage-deflate is off unless `--websocket-deflate`): a server's frame is then its
header and payload (RFC 6455 5.2, unmasked, no RSV bits). The handshake, reading,
pings and the close stay uvicorn's; an app that does not look for the extension (or a
server that is not hotloop's CLI) uses `websocket.send` as usual.

It also drains at shutdown (see `hotloop.shutdown`): uvicorn asks each connection to
shut down, and plain uvicorn closes a WebSocket with 1012 at once; this one first lets
the connection's in-flight responses finish (the app's `CONNECTION_DRAIN`, which also
ends the responses waiting for tool output; without it, the whole process's), up to
uvicorn's graceful-shutdown timeout. An idle connection closes at once: its client
reconnects (behind a load balancer, to another node) instead of sending its next
request to a server that would refuse it.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request
from websockets.protocol import State

from hotloop.protocol.parsing import PARSE_OFFLOAD_BYTES
from hotloop.shutdown import Drain, find_drain
from hotloop.transport.asgi import (
    CONNECTION_DRAIN,
    RECEIVE_UTF8,
    RECEIVED_NS,
    SEND_FRAMES,
    WRITE_FRAMES,
)

log = logging.getLogger("hotloop.websocket")

# How long a WebSocket waits for in-flight responses at shutdown when uvicorn was given
# no graceful-shutdown timeout (hotloop's CLI gives it `--drain-timeout`).
DRAIN_DEADLINE = 30.0

_SHORT = struct.Struct("!BB")
_MEDIUM = struct.Struct("!BBH")
_LONG = struct.Struct("!BBQ")
_TEXT_FIN = 0x81


def text_frame_header(length: int) -> bytes:
    """The header of an unmasked, final text frame with a payload of `length` bytes."""
    if length < 126:
        return _SHORT.pack(_TEXT_FIN, length)
    if length < 1 << 16:
        return _MEDIUM.pack(_TEXT_FIN, 126, length)
    return _LONG.pack(_TEXT_FIN, 127, length)


class FrameSendingProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol with the `send_frames` extension."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # websockets traces the handshake's headers (Authorization included) and every
        # frame's contents at DEBUG on uvicorn's logger: `--log-level debug` must not
        # write secrets or user content, so the wire trace is off whatever the level.
        self.conn.debug = False

    def send_receive_event_to_app(self) -> None:
        """uvicorn's, except for a text message that is not UTF-8: one line at DEBUG
        instead of a traceback at ERROR (any client can send one per connection, and
        a log flood is a denial of service of its own), then the 1007 close; and a large
        one goes to an app that asked for it (`RECEIVE_UTF8`) undecoded."""
        if self.curr_msg_data_type == "text" and not self.close_sent:
            data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
            self.frames = []
            if len(data) >= PARSE_OFFLOAD_BYTES and self.scope.get(RECEIVE_UTF8):
                # Decoding megabytes would hold the loop: the app decodes them off it.
                self._deliver({"type": "websocket.receive", RECEIVE_UTF8: data})
                return
            try:
                text = data.decode()
            except UnicodeDecodeError:
                log.debug("closing a WebSocket (1007): a text message is not valid UTF-8")
                self.conn.send_close(1007)
                self.handle_parser_exception()
                return
            self._deliver({"type": "websocket.receive", "text": text})
            return
        super().send_receive_event_to_app()

    def _deliver(self, message: dict[str, Any]) -> None:
        """Hand a message to the app, stamped (`RECEIVED_NS`), and stop reading until it
        takes it (uvicorn's flow control)."""
        message[RECEIVED_NS] = time.perf_counter_ns()
        # uvicorn types its queue with the spec's messages only; ours carries an extension.
        self.queue.put_nowait(cast("Any", message))
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        if self.response.status_code == 101 and not self.conn.extensions:
            self.scope["extensions"][SEND_FRAMES] = {WRITE_FRAMES: self.write_frames}

    def write_frames(self, payloads: list[bytes]) -> bool:
        """Write text frames now: True once written, False (nothing written) while the
        transport asks us to wait (uvicorn's flow control; `send` waits for it). Raises
        ClientDisconnected when the connection takes no more frames. A plain call, not
        a message to await: it is the per-token path, one frame per engine batch."""
        if not self.writable.is_set():
            return False
        if (
            self.disconnected
            or self.close_sent
            or self.conn.state is not State.OPEN
            or self.transport.is_closing()
        ):
            raise ClientDisconnected()
        if len(payloads) == 1:
            # One buffer: a write without the list of buffers writev takes.
            payload = payloads[0]
            self.transport.write(text_frame_header(len(payload)) + payload)
            return True
        parts: list[bytes] = []
        for payload in payloads:
            parts.append(text_frame_header(len(payload)))
            parts.append(payload)
        self.transport.writelines(parts)
        return True

    async def send(self, message: Any) -> None:
        if message["type"] != SEND_FRAMES or not self.handshake_complete:
            await super().send(message)  # before the accept, uvicorn refuses it
            return
        while not self.write_frames(message["frames"]):
            await self.writable.wait()

    def shutdown(self) -> None:
        drain = find_drain(self.app)
        # uvicorn types its scope without our key; the app put `Socket.drain` there.
        ends = cast("Callable[[], Awaitable[None]] | None", self.scope.get(CONNECTION_DRAIN))
        if (
            drain is None
            or not self.handshake_complete
            # A response waiting for tool output is not in flight, but must end first.
            or (ends is None and not drain.in_flight)
        ):
            super().shutdown()
            return
        task = self.loop.create_task(self._shutdown_drained(drain, ends))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _shutdown_drained(
        self, drain: Drain, ends: Callable[[], Awaitable[None]] | None
    ) -> None:
        deadline = self.config.timeout_graceful_shutdown or DRAIN_DEADLINE
        if ends is None:
            await drain.wait(deadline)
        else:
            # Refuse new responses process-wide (and answer /health with 503), but close
            # this socket as soon as its own responses are done.
            drain.draining = True
            try:
                await asyncio.wait_for(ends(), deadline)
            except asyncio.TimeoutError:
                pass  # the deadline: uvicorn closes what is left, as for the others
        if not self.transport.is_closing():
            super().shutdown()
