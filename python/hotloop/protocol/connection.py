"""The per-connection protocol state machine of WebSocket mode (sans-I/O).

`Connection` is fed client frames (`receive_text`, `receive_bytes`, or `parse` then
`receive_parsed` when the transport parses a large frame off the event loop), engine results
(`engine_output`, `engine_done`, `engine_failed`) and time (`lifetime_reached`), and
answers with `actions()`: server frames (bytes) to send in order, `Generate` /
`Cancel` work for the engine, and at most one `Close`. It performs no I/O and never
awaits: the transport pumps frames in and out, and runs the engine work it is handed.

It owns what is per connection: frame dispatch, the running responses by key, the
lifetime and closing, and the connection cache of checkpoints. A request before its
turn starts is the `RequestQueue`'s (`request_queue.py`: admission and refusals, lanes,
the byte bounds, the in-flight cap, cancel); a turn from its lane to its engine call is
the `TurnStart`'s (`turn_start.py`: its chain, its render, off the event loop for a
large request). Each running response is a unit of its own
(`response.py`) that the connection hands engine results to by key; steering
(`steering.py`), the long-running response (`injection.py`), interrupt
(`interrupt.py`), compaction (`summarization.py`) and the MCP loop (`mcp_loop.py`) own
their state and transitions, and reach the connection only through its port
(`port.Port` and the ports beside each unit: `emit`, `hold`, `dequeued`, `new_key`,
`refuse`, `release`, `running`, ...), which this class implements. None of them imports
this module: the connection hands a response to the unit whose state its model turn
ended in (`State`).

A turn: parse the frame -> look up `previous_response_id` (connection cache, then the
`Observer`'s fallback) -> fork the checkpoint (before `response.in_progress`, so a
fork never loses its parent) or start a new conversation -> `extend` with only the
new items (a large request is handed out as `Render` work, so the transport runs it off
the event loop; the lane waits for it, other lanes and connections go on) -> prompt ->
`Generate` -> parser events -> `commit_output` and a checkpoint under the new response
id -> with `store=true` on a durable server, `Persist` (the lane holds until the store
committed the response: `persist_done` sends the terminal event, `persist_failed` turns
it into `response.failed` with code `store_unavailable`) -> terminal.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from hotloop._core import (
    AppendEvent,
    CancelEvent,
    ChatFormat,
    Conversation,
    CoreError,
    CreateRequest,
    Limits,
    Policy,
    ProcessedEvent,
    Turn,
    UnknownEvent,
)
from hotloop.engines.base import API_SAMPLING, EngineError
from hotloop.mcp_client import McpError
from hotloop.protocol.actions import Action, Cancel, Close, Finished, Observer
from hotloop.protocol.chains import Chains
from hotloop.protocol.compaction import Compactor
from hotloop.protocol.connection_cache import ConnectionCache, ConversationStart
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.history import History
from hotloop.protocol.injection import LongRunning
from hotloop.protocol.interrupt import interrupt
from hotloop.protocol.lanes import Lane
from hotloop.protocol.mcp_loop import McpLoop
from hotloop.protocol.mcp_tools import McpTurn
from hotloop.protocol.parsing import INJECTS, PASSED_THROUGH, FrameParser, Parsed
from hotloop.protocol.port import Settings
from hotloop.protocol.queue_memory import QueueMemory
from hotloop.protocol.request_queue import RequestQueue, echoed
from hotloop.protocol.response import Ending, Response
from hotloop.protocol.state import State
from hotloop.protocol.steering import Steering
from hotloop.protocol.summarization import Summarization
from hotloop.protocol.turn_start import TurnStart


@dataclass(frozen=True)
class ConnectionLimits:
    """Per-connection bounds; each breach is a clear `error` event, never a drop."""

    max_frame_bytes: int = 16 * 1024 * 1024
    max_queued_bytes: int = 64 * 1024 * 1024
    request: Limits | None = None


class Connection:
    """One WebSocket connection's protocol state (see the module docstring)."""

    def __init__(
        self,
        *,
        chat_format: ChatFormat,
        context_window: int,
        model: str,
        cache: ConnectionCache,
        limits: ConnectionLimits | None = None,
        policy: Policy | None = None,
        observer: Observer | None = None,
        principal: str | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
        session_key: str | None = None,
        queue_memory: QueueMemory | None = None,
        durable: bool = False,
        storage_refusal: Callable[[str | None], str | None] | None = None,
        request_id: str | None = None,
        compactor: Compactor | None = None,
        sampling_defaults: tuple[float, float] = API_SAMPLING,
        inject: bool = False,
        inject_idle_timeout: float = 300.0,
        background: bool = False,
        model_required: bool = False,
        history: ConnectionCache | None = None,
    ) -> None:
        """`session_key`: the client's session header (`session_id`, `x-session-id`),
        which routes every turn of the connection as one conversation. `queue_memory`:
        the process-wide bound on queued request bytes that this connection's queue
        counts in (unbounded beyond its own limit without one). `durable`: the server
        has a store; `store=true` responses are committed (`Persist`) before their
        terminal event; `storage_refusal(principal)` says why a key may store no more
        (`Ledger.storage_refusal`), and its `store=true` requests are then refused with
        429 `insufficient_quota`. `request_id`: the HTTP request's id (its `x-request-id`) for the
        response it makes; without one (WebSocket mode) each response gets its own,
        carried on its `response.created` and terminal events. `compactor`: the server's
        compaction key (one of this connection's own otherwise). `sampling_defaults`: the
        engine's `temperature` and `top_p` for requests that set none, which their
        Responses echo. `inject`: the long-running response (protocol.md section 8): a
        response that calls a client tool waits, open, for `response.inject`, and ends
        `response.incomplete` after `inject_idle_timeout` seconds without it.
        `background`: `background: true` requests are served (an HTTP background
        response's own connection); refused otherwise, as over WebSocket.
        `model_required`: a request without `model` is refused (the server has no
        `--default-model`); otherwise it is served as, and echoes, `model`. `history`:
        the process-wide cache of the caller's key, where states are kept under the
        content address of their history (`history.py`; `cache` itself over HTTP): a
        request that resends its whole history continues from the longest one; None:
        nothing is content-addressed."""
        self.cache = cache
        self.history = None if history is None else History(history)
        self.limits = limits or ConnectionLimits()
        self.request_limits = self.limits.request
        self.settings = Settings(
            chat_format=chat_format,
            context_window=context_window,
            model=model,
            policy=policy,
            principal=principal,
            session_key=session_key,
            request_id=request_id,
            sampling_defaults=sampling_defaults,
            durable=durable,
            storage_refusal=storage_refusal,
            inject=inject,
            stop_tokens=tuple(chat_format.stop_tokens),
            model_required=model_required,
        )
        self.clock = clock
        self._compactor = compactor or Compactor.ephemeral()
        self._parser = FrameParser(
            self._compactor, self.limits.max_frame_bytes, self.limits.request, clock
        )
        self._observer = observer
        self.outbox: list[Action] = []
        """Actions since the last `actions()` call, in order."""
        self.emit = self.outbox.append
        self.generating: dict[int, Response] = {}
        """Responses the engine samples (or whose MCP calls run), by the key of their work."""
        self.waiting: dict[int, Response] = {}
        """Responses waiting, open, for tool output, by the key of their last model turn."""
        self.ending: dict[int, Ending] = {}
        """Responses whose terminal event waits for their `Persist` work."""
        self.chains = Chains(cache, self.settings)
        # The units reach the connection through a weak port (`port.py`): with a strong
        # one, every connection would be a reference cycle that only the garbage
        # collector frees (one per HTTP request).
        port: Connection = weakref.proxy(self)
        self.steering = Steering(port)
        self.long_running = LongRunning(port, self.steering, inject_idle_timeout)
        self.summarization = Summarization(port, self.chains, self._compactor)
        self.mcp = McpLoop(port, self.long_running)
        self.turns = TurnStart(port, self.chains, self.mcp, self.summarization)
        self.start = self.turns.start
        self.queue = RequestQueue(
            port, self.steering, self.limits.max_queued_bytes, queue_memory, background
        )
        self.hold = self.queue.hold
        self.dequeued = self.queue.dequeued
        self.refuse_turn = self.queue.refuse_turn
        self._next_key = 0
        self._draining = False
        self.closed = False

    # ---------------------------------------------------------------- inputs

    def receive_text(self, frame: str | bytes) -> None:
        """One text frame from the client, parsed here (see `parse` for large ones)."""
        if not self.closed:
            self.receive_parsed(self.parse(frame))

    def parse(self, frame: str | bytes) -> Parsed:
        """Parse one text frame. It reads no state that changes, so the transport may
        run it in a worker thread (the core releases the GIL for a large frame) and
        hand the result to `receive_parsed`, frames in arrival order."""
        return self._parser.parse(frame)

    def receive_parsed(self, parsed: Parsed) -> None:
        """One text frame from the client, parsed by `parse`."""
        if self.closed:
            return
        event = parsed.event
        if isinstance(event, ProtocolError):
            self.refuse(event)
        elif isinstance(event, CreateRequest):
            self.queue.admit(event, parsed.size, parsed.parse_ns, parsed.frame, parsed.mcp)
        elif isinstance(event, CancelEvent):
            self.queue.cancel(event)
        elif isinstance(event, ProcessedEvent):
            pass  # Codex acknowledges each response; an error here breaks its next turn.
        elif event.type in PASSED_THROUGH and (self.settings.inject or event.type not in INJECTS):
            self._passed_through(event, parsed)
        elif isinstance(event, UnknownEvent) and event.type not in INJECTS:
            self.refuse(ProtocolError.unknown_event(event.type), echoed(event.stream_id))
        else:
            # response.inject / response.append: the long-running response is off.
            self.refuse(ProtocolError.unknown_event(event.type, needs_long_running=True))

    def _passed_through(self, event: UnknownEvent | AppendEvent, parsed: Parsed) -> None:
        """An event the core passes through (steer, interrupt, inject) or parses only in
        part (append), decoded (`FrameParser.decode_passed_through`; refused when it cannot)
        and handed to its unit."""
        try:
            append, decoded = self._parser.decode_passed_through(event, parsed)
        except ProtocolError as e:
            self.refuse(e)
            return
        if event.type == "response.interrupt":
            interrupt(self, decoded)
        elif event.type == "response.steer":
            self.steering.receive(decoded, parsed.size)
        else:
            assert append is not None, "an append or an inject"
            self.long_running.receive(append, decoded, parsed.size)

    def receive_request(
        self, request: CreateRequest, size: int, parse_ns: int = 0, mcp: McpTurn | None = None
    ) -> None:
        """A request parsed by the caller (an HTTP `POST /v1/responses` body of `size`
        bytes, parsed in `parse_ns`, its MCP servers listed): the same turn as a
        `response.create` frame."""
        if not self.closed:
            self.queue.admit(request, size, parse_ns, mcp=mcp)

    def receive_compact(self, request: CreateRequest) -> None:
        """`POST /v1/responses/compact` (its body parsed as a request): see
        `Summarization.receive_compact`."""
        if not self.closed:
            self.summarization.receive_compact(request, self.queue.lanes[None])

    def receive_bytes(self, frame: bytes) -> None:
        """One binary frame: refused, the socket stays open."""
        if not self.closed:
            self.refuse(ProtocolError.binary_frame())

    def engine_output(self, key: int, ids: list[int]) -> bool:
        """Sampled ids for response `key`. Returns whether the engine should go on
        (False once the model sampled a stop token or the response was abandoned)."""
        response = self.generating.get(key)
        if response is None or response.state is State.CUT_FOR_STEER:
            return False
        more = response.feed(ids)
        if (
            self.settings.inject
            and response.parser.stopped
            and response.state is not State.SUMMARIZING
        ):
            # The model stopped: a response that called a tool waits from now on, so an
            # injection sent on its call item finds it waiting (the engine's own end,
            # which `engine_done` then ignores, may come after that frame).
            self.engine_done(key)
        return more

    def streaming(self, key: int) -> bool:
        """Whether response `key` has streamed a delta event yet (True once it is no
        longer generating): a paced stream (`coalesced`) waits only from then on."""
        response = self.generating.get(key)
        return response is None or response.events.streaming

    def engine_done(self, key: int, engine_cached: int | None = None) -> None:
        """The engine finished response `key` (stop token or max_output_tokens);
        `engine_cached`: the prompt ids it said it had in its own cache (`ENGINE_CACHED`)."""
        response = self.generating.pop(key, None)
        if response is None:
            return
        response.done(engine_cached)
        # The state its model turn ended in says which unit goes on with it.
        state = response.state
        if state is State.SUMMARIZING:
            self.summarization.summarized(response)
        elif state is State.CALLING_MCP:
            self.mcp.call(response)
        elif state is State.WAITING_FOR_TOOLS:
            self.long_running.wait(response)

    def mcp_done(self, key: int, results: list[str | McpError]) -> None:
        """The `McpCall` work `key` finished: the calls a request approved (it renders
        with their outputs, `TurnStart.approved`), or a response's (`McpLoop.done`)."""
        if not self.turns.approved(key, results):
            self.mcp.done(key, results)

    def engine_failed(self, key: int, error: EngineError) -> None:
        response = self.generating.pop(key, None)
        if response is not None:
            response.failed(error)

    def render_done(self, key: int, turn: Turn, request: CreateRequest) -> None:
        """The `Render` work `key` finished (`Render.run` returned `request`, `turn`): the
        turn goes on to the engine."""
        self.turns.render_done(key, turn, request)

    def render_failed(self, key: int, error: CoreError) -> None:
        """The `Render` work `key` raised: the request is refused, the lane goes on."""
        self.turns.render_failed(key, error)

    def persist_done(self, key: int, continued: ConversationStart | None = None) -> None:
        """The `Persist` work `key` committed: the terminal event goes out. `continued`:
        where a turn continuing the response on its conversation starts (its items
        were appended where it read the conversation; `Ledger.persist`)."""
        ending = self.ending.pop(key, None)
        if ending is not None:
            lane = ending.response.lane
            lane.ending = None
            ending.continued = continued
            ending.conclude()
            self.freed(lane)

    def persist_failed(self, key: int, message: str) -> None:
        """The `Persist` work `key` was not committed: the response ends as
        `response.failed` (`error.message` starting with `store_unavailable:`), never
        acknowledged."""
        ending = self.ending.pop(key, None)
        if ending is not None:
            lane = ending.response.lane
            lane.ending = None
            ending.store_failed(message)
            self.freed(lane)

    def wait_expired(self, key: int) -> None:
        """The idle timeout of `Wait(key)` (see `LongRunning.expired`)."""
        self.long_running.expired(key)

    def store_unavailable(self, response_id: str, message: str) -> None:
        """The transport could not read `response_id` from the store for the next
        request that continues it: if the cache misses it, that request is refused with
        `store_unavailable` (503, retry later), not `previous_response_not_found`."""
        self.chains.unreadable[response_id] = ProtocolError.store_unavailable(message)

    def cannot_continue(self, parent: str, error: ProtocolError) -> None:
        """The transport could not rebuild `parent` (a conversation whose items no
        longer render): the next request that continues it is refused with `error`."""
        self.chains.unreadable[parent] = error

    def lifetime_reached(self) -> None:
        """The connection's lifetime is over: finish what is in flight, refuse the
        rest, then close with 1000. Never cuts a response in the middle."""
        self.queue.expiring = True
        self.long_running.closing()
        self._finish_expiry()

    def shutting_down(self) -> None:
        """The server drains (`hotloop.shutdown`): it finishes what is in flight, and the
        transport closes the connection once nothing is (with 1012)."""
        self._draining = True
        self.long_running.closing()

    def connection_lost(self) -> None:
        """The socket closed: `abandon`, and the cache dies with the socket."""
        self.abandon()
        self.cache.clear()

    def abandon(self) -> None:
        """The client went away (its socket closed, or it left an HTTP request): stop all
        generation, and book what the engine did for the responses it stops. A response
        waiting for tool output ends as on a closing connection (its usage booked, and
        committed when stored, so the client can continue it from a new connection)."""
        self.closed = True
        self.long_running.closing()
        for response in self.generating.values():
            self.outbox.append(Cancel(response.key))
            usage = response.usage()
            response.enter(State.DONE)
            response.book(response.events.response_json("cancelled", usage=usage), usage)
        self.generating.clear()
        self.waiting.clear()
        # Commits in progress finish on their own; their usage is booked now, as their
        # generation ended.
        for ending in self.ending.values():
            ending.response.enter(State.DONE)
            self.report(ending.finished)
        self.ending.clear()
        # A render still running in a worker thread finishes on its own; its result
        # finds no turn and is dropped.
        self.turns.rendering.clear()
        self.queue.clear()
        self.steering.awaiting.clear()

    # ---------------------------------------------------------------- outputs

    def actions(self) -> list[Action]:
        """Everything to do since the last call, in order."""
        # Copied and cleared, not replaced: `emit` is bound to this very list.
        out = self.outbox.copy()
        self.outbox.clear()
        return out

    @property
    def in_flight(self) -> int:
        waiting = len(self.waiting)
        return len(self.generating) + len(self.turns.rendering) + len(self.ending) + waiting

    @property
    def busy(self) -> bool:
        """Something is rendering, generating or waiting in a queue."""
        return self.in_flight > 0 or self.queue.busy

    @property
    def retiring(self) -> bool:
        """The connection reached its lifetime or the server drains: what is in flight
        finishes, nothing waits on it for more input."""
        return self.queue.expiring or self._draining

    # ---------------------------------------------------------------- services

    def new_key(self) -> int:
        """A key for new engine work (`Generate`, `Render`, `Persist`, `Wait`)."""
        key = self._next_key
        self._next_key += 1
        return key

    def refuse(self, error: ProtocolError, stream_id: str | None = None) -> None:
        """An `error` event."""
        self.outbox.append(error.event(stream_id))

    def release(self, lane: Lane) -> None:
        """The response that held `lane` ended: the lane takes its next request."""
        lane.active = None
        self.freed(lane)

    def report(self, finished: Finished) -> None:
        """`finished` to the observer (usage, metrics, the store)."""
        if self._observer is not None:
            self._observer.finished(finished)

    def concluded(self, response: Response, ending: Ending) -> None:
        """`response`'s terminal event went out: the steers it accepted start the
        automatic successor, or stay queued while it waits for client tool output."""
        self.steering.after_terminal(response, ending)

    def running(self, response_id: str) -> Response | None:
        """The response sampling, or waiting open for tool output, with this id."""
        for responses in (self.generating, self.waiting):
            for response in responses.values():
                if response.events.response_id == response_id:
                    return response
        return None

    def not_running(self, response_id: str) -> ProtocolError:
        """Why `response_id` cannot be steered or interrupted."""
        if any(e.response.events.response_id == response_id for e in self.ending.values()):
            return ProtocolError(
                "response_not_active", f"Response '{response_id}' is ending.", "response_id"
            )
        if self.cache.get(response_id) is not None:
            return ProtocolError(
                "response_already_completed",
                f"Response '{response_id}' completed; continue it with response.create.",
                "response_id",
            )
        return ProtocolError(
            "response_not_found",
            f"Response '{response_id}' is not on this connection.",
            "response_id",
        )

    def conversation_for(self, request: CreateRequest) -> Conversation:
        """The conversation `request` would extend (`POST /v1/responses/input_tokens`
        counts its prompt there: on a cached chain, only the new items are rendered).
        Raises ProtocolError for a refused request or a missed `previous_response_id`."""
        if request.error is not None:
            raise ProtocolError.from_core(request.error)
        chain = self.chains.continued(request, self.queue.lanes[None])
        if isinstance(chain, ProtocolError):
            raise chain
        return chain[0]

    def reparse(self, frame: str | bytes) -> CreateRequest:
        """A `response.create` frame parsed again: a queued request's when its turn
        comes (it reads no state that changes, so it may run in a worker thread; the
        parse is deterministic, so it gives what the first parse gave), or one with
        steering input added. Raises what `parse` refuses with."""
        return self._parser.reparse(frame)

    # ---------------------------------------------------------------- lifetime

    def freed(self, lane: Lane) -> None:
        """What held `lane` (a response, its render or its commit) let go of it: its next
        request starts when it can, or the connection closes at its lifetime."""
        self.queue.freed(lane)
        self._finish_expiry()

    def _finish_expiry(self) -> None:
        if not self.queue.expiring or self.in_flight or self.closed:
            return
        if not self.queue.refuse_queued(ProtocolError.lifetime_reached()):
            self.refuse(ProtocolError.lifetime_reached())
        self.closed = True
        self.outbox.append(Close(1000, "connection lifetime reached"))
