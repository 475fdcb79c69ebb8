"""hotloop's uvicorn protocol (`hotloop.transport.frames`): the frames it writes itself
parse as RFC 6455 text frames at every length encoding, a real server streams through
it (with and without permessage-deflate negotiated), and the frames a generation has
ready together go out in one write."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
from hotloop._core import ChatFormat, Prompt
from hotloop.config import ServerConfig
from hotloop.engines.base import Sampling
from hotloop.lab.scripted import ScriptedClient
from hotloop.metrics import StreamCpu
from hotloop.protocol import CacheBudget, Connection, ConnectionCache
from hotloop.transport import App
from hotloop.transport.asgi import SEND_FRAMES, Message
from hotloop.transport.frames import text_frame_header
from hotloop.transport.websocket import Socket
from sdk_events import validate
from servers import Validating, hotloop_server, serving, sim_engine
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader
from websockets.sync.client import connect

FORMAT = ChatFormat.harmony()


@pytest.mark.parametrize("length", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_header_and_payload_parse_as_one_final_text_frame(length: int) -> None:
    payload = b"x" * length
    reader = StreamReader()
    reader.feed_data(text_frame_header(length) + payload + text_frame_header(2) + b"{}")
    reader.feed_eof()
    for expected in (payload, b"{}"):
        parser = Frame.parse(reader.read_exact, mask=False)
        try:
            next(parser)
        except StopIteration as parsed:
            frame = parsed.value
        assert (frame.opcode, frame.fin, frame.data) == (Opcode.TEXT, True, expected)
        assert not (frame.rsv1 or frame.rsv2 or frame.rsv3)
    assert reader.at_eof()


@pytest.mark.parametrize("deflate", [False, True])
def test_a_turn_with_frames_of_every_size_reaches_the_client(deflate: bool) -> None:
    # The instructions are echoed in the Response object: frames beyond 64 KiB.
    instructions = "Be brief. " * 7000
    with hotloop_server(websocket_deflate=deflate) as base:
        url = base.replace("http://", "ws://") + "/v1/responses"
        with connect(url, max_size=None, compression="deflate" if deflate else None) as ws:
            for _ in range(2):
                event = {
                    "type": "response.create",
                    "model": "sim",
                    "input": "go",
                    "instructions": instructions,
                }
                ws.send(orjson.dumps(event).decode())
                frames = []
                while (frame := validate(ws.recv()))["type"] != "response.completed":
                    frames.append(frame)
                assert frame["response"]["instructions"] == instructions
                assert frames[0]["type"] == "response.created"
                assert frames[0]["response"]["instructions"] == instructions
                numbers = [f["sequence_number"] for f in [*frames, frame]]
                assert numbers == list(range(len(numbers)))


class InBatches:
    """An engine session that hands over `text`'s ids `size` at a time."""

    def __init__(self, text: str, size: int) -> None:
        self.ids = FORMAT.completion_tokens(text=text)
        self.size = size

    async def generate(
        self, prompt: Prompt, sampling: Sampling, route_key: str | None = None
    ) -> AsyncIterator[list[int]]:
        for at in range(0, len(self.ids), self.size):
            yield self.ids[at : at + self.size]

    async def close(self) -> None:
        """Nothing to release."""


async def one_turn(
    session: InBatches,
    stream_cpu: StreamCpu | None = None,
    writer: Writer | None = None,
) -> list[list[bytes]]:
    """Run one `response.create` through a Socket with the extension on; return what
    each send carried, in order (with a `writer`: the server's plain writer, given to
    the Socket too, and what it wrote in the same list)."""
    connection = Connection(
        chat_format=FORMAT,
        context_window=1 << 20,
        model="sim",
        cache=ConnectionCache(1 << 30, CacheBudget(1 << 30)),
    )
    sends: list[list[bytes]] = []
    client = ScriptedClient(
        orjson.dumps({"type": "response.create", "model": "sim", "input": "go"}).decode()
    )

    def went_out(frames: list[bytes]) -> None:
        sends.append(list(frames))
        if any(b'"response.completed"' in frame for frame in frames):
            client.finish()

    async def send(message: Message) -> None:
        assert message["type"] == SEND_FRAMES
        if writer is not None:
            writer.sent += 1
        went_out(message["frames"])

    def write(frames: list[bytes]) -> bool:
        assert writer is not None
        written = writer(frames)
        if written:
            went_out(frames)
        return written

    socket = Socket(
        connection,
        session,
        send,
        high_water=1 << 20,
        lifetime=3600,
        send_frames=True,
        write_frames=None if writer is None else write,
        stream_cpu=stream_cpu,
    )
    await socket.run(client.receive)
    return sends


class Writer:
    """The server's plain frame writer as a test sees it: every `busy`th call refused
    (the transport's flow control asking the app to wait), the calls and the sends
    counted."""

    def __init__(self, busy: int = 0) -> None:
        self.busy = busy
        self.calls = 0
        self.refused = 0
        self.sent = 0

    def __call__(self, frames: list[bytes]) -> bool:
        self.calls += 1
        if self.busy and self.calls % self.busy == 0:
            self.refused += 1
            return False
        return True


async def test_frames_ready_together_go_out_in_one_send() -> None:
    sends = await one_turn(InBatches("All of it at once.", 1 << 20))
    events = [validate(frame.decode()) for frames in sends for frame in frames]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"
    # created + in_progress; the batch: item and part added, its delta, and (the stop
    # token closes the message) text, part and item done; then the terminal event.
    assert [len(frames) for frames in sends] == [2, 6, 1]


async def test_every_eighth_batch_adds_its_cpu_and_tokens() -> None:
    session = InBatches("word " * 100, 3)
    stream_cpu = StreamCpu()
    await one_turn(session, stream_cpu)
    batches = -(-len(session.ids) // 3)
    # Every batch is 3 ids but the last; the loop ends at the stop token's batch.
    assert stream_cpu.tokens == 3 * (batches // StreamCpu.EVERY)
    assert stream_cpu.cpu_seconds > 0 and stream_cpu.between_seconds >= 0


async def test_a_client_that_keeps_up_gets_every_frame_from_the_plain_writer() -> None:
    writer = Writer()
    out = await one_turn(InBatches("word " * 40, 1), writer=writer)
    assert writer.sent == 0 and len(out) == writer.calls
    events = [validate(frame.decode()) for frames in out for frame in frames]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"


async def test_frames_the_writer_refuses_go_out_through_send_in_order() -> None:
    writer = Writer(busy=3)
    out = await one_turn(InBatches("word " * 40, 1), writer=writer)
    # Each refused batch went out once, through the send (which waits for the
    # transport): none lost, none twice, the order kept.
    assert writer.refused > 0 and writer.sent == writer.refused
    assert len(out) == writer.calls
    events = [validate(frame.decode()) for frames in out for frame in frames]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"


def test_the_tests_check_every_frame_the_plain_writer_sends() -> None:
    # Most frames leave through the writer, not a message: the SDK check must see them.
    checked = Validating(App(sim_engine(), ServerConfig(engine="sim")))
    with serving(checked, ws_per_message_deflate=False) as base:
        url = base.replace("http://", "ws://") + "/v1/responses"
        with connect(url) as ws:
            request = {"type": "response.create", "model": "sim", "input": "go"}
            ws.send(orjson.dumps(request).decode())
            received = 1
            while orjson.loads(ws.recv())["type"] != "response.completed":
                received += 1
    assert checked.frames == received > 3
    assert checked.invalid == []
