"""Large renders run off the event loop: the connection hands them out as `Render`
work, the transport runs them in a worker thread (the core releases the GIL), and
meanwhile other lanes, other connections and new handshakes go on. Order within a
lane holds; a cancel or a disconnect during a render behaves as it would without it.

Ordering is proven with events (a render held in its worker thread by a gate), never
with timings."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx
import orjson
import pytest
from connection_driver import FORMAT, ConnectionDriver
from hotloop._core import Conversation, CreateRequest, parse_request
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimEngine, SimSpeed
from hotloop.protocol import (
    CacheBudget,
    Close,
    Connection,
    ConnectionCache,
)
from hotloop.protocol.actions import RESENT_PARSE_OFFLOAD_BYTES
from hotloop.protocol.parsing import OFFLOAD_BYTES, PARSE_OFFLOAD_BYTES
from hotloop.transport import App
from sdk_events import validate
from servers import FAST, hotloop_server, serving
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

# An agent resuming a task: its first request carries a long tool output.
HISTORY = "line of a long tool output, as read from a file\n" * (OFFLOAD_BYTES // 32)
T = TypeVar("T")


class Driver(ConnectionDriver):
    """Plays the client, the engine and the transport against one Connection; renders
    run only when the test says so."""

    def __init__(self, context_window: int = 1 << 20) -> None:
        self.cache = ConnectionCache(1 << 30, CacheBudget(1 << 30))
        super().__init__(
            Connection(
                chat_format=FORMAT, context_window=context_window, model="sim", cache=self.cache
            )
        )


def kinds(frames: list[dict[str, Any]]) -> list[str]:
    return [f["type"] for f in frames]


STARTED = ["response.created", "response.in_progress"]


def test_small_input_renders_inline_large_input_is_handed_out() -> None:
    driver = Driver()
    assert kinds(driver.create("a short tool output")) == STARTED
    assert driver.renders == {}
    assert driver.create(HISTORY, stream_id="big") == []
    (work,) = driver.renders.values()
    assert work.request.input_bytes >= OFFLOAD_BYTES
    assert driver.conn.busy and driver.conn.in_flight == 2
    assert kinds(driver.render()) == STARTED
    (_, big) = driver.generating.values()
    assert len(big.prompt) > OFFLOAD_BYTES // 8


def test_other_lanes_go_on_while_a_lane_renders() -> None:
    driver = Driver()
    driver.create(HISTORY, stream_id="big")
    assert len(driver.renders) == 1
    # A whole turn on another lane, start to terminal, while the render is out.
    assert kinds(driver.create("quick", stream_id="small")) == STARTED
    done = driver.finish()
    assert done[-1]["type"] == "response.completed" and done[-1]["stream_id"] == "small"
    assert len(driver.renders) == 1
    started = driver.render()
    assert kinds(started) == STARTED and started[0]["stream_id"] == "big"
    assert driver.finish()[-1]["type"] == "response.completed"


def test_order_within_a_lane_holds_across_a_render() -> None:
    driver = Driver()
    driver.create(HISTORY)
    # Queued behind the render, though it would render inline at once.
    assert driver.create("next") == []
    assert driver.generating == {}
    first = driver.render()
    assert kinds(first) == STARTED
    assert len(driver.generating) == 1
    second = driver.finish()
    assert kinds(second)[-3:] == ["response.completed", *STARTED]
    assert second[-1]["response"]["id"] != first[0]["response"]["id"]
    # Each response numbers its own events: the first's all come before the second's.
    seqs = [f["sequence_number"] for f in first + second[:-2]]
    assert seqs == list(range(len(seqs)))


def test_a_queued_large_input_renders_after_the_lane_frees() -> None:
    driver = Driver()
    assert kinds(driver.create("first")) == STARTED
    assert driver.create(HISTORY) == []
    assert driver.renders == {}  # not before the lane's first response is done
    assert driver.finish()[-1]["type"] == "response.completed"
    (work,) = driver.renders.values()
    # It waited as its frame alone, and is parsed again with its render, in the worker
    # thread: a large frame is never parsed on the event loop, the first time or now.
    assert not isinstance(work.request, CreateRequest)
    assert kinds(driver.render()) == STARTED
    (big,) = driver.generating.values()
    assert len(big.prompt) > OFFLOAD_BYTES // 8


def test_cancel_during_a_render_cancels_the_response_once_started() -> None:
    driver = Driver()
    driver.create(HISTORY, stream_id="a")
    driver.conn.receive_text(orjson.dumps({"type": "response.cancel", "stream_id": "a"}))
    assert driver.pump() == []
    frames = driver.render()
    # The same frames as a cancel right after an inline render's `in_progress`.
    assert kinds(frames) == [*STARTED, "response.incomplete"]
    assert frames[-1]["response"]["status"] == "cancelled"
    assert driver.generating == {} and len(driver.cancelled) == 1
    assert not driver.conn.busy
    assert kinds(driver.create("again", stream_id="a")) == STARTED


def test_disconnect_during_a_render_drops_its_result() -> None:
    driver = Driver()
    driver.create(HISTORY)
    driver.create("queued behind it")
    driver.conn.connection_lost()
    assert driver.pump() == []
    assert driver.render() == []
    assert driver.generating == {} and not driver.conn.busy


def test_a_failed_render_is_refused_and_the_lane_goes_on() -> None:
    driver = Driver(context_window=2000)
    driver.create(HISTORY)
    assert driver.create("short") == []
    frames = driver.render()
    assert kinds(frames) == ["error", *STARTED]
    assert frames[0]["error"]["code"] == "context_length_exceeded"


def test_lifetime_waits_for_a_render() -> None:
    driver = Driver()
    driver.create(HISTORY)
    driver.conn.lifetime_reached()
    assert driver.pump() == [] and driver.closed is None
    assert kinds(driver.render()) == STARTED
    frames = driver.finish()
    assert kinds(frames)[-2:] == ["response.completed", "error"]
    assert driver.closed == Close(1000, "connection lifetime reached")


# ---------------------------------------------------------------- the core, across threads


def large_request() -> CreateRequest:
    body = {"model": "sim", "input": HISTORY * 64}
    return parse_request(orjson.dumps(body))


def run_beside(work: Callable[[], T], probe: Callable[[], object]) -> tuple[T, list[object]]:
    """Run `work` in a thread and call `probe` on this one until it is done; returns the
    work's result and what every probe returned or raised."""
    results: list[T] = []
    thread = threading.Thread(target=lambda: results.append(work()))
    seen: list[object] = []
    thread.start()
    while thread.is_alive():
        try:
            seen.append(probe())
        except RuntimeError as e:
            seen.append(e)
    thread.join()
    return results[0], seen


# Whether this thread's probe runs while the render does is up to the OS scheduler: a
# render that releases the GIL is caught within a few attempts, one that holds it never
# is. The attempts are counted, not timed.
ATTEMPTS = 20


def refused_beside(
    work: Callable[[Conversation], T], probe: Callable[[Conversation], object]
) -> tuple[T, list[RuntimeError]]:
    """`run_beside` on a fresh conversation until a probe ran during the work (it was
    refused), at most ATTEMPTS times; the last work's result and the refusals seen."""
    for _ in range(ATTEMPTS):
        conversation = Conversation(FORMAT, context_window=1 << 22)
        result, seen = run_beside(partial(work, conversation), partial(probe, conversation))
        refused = [e for e in seen if isinstance(e, RuntimeError)]
        if refused:
            break
    return result, refused


def test_extend_releases_the_gil_and_a_second_user_gets_a_clean_error() -> None:
    request = large_request()
    turn, refused = refused_beside(
        lambda conversation: (conversation.extend(request), conversation.token_count),
        lambda conversation: conversation.token_count,
    )
    # This thread ran Python while the render was in progress: the GIL was released,
    # and pyo3's borrow flag refused the concurrent read.
    assert refused, "the render held the GIL: nothing else ran meanwhile"
    assert all("borrowed" in str(e) for e in refused)
    rendered, token_count = turn
    assert token_count == rendered.prompt_tokens > 100_000


def test_a_concurrent_extend_on_the_same_conversation_is_refused() -> None:
    request = large_request()
    small = parse_request(orjson.dumps({"model": "sim", "input": "hi"}))
    _, refused = refused_beside(
        lambda conversation: conversation.extend(request),
        lambda conversation: conversation.extend(small),
    )
    assert refused and all("borrowed" in str(e) for e in refused)


# ---------------------------------------------------------------- over real sockets


def recv_until(ws: ClientConnection, kind: str) -> list[dict[str, Any]]:
    frames = []
    while True:
        frames.append(validate(ws.recv()))
        if frames[-1]["type"] in (kind, "error"):
            return frames


def test_a_long_render_does_not_block_other_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    started = threading.Event()
    gate = threading.Event()
    to_thread = asyncio.to_thread

    async def gated(work: Callable[..., T], *args: Any) -> T:
        def held() -> T:
            started.set()
            gate.wait()
            return work(*args)

        return await to_thread(held)

    # The render is held in its worker thread until the other connections are done.
    monkeypatch.setattr(asyncio, "to_thread", gated)
    speed = SimSpeed(tokens_per_second=1e6, ttft=0.0, prefill_tokens_per_second=1e9)
    with hotloop_server(speed=speed) as base:
        url = base.replace("http://", "ws://") + "/v1/responses"
        with connect(url) as big, connect(url) as small:
            big.send(
                orjson.dumps({"type": "response.create", "model": "sim", "input": HISTORY}).decode()
            )
            assert started.wait(timeout=60)
            small.send(
                orjson.dumps({"type": "response.create", "model": "sim", "input": "quick"}).decode()
            )
            assert recv_until(small, "response.completed")[-1]["type"] == "response.completed"
            # A new handshake and a whole turn on it, still during the render.
            with connect(url) as late:
                late.send(
                    orjson.dumps(
                        {"type": "response.create", "model": "sim", "input": "hi"}
                    ).decode()
                )
                assert recv_until(late, "response.completed")[-1]["type"] == "response.completed"
            assert not gate.is_set()
            gate.set()
            frames = recv_until(big, "response.completed")
        assert kinds(frames)[:2] == STARTED and frames[-1]["type"] == "response.completed"
        assert [f["sequence_number"] for f in frames] == list(range(len(frames)))


def test_http_renders_a_full_history_off_the_loop_and_refuses_a_failed_one(
    tmp_path: Path,
) -> None:
    body = {"model": "sim", "input": [{"role": "user", "content": HISTORY}]}
    config = ServerConfig(engine="sim", data_dir=str(tmp_path))
    for context_window in (1 << 20, 4096):
        engine = SimEngine(FORMAT, model="sim", speed=FAST, context_window=context_window)
        with serving(App.from_config(config, engine)) as base:
            reply = httpx.post(base + "/v1/responses", json=body, timeout=60)
            short = httpx.post(base + "/v1/responses", json={"model": "sim", "input": "hi"})
        assert short.status_code == 200
        if context_window == 4096:
            assert reply.status_code == 400
            assert reply.json()["error"]["code"] == "context_length_exceeded"
        else:
            assert reply.status_code == 200 and reply.json()["status"] == "completed"
            assert reply.json()["usage"]["input_tokens"] > OFFLOAD_BYTES // 8


# ---------------------------------------------------------------- any large field, not only input


def wide_tool(properties: int) -> dict[str, Any]:
    """A function tool with `properties` string properties, all required (about 60
    bytes each): an MCP server's tool list in one schema."""
    props = {
        f"field_{i}": {"type": "string", "description": f"value {i}"} for i in range(properties)
    }
    return {
        "type": "function",
        "name": "wide",
        "parameters": {"type": "object", "properties": props, "required": list(props)},
    }


BIG_TOOLS = [wide_tool(OFFLOAD_BYTES // 40)]
"""A frame of 32-64 KB: parsed on the event loop, rendered off it."""
HUGE_TOOLS = [wide_tool(PARSE_OFFLOAD_BYTES // 40)]
"""A frame of 64 KB or more: parsed and rendered off the event loop."""


def test_a_large_tool_list_is_rendered_off_the_loop_whatever_the_input_size() -> None:
    driver = Driver()
    assert driver.create("hi", tools=BIG_TOOLS) == []
    (work,) = driver.renders.values()
    assert work.request.input_bytes < 10 <= OFFLOAD_BYTES <= work.request.frame_bytes
    assert kinds(driver.render()) == STARTED
    # Large instructions too: the frame's size decides, not one field's.
    assert driver.create("hi", instructions=HISTORY, stream_id="i") == []
    assert len(driver.renders) == 1


def running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def test_large_frames_are_parsed_off_the_event_loop_thread(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The parse of a large frame (a tool list here) runs where no event loop runs: a
    worker thread, over WebSocket and HTTP; a small frame's runs on the loop, and so
    does a body under 1 MiB whose key resends histories (most of it hashed, not
    parsed: `RESENT_PARSE_OFFLOAD_BYTES`)."""
    import hotloop.protocol.parsing as parsing_module
    import hotloop.transport.http as http_module

    parsed_on_loop: list[tuple[int, bool]] = []

    def spying(parse: Callable[..., T]) -> Callable[..., T]:
        def spy(frame: str | bytes, *args: Any) -> T:
            parsed_on_loop.append((len(frame), running_loop()))
            return parse(frame, *args)

        return spy

    monkeypatch.setattr(parsing_module, "parse_event", spying(parsing_module.parse_event))
    monkeypatch.setattr(http_module, "parse_request", spying(http_module.parse_request))
    engine = SimEngine(FORMAT, model="sim", speed=FAST)
    with serving(
        App.from_config(ServerConfig(engine="sim", data_dir=str(tmp_path)), engine)
    ) as base:
        with connect(base.replace("http://", "ws://") + "/v1/responses") as ws:
            for fields in (
                {"model": "sim", "input": "hi"},
                {"model": "sim", "input": "hi", "tools": HUGE_TOOLS},
            ):
                ws.send(orjson.dumps({"type": "response.create", **fields}).decode())
                assert recv_until(ws, "response.completed")[-1]["type"] == "response.completed"
        history = [{"role": "user", "content": "hi"}]
        body = {"model": "sim", "input": history, "tools": HUGE_TOOLS}
        reply = httpx.post(base + "/v1/responses", json=body, timeout=60)
        assert reply.status_code == 200
        # The key has sent a history: its next whole-history body is parsed on the loop.
        body["input"] = [*history, *reply.json()["output"], {"role": "user", "content": "?"}]
        assert httpx.post(base + "/v1/responses", json=body, timeout=60).status_code == 200
    (small, on_loop), *large, (resent, resent_on_loop) = parsed_on_loop
    assert small < OFFLOAD_BYTES and on_loop
    off_loop = [(size >= PARSE_OFFLOAD_BYTES, on_loop) for size, on_loop in large]
    assert off_loop == [(True, False)] * 2
    assert PARSE_OFFLOAD_BYTES <= resent < RESENT_PARSE_OFFLOAD_BYTES and resent_on_loop


def test_a_large_text_message_is_decoded_off_the_event_loop_thread(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """hotloop's server hands a large text message to the app undecoded
    (`RECEIVE_UTF8`): the UTF-8 decode of megabytes runs with the parse in a worker
    thread, and a payload that is not UTF-8 still closes the socket with 1007."""
    from hotloop.transport.websocket import Socket

    decoded_on_loop: list[tuple[int, bool]] = []
    decode_and_parse = Socket._decode_and_parse

    def spy(self: Socket, payload: bytes) -> Any:
        decoded_on_loop.append((len(payload), running_loop()))
        return decode_and_parse(self, payload)

    monkeypatch.setattr(Socket, "_decode_and_parse", spy)
    engine = SimEngine(FORMAT, model="sim", speed=FAST)
    with serving(
        App.from_config(ServerConfig(engine="sim", data_dir=str(tmp_path)), engine)
    ) as base:
        url = base.replace("http://", "ws://") + "/v1/responses"
        with connect(url) as ws:
            for fields in (
                {"model": "sim", "input": "hi"},
                {"model": "sim", "input": "hi", "tools": HUGE_TOOLS},
            ):
                ws.send(orjson.dumps({"type": "response.create", **fields}).decode())
                assert recv_until(ws, "response.completed")[-1]["type"] == "response.completed"
        with connect(url) as ws:
            ws.send(b"\xff" * PARSE_OFFLOAD_BYTES, text=True)
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(60)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
    assert [(size >= PARSE_OFFLOAD_BYTES, on_loop) for size, on_loop in decoded_on_loop] == [
        (True, False)
    ] * 2


def test_a_queued_large_frame_is_parsed_again_off_the_event_loop_thread(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A large frame that waits behind its lane's running response keeps only its text
    and is parsed again when its turn comes: that parse too runs in a worker thread."""
    import hotloop.protocol.parsing as parsing_module

    parsed_on_loop: list[tuple[int, bool]] = []
    parse = parsing_module.parse_event

    def spy(frame: str | bytes, *args: Any) -> Any:
        parsed_on_loop.append((len(frame), running_loop()))
        return parse(frame, *args)

    monkeypatch.setattr(parsing_module, "parse_event", spy)
    # A slow first response: the large frame arrives while it runs, and waits.
    engine = SimEngine(FORMAT, model="sim", speed=SimSpeed(tokens_per_second=50.0, ttft=0.0))
    with serving(
        App.from_config(ServerConfig(engine="sim", data_dir=str(tmp_path)), engine)
    ) as base:
        with connect(base.replace("http://", "ws://") + "/v1/responses") as ws:
            ws.send(
                orjson.dumps({"type": "response.create", "model": "sim", "input": "hi"}).decode()
            )
            recv_until(ws, "response.created")
            big = {"type": "response.create", "model": "sim", "input": "hi", "tools": HUGE_TOOLS}
            ws.send(orjson.dumps(big).decode())
            for _ in range(2):
                assert recv_until(ws, "response.completed")[-1]["type"] == "response.completed"
    large = [on_loop for size, on_loop in parsed_on_loop if size >= PARSE_OFFLOAD_BYTES]
    assert large == [False, False]  # on arrival, and again when its turn came


def test_a_frame_of_32_to_64_kb_takes_one_thread_hop(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A frame between `OFFLOAD_BYTES` and `PARSE_OFFLOAD_BYTES` is parsed on the event
    loop and only its render runs in a worker thread: one hop before the engine call,
    not a parse's hop and then a render's."""
    hops: list[str] = []
    to_thread = asyncio.to_thread

    async def spy(func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        hops.append(getattr(func, "__name__", ""))
        return await to_thread(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", spy)
    frame = orjson.dumps(
        {"type": "response.create", "model": "sim", "input": "hi", "tools": BIG_TOOLS}
    ).decode()
    assert OFFLOAD_BYTES <= len(frame) < PARSE_OFFLOAD_BYTES
    engine = SimEngine(FORMAT, model="sim", speed=FAST)
    with serving(
        App.from_config(ServerConfig(engine="sim", data_dir=str(tmp_path)), engine)
    ) as base:
        with connect(base.replace("http://", "ws://") + "/v1/responses") as ws:
            ws.send(frame)
            assert recv_until(ws, "response.completed")[-1]["type"] == "response.completed"
    assert [hop for hop in hops if hop in ("parse", "_decode_and_parse", "run")] == ["run"]


def test_a_tool_list_above_its_byte_limit_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    too_many = [wide_tool(2 * 1024 * 1024 // 40)]
    driver = Driver()
    (error,) = driver.create("hi", tools=too_many)
    assert (error["error"]["code"], error["error"]["param"]) == ("array_above_max_bytes", "tools")
    assert driver.renders == {} and driver.generating == {}
    engine = SimEngine(FORMAT, model="sim", speed=FAST)
    with serving(
        App.from_config(ServerConfig(engine="sim", data_dir=str(tmp_path)), engine)
    ) as base:
        body = {"model": "sim", "input": "hi", "tools": too_many}
        reply = httpx.post(base + "/v1/responses", json=body, timeout=60)
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "array_above_max_bytes"
