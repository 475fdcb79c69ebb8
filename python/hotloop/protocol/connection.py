"""The per-connection protocol state machine of WebSocket mode (sans-I/O).

`Connection` is fed client frames (`receive_text`, `receive_bytes`, or `parse` then
`receive_parsed` when the transport parses a large frame off the event loop), engine results
(`engine_output`, `engine_done`, `engine_failed`) and time (`lifetime_reached`), and
answers with `actions()`: server frames (bytes) to send in order, `Generate` /
`Cancel` work for the engine, and at most one `Close`. It owns lanes (FIFO within a
lane, concurrent across lanes), the queue and its limits, the in-flight cap, cancel,
the connection lifetime, event sequencing, error envelopes and the connection cache
of checkpoints. It performs no I/O and never awaits: the transport pumps frames in
and out, and runs the engine work it is handed.

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

import logging
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from hotloop._core import (
    AppendEvent,
    CancelEvent,
    ChatFormat,
    Checkpoint,
    Conversation,
    CoreError,
    CreateRequest,
    Limits,
    OutputParser,
    Policy,
    ProcessedEvent,
    Prompt,
    Turn,
    UnknownEvent,
    parse_event,
)
from hotloop.engines.base import API_SAMPLING, EngineError, Sampling
from hotloop.events import ResponseEvents, Usage, error_event, new_id
from hotloop.protocol.cache import ConnectionCache
from hotloop.protocol.compaction import (
    Compactor,
    Summary,
    compacted_resource,
    resumed,
    summarizing,
)
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.injection import (
    Injection,
    answer,
    as_append,
    parse_injection,
    resume_frame,
    returned_input,
)
from hotloop.protocol.queue_memory import RETRY_AFTER_SECONDS, QueueMemory
from hotloop.protocol.steering import (
    MAX_PENDING_STEERS,
    Steer,
    parse_steer,
    successor_frame,
    with_steering,
)

if TYPE_CHECKING:
    from hotloop._core import ClientEvent

log = logging.getLogger("hotloop.protocol")
# One line per response: its id and the request id the client saw, to match reports.
requests_log = logging.getLogger("hotloop.requests")

STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")
MAX_IN_FLIGHT = 16
MAX_NAMED_LANES = 32
# Frames at least this large are parsed and rendered off the event loop (`offloads`).
# Rendering text costs about 13 ns a byte (tokenization), checking and rendering tool
# schemas up to about 0.2 us a byte, a hop to a worker thread and back about 45 us (all
# measured on the 2-core dev machine): at 32 KB the hop adds a tenth to a 0.4 ms render,
# and an inline parse and render stall the loop for at most a few milliseconds. The
# frame's size decides, not one field's: a large tool list, instructions or input all
# leave the loop. An agent's tool output (a few KB) stays inline; a resumed history or
# an MCP-sized tool list no longer stalls every other connection's frames and handshakes.
OFFLOAD_BYTES = 32 * 1024
STORE_UNAVAILABLE = "store_unavailable"
CONNECTION_CLOSING = "connection_closing"
"""`incomplete_details.reason` of a response that waited for tool output when its
connection reached its lifetime or the server began draining."""
ITEM_DONE = frozenset(("message_done", "reasoning_done", "call_done"))
INJECTS = frozenset(("response.inject", "response.append"))
"""The long-running response's events (refused on a connection without it)."""
PASSED_THROUGH = frozenset(("response.interrupt", "response.steer", *INJECTS))
"""Events the connection decodes itself (`Connection._passed_through`)."""


def offloads(frame: str | bytes) -> bool:
    """Whether `frame` is parsed off the event loop (`Connection.parse` in a worker
    thread). A str's length in characters is a lower bound of its bytes."""
    return len(frame) >= OFFLOAD_BYTES


def undecodable(error: orjson.JSONDecodeError) -> ProtocolError:
    """A frame the core parsed (it skips unknown fields at any depth) that the decoder
    refuses (it stops at 1,024 levels): refused, never a dropped socket."""
    return ProtocolError("invalid_json", f"The event cannot be decoded: {error}.")


@dataclass(frozen=True)
class Parsed:
    """A client text frame after `Connection.parse`: its event or its refusal."""

    event: ClientEvent | ProtocolError
    """The event, or why the frame is refused."""
    size: int
    parse_ns: int
    frame: str | bytes
    """The frame's text: kept by a request that has to wait (`_Pending.frame`), read
    by the events the core passes through (`response.steer`, `response.interrupt`)."""

    @property
    def previous_response_id(self) -> str | None:
        """The response a valid `response.create` continues, as the core parsed it."""
        event = self.event
        if isinstance(event, CreateRequest) and event.error is None:
            return event.previous_response_id
        return None


@dataclass(frozen=True)
class Generate:
    """Engine work: stream sampled ids for `prompt`, feeding them to
    `engine_output(key, ids)`, then call `engine_done(key)` (or `engine_failed`).
    `route_key` names the conversation the same way on every node: the client's
    session header when it sent one, otherwise the id of the chain's first response
    (kept with every cached checkpoint and rebuilt from the store on a miss)."""

    key: int
    prompt: Prompt
    sampling: Sampling
    route_key: str


@dataclass(frozen=True)
class Render:
    """Work too large for the event loop: `run()` in a worker thread (the core releases
    the GIL for it), then call `render_done(key, turn, request)` with what it returned,
    or `render_failed(key, error)` with its `CoreError`."""

    key: int
    conversation: Conversation
    request: CreateRequest | Callable[[], CreateRequest]
    """The request, or how to parse it again: a request that waited in its lane's queue
    kept only its frame, and a large frame is parsed here, not on the event loop."""

    def run(self) -> tuple[CreateRequest, Turn]:
        request = self.request if isinstance(self.request, CreateRequest) else self.request()
        return request, self.conversation.extend(request)


@dataclass(frozen=True)
class Persist:
    """Durable work: commit `finished` (a `store=true` response) to the store, then call
    `persist_done(key)`, or `persist_failed(key, message)` when it was not committed.
    The response's terminal event waits for it; deltas were sent already."""

    key: int
    finished: Finished


@dataclass(frozen=True)
class Cancel:
    """Stop the engine work of `key`, or the idle timer of `Wait(key)`; the connection
    already sent any terminal event."""

    key: int


@dataclass(frozen=True)
class Wait:
    """Response `key` waits for injected tool output: call `wait_expired(key)` after
    `seconds` (the connection ignores it if the response resumed or ended meanwhile)."""

    key: int
    seconds: float


@dataclass(frozen=True)
class Close:
    """Close the socket after sending every frame before this action."""

    code: int = 1000
    reason: str = ""


Action = bytes | Generate | Render | Persist | Cancel | Wait | Close


@dataclass(frozen=True)
class Finished:
    """A response that reached its terminal event, for work off the critical path
    (persistence when `request.store`, usage accounting, metrics)."""

    response_id: str
    request: CreateRequest
    response_json: bytes
    """The terminal Response object."""
    checkpoint: Checkpoint | None
    """Where to continue from; None when the response cannot be continued."""
    usage: Usage
    principal: str | None
    """The API key the connection authenticated with."""
    overhead_ns: int
    """Server time from the start of the turn to the engine call (parse, lookup,
    validate, render, tokenize)."""
    turn: Turn | None
    status: str = "completed"
    """The Response's `status` (the protocol knows it; nobody parses `response_json`)."""
    error: dict[str, str] | None = None
    """The Response's `error` (`code`, `message`) when it failed."""
    created_at: int = 0
    failure: str | None = None
    """Why it failed, as a stable code: `store_unavailable` when its commit failed (the
    wire's `error.code` is then `server_error`, the SDK's enum having nothing closer)."""
    segments: tuple[TurnSegment, ...] = ()
    """A stored long-running response that took input while it ran: every model turn
    with the input committed after it (empty otherwise: the request's input, then the
    whole output, whose ids the store takes from `checkpoint` after `turn`)."""


@dataclass(frozen=True)
class TurnSegment:
    """One model turn of a long-running response, as the store keeps it: where its items
    end in `output` (a count), its output segment's token ids as the cache holds them,
    and the input committed inside the response after it (injected tool outputs, then
    steering input; after the last turn, outputs still held when the response ended)."""

    outputs_end: int
    token_ids: list[int]
    then: list[dict[str, Any]]


class Observer(Protocol):
    """What the connection tells the rest of the server."""

    def finished(self, response: Finished) -> None:
        """Called once per terminal Response; must not block."""
        ...


class Baseline(Protocol):
    """A stateless peer's per-turn prompt work, run instead of the cache's prompt for
    comparison (`hotloop serve --baseline`, see hotloop.bench.peer): the engine is fed
    the peer's prompt."""

    def render_request(self, response_id: str, request: CreateRequest) -> Prompt: ...

    def commit(self, response_id: str, response_json: bytes) -> None: ...


@dataclass(frozen=True)
class ConnectionLimits:
    """Per-connection bounds; each breach is a clear `error` event, never a drop."""

    max_frame_bytes: int = 16 * 1024 * 1024
    max_queued_bytes: int = 64 * 1024 * 1024
    request: Limits | None = None


@dataclass
class _Pending:
    """A request on its lane's queue. One that has to wait keeps only its frame's text
    (`frame`: about one byte per queued byte) instead of the parsed request (about two:
    the parsed items plus the input's JSON kept for the store), and is parsed again when
    its turn comes; the parse is deterministic, so the second gives the first's result."""

    parsed: CreateRequest | None
    size: int
    parse_ns: int
    frame: str | bytes | None = None
    started: bool = False
    steered: _Steered | None = None
    """The steering input this turn carries (an automatic successor, or a continuation
    with queued steers prepended): returned in `response.steer.failed` if it fails."""
    parent: str | None = field(init=False)
    """The request's `previous_response_id`, kept while only the frame is."""

    def __post_init__(self) -> None:
        self.parent = None if self.parsed is None else self.parsed.previous_response_id

    @property
    def request(self) -> CreateRequest:
        assert self.parsed is not None, "parsed again by Connection._start"
        return self.parsed


@dataclass
class _Active:
    key: int
    lane: _Lane
    request: CreateRequest
    events: ResponseEvents
    conversation: Conversation
    parser: OutputParser
    turn: Turn
    parent: str | None
    evicts_parent: bool
    overhead_ns: int
    root: str
    steers: list[Steer] = field(default_factory=list)
    """Accepted steers: sampling stops at the next item boundary, a successor follows."""
    cut: bool = False
    """Sampling stopped at an item boundary for a steer."""
    compaction: Summary | None = None
    """Set while the engine writes a summary (`conversation`, `parser` and `turn` are
    the summarization's); the turn proper starts from it afterwards."""
    spent: Usage | None = None
    """The engine passes before the current one, added to its usage: a compacted
    turn's summarization, a long-running response's earlier model turns."""
    waiting: dict[str, str] = field(default_factory=dict)
    """Long-running mode: the calls (call id -> name) the response waits for output of."""
    injected: list[Injection] = field(default_factory=list)
    """Injections accepted while other calls still wait (they resume it together)."""
    resumed: Turn | None = None
    """The current model turn of a resumed response (`turn` stays the first one, whose
    prompt the metrics count; the store takes each turn's ids from `segments`)."""
    first_item: int = 0
    """Where the current model turn's items start in `events.output`."""
    segments: list[TurnSegment] = field(default_factory=list)
    """A stored long-running response's model turns that input followed, for the store."""

    @property
    def current_turn(self) -> Turn:
        """The model turn sampling now (or last)."""
        return self.resumed or self.turn


@dataclass
class _Steered:
    """Steering input carried by a turn, with the events of the response it steered
    (its steer events continue that response's `sequence_number`)."""

    target: ResponseEvents
    steers: list[Steer]
    automatic: bool


@dataclass
class _Awaiting:
    """A lane's latest response, which stopped for client tool output: steers for it
    stay queued for the client's continuation."""

    events: ResponseEvents
    required: list[dict[str, str]]
    steers: list[Steer] = field(default_factory=list)


@dataclass
class _Rendering:
    """A turn waiting for its `Render` work; it holds its lane like an active turn."""

    lane: _Lane
    pending: _Pending
    conversation: Conversation
    parent: str | None
    evicts_parent: bool
    start: int
    root: str | None
    """The chain's first response id; None for a new chain (it is the new response)."""
    cancelled: bool = False


@dataclass
class _Ending:
    """A finished turn whose terminal event waits for its commit (`Persist`)."""

    active: _Active
    kind: str
    """The terminal event's type; `finished` holds the Response it carries."""
    checkpoint: Checkpoint | None
    finished: Finished


@dataclass
class _Lane:
    name: str | None
    queue: deque[_Pending] = field(default_factory=deque)
    active: _Active | None = None
    rendering: _Rendering | None = None
    ending: _Ending | None = None

    @property
    def free(self) -> bool:
        return self.active is None and self.rendering is None and self.ending is None


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
        baseline: Baseline | None = None,
        session_key: str | None = None,
        queue_memory: QueueMemory | None = None,
        durable: bool = False,
        storage_refusal: Callable[[str | None], str | None] | None = None,
        request_id: str | None = None,
        compactor: Compactor | None = None,
        sampling_defaults: tuple[float, float] = API_SAMPLING,
        inject: bool = False,
        inject_idle_timeout: float = 300.0,
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
        `response.incomplete` after `inject_idle_timeout` seconds without it."""
        self.cache = cache
        self._inject = inject
        self._inject_idle_timeout = inject_idle_timeout
        self._waiting: dict[int, _Active] = {}
        """Long-running responses waiting for tool output, by the key of their last
        model turn (they hold their lane)."""
        self._session_key = session_key
        self._queue_memory = queue_memory
        self._request_id = request_id
        self._compactor = compactor or Compactor.ephemeral()
        self._sampling_defaults = sampling_defaults
        self.limits = limits or ConnectionLimits()
        self._format = chat_format
        self._context_window = context_window
        self._model = model
        self._stop_tokens = tuple(chat_format.stop_tokens)
        self._policy = policy
        self._observer = observer
        self._principal = principal
        self._clock = clock
        self._baseline = baseline
        self._lanes: dict[str | None, _Lane] = {None: _Lane(None)}
        self._ready: deque[_Lane] = deque()
        self._active: dict[int, _Active] = {}
        self._rendering: dict[int, _Rendering] = {}
        self._ending: dict[int, _Ending] = {}
        self._unreadable: dict[str, str] = {}
        """Parent ids the store could not be read for (`store_unavailable`), and why."""
        self._durable = durable
        self._storage_refusal = storage_refusal
        self._next_key = 0
        self._queued_bytes = 0
        self._actions: list[Action] = []
        self._expiring = False
        self._draining = False
        self._skipped_tools: set[tuple[str, str | None]] = set()
        self._awaiting: dict[str | None, _Awaiting] = {}
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
        # `isascii` is O(1) on str: only non-ASCII text pays for measuring its bytes.
        size = len(frame) if isinstance(frame, bytes) or frame.isascii() else len(frame.encode())
        if size > self.limits.max_frame_bytes:
            error = ProtocolError(
                "frame_too_large",
                f"The frame is {size} bytes; this server accepts at most "
                f"{self.limits.max_frame_bytes} bytes per frame.",
            )
            return Parsed(error, size, 0, frame)
        start = self._clock()
        try:
            event = parse_event(self._compactor.expand(frame), self.limits.request)
        except CoreError as e:
            return Parsed(ProtocolError.from_core(e), size, self._clock() - start, frame)
        except ProtocolError as e:  # a compaction item that is not ours, or tampered with
            return Parsed(e, size, self._clock() - start, frame)
        return Parsed(event, size, self._clock() - start, frame)

    def receive_parsed(self, parsed: Parsed) -> None:
        """One text frame from the client, parsed by `parse`."""
        if self.closed:
            return
        event = parsed.event
        if isinstance(event, ProtocolError):
            self._refuse(event)
        elif isinstance(event, CreateRequest):
            self._create(event, parsed.size, parsed.parse_ns, parsed.frame)
        elif isinstance(event, CancelEvent):
            self._cancel(event)
        elif isinstance(event, ProcessedEvent):
            pass  # Codex acknowledges each response; an error here breaks its next turn.
        elif event.type in PASSED_THROUGH and (self._inject or event.type not in INJECTS):
            self._passed_through(event, parsed)
        elif isinstance(event, UnknownEvent) and event.type not in INJECTS:
            self._refuse(
                ProtocolError(
                    "unknown_event_type",
                    f"Unknown event type '{event.type}'. Supported: response.create, "
                    "response.cancel, response.processed, response.interrupt, response.steer.",
                    "type",
                ),
                self._echo(event.stream_id),
            )
        else:
            # response.inject / response.append: the long-running response is off.
            self._refuse(
                ProtocolError(
                    "unknown_event_type",
                    f"'{event.type}' needs the long-running response: send the header "
                    "'OpenAI-Beta: responses_multi_agent=v1' on the upgrade.",
                    "type",
                )
            )

    def _passed_through(self, event: UnknownEvent | AppendEvent, parsed: Parsed) -> None:
        """An event the core passes through (steer, interrupt, inject) or parses only in
        part (append), decoded here (`undecodable` when the decoder cannot)."""
        try:
            decoded = orjson.loads(parsed.frame)
        except orjson.JSONDecodeError as e:
            self._refuse(undecodable(e))
            return
        if event.type == "response.interrupt":
            self._interrupt(decoded)
        elif event.type == "response.steer":
            self._steer(decoded, parsed.size)
        elif isinstance(event, AppendEvent):
            self._receive_injection(event, decoded, parsed.size)
        else:
            append = parse_event(as_append(decoded), self.limits.request)
            assert isinstance(append, AppendEvent), "an inject parses as an append"
            self._receive_injection(append, decoded, parsed.size)

    def receive_request(self, request: CreateRequest, size: int, parse_ns: int = 0) -> None:
        """A request parsed by the caller (an HTTP `POST /v1/responses` body of `size`
        bytes, parsed in `parse_ns`): the same turn as a `response.create` frame."""
        if not self.closed:
            self._create(request, size, parse_ns)

    def receive_bytes(self, frame: bytes) -> None:
        """One binary frame: refused, the socket stays open."""
        if not self.closed:
            self._refuse(
                ProtocolError(
                    "binary_frame_not_supported",
                    "Binary frames are not supported: send each event as a JSON text frame.",
                )
            )

    def engine_output(self, key: int, ids: list[int]) -> bool:
        """Sampled ids for response `key`. Returns whether the engine should go on
        (False once the model sampled a stop token or the response was abandoned)."""
        active = self._active.get(key)
        if active is None or active.cut:
            return False
        if active.compaction is not None:
            active.compaction.feed(active.parser.feed(ids))
            return not active.parser.stopped
        if active.steers:
            more = self._feed_to_boundary(active, ids)
        else:
            active.events.feed(active.parser.feed(ids), self._actions.append)
            more = not active.parser.stopped
        if self._inject and active.parser.stopped:
            # The model stopped: a response that called a tool waits from now on, so an
            # injection sent on its call item finds it waiting (the engine's own end,
            # which `engine_done` then ignores, may come after that frame).
            self.engine_done(key)
        return more

    def _feed_to_boundary(self, active: _Active, ids: list[int]) -> bool:
        """A steered response: tokens one at a time, up to the end of the item being
        sampled; what the engine sampled beyond it is dropped unseen, so the parser (and
        the history it commits) holds whole items only."""
        for token in ids:
            parsed = active.parser.feed([token])
            active.events.feed(parsed, self._actions.append)
            if any(event[0] in ITEM_DONE for event in parsed):
                active.cut = True
                return False
            if active.parser.stopped:
                return False
        return True

    def engine_done(self, key: int) -> None:
        """The engine finished response `key` (stop token or max_output_tokens)."""
        active = self._active.pop(key, None)
        if active is None:
            return
        if active.compaction is not None:
            self._summarized(active, active.compaction)
            return
        if active.cut and not active.parser.stopped:
            self._steered(active)
            return
        parsed, outcome, message = active.parser.finish()
        active.events.feed(parsed, self._actions.append)
        usage = self._usage(active)
        if outcome == "malformed":
            self._fail(active, f"The model's output could not be parsed: {message}", usage)
            return
        try:
            active.conversation.commit_output(active.parser)
        except CoreError as e:
            self._fail(active, f"The model's output could not be recorded: {e.message}", usage)
            return
        calls = [
            item
            for item in active.events.output[active.first_item :]
            if item["type"] == "function_call"
        ]
        if self._inject and outcome == "stopped" and calls:
            self._wait(active, calls)
            return
        checkpoint = active.conversation.checkpoint()
        if outcome == "truncated":
            kind, status, reason = "response.incomplete", "incomplete", "max_output_tokens"
        else:
            kind, status, reason = "response.completed", "completed", None
        self._terminal(active, kind, status, usage, checkpoint, incomplete_reason=reason)

    def _steered(self, active: _Active) -> None:
        """The steered response ends at its item boundary, its sampled ids committed
        verbatim: the successor appends the steering input to these very tokens."""
        usage = self._usage(active)
        try:
            active.conversation.commit_output(active.parser)
        except CoreError as e:
            self._fail(active, f"The model's output could not be recorded: {e.message}", usage)
            return
        checkpoint = active.conversation.checkpoint()
        self._terminal(
            active,
            "response.incomplete",
            "incomplete",
            usage,
            checkpoint,
            incomplete_reason="steered",
        )

    def engine_failed(self, key: int, error: EngineError) -> None:
        active = self._active.pop(key, None)
        if active is None:
            return
        message = f"The engine failed ({error.code}): {error.message}"
        if active.compaction is not None and not active.compaction.resume:
            # /responses/compact has no response to fail: its request gets the error.
            self._refuse(ProtocolError("server_error", message, status=500))
            self._book(active, b"", self._usage(active), "failed", active.compaction.item_id)
            self._release(active)
            return
        self._fail(active, message, self._usage(active))

    def render_done(self, key: int, turn: Turn, request: CreateRequest) -> None:
        """The `Render` work `key` finished (`Render.run` returned `request`, `turn`): the
        turn goes on to the engine."""
        rendering = self._end_render(key)
        if rendering is None:
            return
        rendering.pending.parsed = request
        self._rendered(rendering, turn)
        active = rendering.lane.active
        if rendering.cancelled and active is not None:
            # The cancel came while rendering: the same frames as a cancel right after
            # `response.in_progress` of an inline render.
            self._cancel_active(active)
        else:
            self._lane_freed(rendering.lane)

    def render_failed(self, key: int, error: CoreError) -> None:
        """The `Render` work `key` raised: the request is refused, the lane goes on."""
        rendering = self._end_render(key)
        if rendering is not None:
            self._render_refused(rendering, error)
            self._lane_freed(rendering.lane)

    def persist_done(self, key: int) -> None:
        """The `Persist` work `key` committed: the terminal event goes out."""
        ending = self._ending.pop(key, None)
        if ending is not None:
            ending.active.lane.ending = None
            self._conclude(ending)
            self._lane_freed(ending.active.lane)

    def persist_failed(self, key: int, message: str) -> None:
        """The `Persist` work `key` was not committed: the response ends as
        `response.failed` (`error.message` starting with `store_unavailable:`), never
        acknowledged."""
        ending = self._ending.pop(key, None)
        if ending is None:
            return
        active = ending.active
        active.lane.ending = None
        if active.evicts_parent and active.parent is not None:
            self.cache.evict(active.parent)
        error = {"code": "server_error", "message": f"{STORE_UNAVAILABLE}: {message}"}
        self._conclude(
            replace(
                ending,
                kind="response.failed",
                checkpoint=None,
                finished=replace(
                    ending.finished,
                    response_json=active.events.response_json(
                        "failed", usage=ending.finished.usage, error=error
                    ),
                    checkpoint=None,
                    status="failed",
                    error=error,
                    failure=STORE_UNAVAILABLE,
                ),
            )
        )
        self._lane_freed(active.lane)

    def store_unavailable(self, response_id: str, message: str) -> None:
        """The transport could not read `response_id` from the store for the next
        request that continues it: if the cache misses it, that request is refused with
        `store_unavailable` (503, retry later), not `previous_response_not_found`."""
        self._unreadable[response_id] = message

    def lifetime_reached(self) -> None:
        """The connection's lifetime is over: finish what is in flight, refuse the
        rest, then close with 1000. Never cuts a response in the middle."""
        self._expiring = True
        self._closing()
        self._finish_expiry()

    def shutting_down(self) -> None:
        """The server drains (`hotloop.shutdown`): it finishes what is in flight, and the
        transport closes the connection once nothing is (with 1012)."""
        self._draining = True
        self._closing()

    def _closing(self) -> None:
        """A response waiting for tool output would hold the closing connection open
        until its idle timeout, and could not resume on it: it ends now (reason
        `connection_closing`), continuable on another connection."""
        for waiting in list(self._waiting.values()):
            self._end_waiting(waiting, CONNECTION_CLOSING)

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
        self._closing()
        for active in self._active.values():
            self._actions.append(Cancel(active.key))
            usage = self._usage(active)
            self._book(active, active.events.response_json("cancelled", usage=usage), usage)
        self._active.clear()
        self._waiting.clear()
        # Commits in progress finish on their own; their usage is booked now, as their
        # generation ended.
        for ending in self._ending.values():
            self._report(ending.finished)
        self._ending.clear()
        # A render still running in a worker thread finishes on its own; its result
        # finds no turn and is dropped.
        self._rendering.clear()
        for lane in self._lanes.values():
            lane.queue.clear()
            lane.active = None
            lane.rendering = None
            lane.ending = None
        self._ready.clear()
        self._dequeued(self._queued_bytes)
        self._awaiting.clear()

    # ---------------------------------------------------------------- outputs

    def actions(self) -> list[Action]:
        """Everything to do since the last call, in order."""
        out, self._actions = self._actions, []
        return out

    @property
    def in_flight(self) -> int:
        return len(self._active) + len(self._rendering) + len(self._ending) + len(self._waiting)

    @property
    def busy(self) -> bool:
        """Something is rendering, generating or waiting in a queue."""
        return self.in_flight > 0 or self._queued_bytes > 0 or bool(self._ready)

    # ---------------------------------------------------------------- requests

    def _echo(self, stream_id: str | None) -> str | None:
        # Only a well-formed name is echoed: an invalid one may be anything at all.
        return stream_id if stream_id is not None and STREAM_ID.fullmatch(stream_id) else None

    def _refuse(self, error: ProtocolError, stream_id: str | None = None) -> None:
        self._actions.append(
            error_event(
                error.code,
                error.message,
                error.param,
                status=error.status,
                stream_id=stream_id,
                retry_after=error.retry_after,
            )
        )

    def _create(
        self, request: CreateRequest, size: int, parse_ns: int, frame: str | bytes | None = None
    ) -> None:
        name = request.stream_id
        if name is not None and not STREAM_ID.fullmatch(name):
            self._refuse(
                ProtocolError(
                    "invalid_stream_id",
                    "stream_id must be 1-256 characters of letters, digits, '_', '.' or '-'.",
                    "stream_id",
                )
            )
            return
        if request.error is not None:
            self._refuse(ProtocolError.from_core(request.error), name)
            return
        if request.skipped_tools:
            self._note_skipped(request.skipped_tools)
        if request.background:
            self._refuse(
                ProtocolError(
                    "invalid_value",
                    "background responses are not supported over WebSocket mode.",
                    "background",
                ),
                name,
            )
            return
        if self._expiring:
            self._refuse(self._lifetime_error(), name)
            return
        over_quota = self._over_quota(request)
        if over_quota is not None:
            self._refuse(over_quota, name)
            return
        lane = self._lanes.get(name)
        if lane is None:
            if len(self._lanes) - 1 >= MAX_NAMED_LANES:
                self._refuse(
                    ProtocolError(
                        "websocket_stream_limit_reached",
                        f"This connection already uses {MAX_NAMED_LANES} stream_ids; "
                        "open a new connection for more lanes.",
                        "stream_id",
                    ),
                    name,
                )
                return
            lane = self._lanes[name] = _Lane(name)
        try:
            self._hold(size)
        except ProtocolError as e:
            self._refuse(e, name)
            return
        pending = _Pending(request, size, parse_ns)
        awaiting = self._awaiting.get(name)
        if (
            awaiting is not None
            and awaiting.steers
            and frame is not None
            and request.previous_response_id == awaiting.events.response_id
        ):
            # The continuation of a response that waited for tool output takes the
            # steers queued for it, in submission order, before its own input.
            taken = self._with_steers(frame, awaiting.steers)
            if isinstance(taken, ProtocolError):
                # Refused with the steers (over the item limit, say): its bytes leave
                # the bounds; the steers stay queued for the next continuation.
                self._dequeued(size)
                self._refuse(taken, name)
                return
            frame, steered = taken
            pending = _Pending(
                steered, size, parse_ns, steered=_Steered(awaiting.events, awaiting.steers, False)
            )
            self._release_steers(awaiting.steers)
            awaiting.steers = []
        lane.queue.append(pending)
        if lane.free and len(lane.queue) == 1:
            self._ready.append(lane)
        self._pump()
        if not pending.started and frame is not None:
            pending.parsed, pending.frame = None, frame  # it waits: keep the smaller form

    def _with_steers(
        self, frame: str | bytes, steers: list[Steer]
    ) -> tuple[bytes, CreateRequest] | ProtocolError:
        """A continuation's frame with `steers` before its own input, and its parse; or
        why it is refused (the core's limits count the steers too)."""
        try:
            frame = with_steering(frame, steers)
            steered = parse_event(self._compactor.expand(frame), self.limits.request)
        except orjson.JSONDecodeError as e:
            return undecodable(e)
        except CoreError as e:
            return ProtocolError.from_core(e)
        except ProtocolError as e:
            return e
        assert isinstance(steered, CreateRequest), "a response.create with more input"
        if steered.error is not None:
            return ProtocolError.from_core(steered.error)
        return frame, steered

    def _over_quota(self, request: CreateRequest) -> ProtocolError | None:
        """The refusal of a `store=true` request (a warm-up too: it is stored like any
        other) from a key at its storage quota."""
        if not (request.store and self._durable and self._storage_refusal is not None):
            return None
        message = self._storage_refusal(self._principal)
        if message is None:
            return None
        return ProtocolError("insufficient_quota", message, "store", status=429)

    def _hold(self, size: int) -> None:
        """Count `size` bytes of input waiting on this connection (queued requests,
        accepted steers, injected tool outputs) in its bound and the process's; raise the
        `ProtocolError` that refuses them past either."""
        if self._queued_bytes + size > self.limits.max_queued_bytes:
            raise ProtocolError.limit(
                "websocket_queue_limit_reached",
                f"{self._queued_bytes} bytes of input are already queued on this "
                f"connection (limit {self.limits.max_queued_bytes}); wait for responses "
                "to finish before sending more.",
                RETRY_AFTER_SECONDS,
            )
        if self._queue_memory is not None:
            self._queue_memory.reserve(self._principal, size)
        self._queued_bytes += size

    def _release_steers(self, steers: list[Steer]) -> None:
        """Steers leave the queue: started in a request, or refused."""
        self._dequeued(sum(steer.size for steer in steers))

    def _dequeued(self, size: int) -> None:
        self._queued_bytes -= size
        if self._queue_memory is not None:
            self._queue_memory.release(self._principal, size)

    def _note_skipped(self, tools: list[tuple[str, str | None]]) -> None:
        # Codex sends tool types no local model runs (web_search, custom, ...): they are
        # accepted and left out of the prompt. Said once per connection, not per turn.
        for tool in tools:
            if tool not in self._skipped_tools:
                self._skipped_tools.add(tool)
                log.info(
                    "tool %s (type %s) is not rendered: this server cannot run it", tool[1], tool[0]
                )

    def _pump(self) -> None:
        """Start queued requests while lanes are free and the in-flight cap allows."""
        closing = self._expiring or self.closed
        while self._ready and self.in_flight < MAX_IN_FLIGHT and not closing:
            lane = self._ready.popleft()
            pending = lane.queue.popleft()
            pending.started = True
            self._dequeued(pending.size)
            self._start(lane, pending)
            if lane.free and lane.queue:
                self._ready.append(lane)

    def _chain(
        self, parent: str | None, lane: _Lane
    ) -> tuple[Conversation, bool, str | None] | ProtocolError:
        """The conversation a request continues (a fork of `parent`'s checkpoint, or a
        new one), whether a failure evicts the parent, and the root of the parent's
        chain (its routing key; None for a new conversation); or why it cannot."""
        if parent is None:
            conversation = Conversation(
                self._format, context_window=self._context_window, policy=self._policy
            )
            return conversation, False, None
        # The transport already tried the store (`Ledger.warm`): a miss here is final,
        # unless the store could not be read.
        cached = self.cache.get(parent)
        checkpoint = cached.checkpoint if cached is not None else None
        unreadable = self._unreadable.pop(parent, None)
        if cached is None or checkpoint is None:
            if unreadable is None:
                return ProtocolError.not_found(parent)
            return ProtocolError.store_unavailable(unreadable)
        # A continuation on the lane that made the parent consumes it on failure; a
        # fork from another lane must leave the parent to its own lane.
        return checkpoint.fork(), cached.lane == lane.name, cached.root

    def _start(self, lane: _Lane, pending: _Pending) -> None:
        """Run the turn up to the engine call; errors end the request here."""
        start = self._clock()
        parent = pending.parent
        chain = self._chain(parent, lane)
        if isinstance(chain, ProtocolError):
            self._refuse_turn(pending, chain, lane.name)
            return
        conversation, evicts_parent, root = chain
        rendering = _Rendering(lane, pending, conversation, parent, evicts_parent, start, root)
        if pending.size >= OFFLOAD_BYTES:
            key = self._next_key
            self._next_key += 1
            lane.rendering = self._rendering[key] = rendering
            frame = pending.frame
            if pending.parsed is not None:
                self._actions.append(Render(key, conversation, pending.parsed))
            elif frame is not None:
                # Parsed again with the render, off the event loop, as it was the first time.
                self._actions.append(Render(key, conversation, lambda: self._parse_queued(frame)))
            pending.frame = None
            return
        if pending.parsed is None:
            pending.parsed = self._parse_queued(pending.frame or b"")
            pending.frame = None
            pending.parse_ns += self._clock() - start
        request = pending.request
        try:
            turn = conversation.extend(request)
        except CoreError as e:
            self._render_refused(rendering, e)
            return
        self._rendered(rendering, turn)

    def _parse_queued(self, frame: str | bytes) -> CreateRequest:
        """A queued request's frame, parsed again when its turn comes (it reads no state
        that changes, so it may run in a worker thread): the parse is deterministic, so
        it gives what the first parse gave."""
        event = parse_event(self._compactor.expand(frame), self.limits.request)
        assert isinstance(event, CreateRequest), "the frame parsed as one before"
        return event

    def _end_render(self, key: int) -> _Rendering | None:
        # None when the client went away meanwhile.
        rendering = self._rendering.pop(key, None)
        if rendering is not None:
            rendering.lane.rendering = None
        return rendering

    def _render_refused(self, rendering: _Rendering, error: CoreError) -> None:
        if rendering.evicts_parent and rendering.parent is not None:
            self.cache.evict(rendering.parent)
        self._refuse_turn(rendering.pending, ProtocolError.from_core(error), rendering.lane.name)

    def _refuse_turn(self, pending: _Pending, error: ProtocolError, name: str | None) -> None:
        """A turn refused before generation; steering input it carried is returned
        (`successor_creation_failed`), and an automatic successor, which no client
        request asked for, gets no `error` event."""
        steered = pending.steered
        if steered is None or not steered.automatic:
            self._refuse(error, name)
        if steered is not None:
            self._steers_failed(
                steered,
                ProtocolError(
                    "successor_creation_failed", f"The successor failed: {error.message}"
                ),
            )

    def _rendered(self, rendering: _Rendering, turn: Turn) -> None:
        """The rest of `_start`, once the new items are in the conversation."""
        lane, pending, conversation = rendering.lane, rendering.pending, rendering.conversation
        request, parent, start = pending.request, rendering.parent, rendering.start
        fields = request.response_fields_json
        if request.model is None:
            fields = fields.replace(
                '"model":null', '"model":' + orjson.dumps(self._model).decode(), 1
            )
        if self._sampling_defaults != API_SAMPLING:
            fields = self._engine_sampling(request, fields)
        if self._request_id is None:
            events = ResponseEvents(fields, stream_id=lane.name, request_id=new_id("req_"))
            request_id = events.request_id
        else:
            events = ResponseEvents(fields, stream_id=lane.name)
            request_id = self._request_id
        requests_log.info("response %s request %s", events.response_id, request_id)
        peer_prompt = (
            None
            if self._baseline is None
            else self._baseline.render_request(events.response_id, request)
        )
        root = rendering.root or events.response_id
        key = self._next_key
        self._next_key += 1
        active = _Active(
            key=key,
            lane=lane,
            request=request,
            events=events,
            conversation=conversation,
            parser=conversation.parser(),
            turn=turn,
            parent=parent,
            evicts_parent=rendering.evicts_parent,
            overhead_ns=0,
            root=root,
        )
        if not request.generate:
            active.overhead_ns = pending.parse_ns + self._clock() - start
            self._warm_up(active)
            return
        lane.active = active
        self._active[key] = active
        self._actions.append(events.lifecycle("response.created", "in_progress"))
        self._actions.append(events.lifecycle("response.in_progress", "in_progress"))
        threshold = request.compact_threshold
        if threshold is not None and turn.prompt_tokens > threshold and peer_prompt is None:
            # The prompt passed the client's threshold: the engine summarizes first, and
            # the turn then runs on the summary (`_summarized`).
            summary = self._summary_turn(request, lane)
            if isinstance(summary, ProtocolError):
                message = f"The conversation could not be compacted: {summary.message}"
                self._fail(active, message, Usage())
                return
            active.overhead_ns = pending.parse_ns + self._clock() - start
            self._summarize(active, summary[0], summary[1], resume=True)
            return
        prompt = conversation.prompt() if peer_prompt is None else peer_prompt
        active.overhead_ns = pending.parse_ns + self._clock() - start
        self._generate(active, prompt)

    def _engine_sampling(self, request: CreateRequest, fields: str) -> str:
        """`fields` echoing the engine's own defaults where the request set no sampling
        (the core echoes the API's). Only for engines with defaults of their own (the
        llama engine), whose turns take milliseconds: one parse of the fields is noise."""
        if request.temperature is not None and request.top_p is not None:
            return fields
        echoed = orjson.loads(fields)
        temperature, top_p = self._sampling_defaults
        if request.temperature is None:
            echoed["temperature"] = temperature
        if request.top_p is None:
            echoed["top_p"] = top_p
        return orjson.dumps(echoed).decode()

    def _sampling(self, request: CreateRequest, prompt_tokens: int, limit: int | None) -> Sampling:
        budget = self._context_window - prompt_tokens
        max_tokens = request.max_output_tokens if limit is None else limit
        return Sampling(
            max_output_tokens=budget if max_tokens is None else min(max_tokens, budget),
            temperature=request.temperature,
            top_p=request.top_p,
            stop_tokens=self._stop_tokens,
        )

    def conversation_for(self, request: CreateRequest) -> Conversation:
        """The conversation `request` would extend (`POST /v1/responses/input_tokens`
        counts its prompt there: on a cached chain, only the new items are rendered).
        Raises ProtocolError for a refused request or a missed `previous_response_id`."""
        if request.error is not None:
            raise ProtocolError.from_core(request.error)
        chain = self._chain(request.previous_response_id, self._lanes[None])
        if isinstance(chain, ProtocolError):
            raise chain
        return chain[0]

    # ---------------------------------------------------------------- compaction

    def receive_compact(self, request: CreateRequest) -> None:
        """`POST /v1/responses/compact` (its body parsed as a request): the engine
        summarizes the conversation (the chain of `previous_response_id`, then the
        input); the one frame out is the `response.compaction` object, or an error."""
        if self.closed:
            return
        if request.error is not None:
            self._refuse(ProtocolError.from_core(request.error))
            return
        lane = self._lanes[None]
        parent = request.previous_response_id
        summary = self._summary_turn(request, lane)
        if isinstance(summary, ProtocolError):
            self._refuse(summary)
            return
        conversation, turn, root = summary
        events = ResponseEvents(request.response_fields_json)
        active = _Active(
            key=self._next_key,
            lane=lane,
            request=request,
            events=events,
            conversation=conversation,
            parser=conversation.parser(),
            turn=turn,
            parent=parent,
            evicts_parent=False,
            overhead_ns=0,
            root=root or events.response_id,
        )
        self._next_key += 1
        lane.active = active
        self._active[active.key] = active
        self._summarize(active, conversation, turn, resume=False)

    def _summary_turn(
        self, request: CreateRequest, lane: _Lane
    ) -> tuple[Conversation, Turn, str | None] | ProtocolError:
        """The summarization of `request`'s conversation (its parent's chain and its
        input, then the instruction to summarize) rendered for the engine, and the
        chain's root; or why not."""
        chain = self._chain(request.previous_response_id, lane)
        if isinstance(chain, ProtocolError):
            return chain
        conversation, _, root = chain
        try:
            summarize = summarizing(request, self._compactor.summary_tokens, self.limits.request)
            return conversation, conversation.extend(summarize), root
        except CoreError as e:
            return ProtocolError.from_core(e)

    def _summarize(
        self, active: _Active, conversation: Conversation, turn: Turn, *, resume: bool
    ) -> None:
        """Hand the engine the summarization; `_summarized` takes it from there."""
        compaction = Summary(new_id("cmp_"), resume)
        if resume:
            compaction.before = active.conversation, active.turn
        active.compaction = compaction
        active.conversation, active.parser, active.turn = conversation, conversation.parser(), turn
        if resume:
            self._actions.append(
                active.events.event(
                    "response.compaction.compacting", item_id=compaction.item_id, output_index=0
                )
            )
        self._generate(active, conversation.prompt(), self._compactor.summary_tokens)

    def _summarized(self, active: _Active, compaction: Summary) -> None:
        """The engine wrote the summary: seal it; then either answer /compact, or run
        the turn on a new conversation holding the summary in place of the history."""
        compaction.feed(active.parser.finish()[0])
        spent = self._usage(active)
        item = compaction.item(self._compactor)
        active.compaction = None
        if not compaction.resume:
            resource = compacted_resource(item, spent)
            self._actions.append(resource)
            self._book(active, resource, spent, "completed", compaction.item_id)
            self._release(active)
            return
        events = active.events
        self._actions.append(events.item_added(0, item))
        self._actions.append(events.item_done(0, item))
        events.index_offset = 1
        # The model turn's own items follow (an interrupt keeps them, a wait looks there).
        active.first_item = len(events.output)
        conversation = Conversation(
            self._format, context_window=self._context_window, policy=self._policy
        )
        try:
            turn = conversation.extend(resumed(active.request, compaction.text))
        except CoreError as e:
            self._fail(active, f"The compacted conversation failed: {e.message}", spent)
            return
        active.conversation, active.parser, active.turn = conversation, conversation.parser(), turn
        active.spent = spent
        # New engine work, under a key of its own: the transport forgets the summary's
        # key when that task ends, which would leave this one out of a cancel's reach.
        active.key = self._next_key
        self._next_key += 1
        self._active[active.key] = active
        self._generate(active, conversation.prompt())

    def _generate(self, active: _Active, prompt: Prompt, limit: int | None = None) -> None:
        """Hand the engine `prompt`, routed by the session or the chain's root so every
        turn of a conversation (its summarization too) lands where its cache is."""
        sampling = self._sampling(active.request, len(prompt), limit)
        self._actions.append(
            Generate(active.key, prompt, sampling, self._session_key or active.root)
        )

    def _warm_up(self, active: _Active) -> None:
        """`generate: false`: the state is rendered and cached under a fresh id, with
        an empty output and zero usage. It never takes its lane (it ends inside
        `_pump`), except while its commit runs."""
        checkpoint = active.conversation.checkpoint()
        self._actions.append(active.events.lifecycle("response.created", "in_progress"))
        self._terminal(active, "response.completed", "completed", Usage(), checkpoint)

    # ---------------------------------------------------------------- endings

    def _usage(self, active: _Active) -> Usage:
        """The response's usage so far: every model turn's prompt and output."""
        turn = active.current_turn
        # A new conversation renders its fixed prefix in this very turn: nothing of its
        # prompt came from the cache, whatever the core kept between its own steps (a
        # compacted turn runs on a new conversation too). A resumed model turn extends
        # the response's own tokens.
        spent = active.spent
        fresh = active.resumed is None and (active.parent is None or spent is not None)
        cached = 0 if fresh else turn.cached_tokens
        usage = Usage(
            input_tokens=turn.prompt_tokens,
            cached_tokens=cached,
            cache_write_tokens=turn.prompt_tokens - cached,
            output_tokens=active.parser.output_tokens,
            reasoning_tokens=active.parser.reasoning_tokens,
        )
        return usage if spent is None else usage + spent

    def _terminal(
        self,
        active: _Active,
        kind: str,
        status: str,
        usage: Usage,
        checkpoint: Checkpoint | None,
        *,
        error: dict[str, str] | None = None,
        incomplete_reason: str | None = None,
    ) -> None:
        closed = False
        if active.injected:
            checkpoint, closed = self._commit_held(active, checkpoint)
        stored = self._stores(active)
        if stored and active.segments and not closed:
            # The last model turn of a response that took input while it ran.
            active.segments.append(
                self._turn_segment(active, [])
                if checkpoint is not None
                else TurnSegment(len(active.events.output), [], [])
            )
        events = active.events
        final = events.response_json(
            status, usage=usage, error=error, incomplete_reason=incomplete_reason
        )
        ending = _Ending(
            active,
            kind,
            checkpoint,
            Finished(
                events.response_id,
                active.request,
                final,
                checkpoint,
                usage,
                self._principal,
                active.overhead_ns,
                active.turn,
                status=status,
                error=error,
                created_at=events.created_at,
                failure=None if error is None else error["code"],
                segments=tuple(active.segments),
            ),
        )
        if stored:
            active.lane.active = None
            active.lane.ending = self._ending[active.key] = ending
            self._actions.append(Persist(active.key, ending.finished))
            return
        self._conclude(ending)
        # A warm-up never took its lane (it ends inside `_pump`): nothing to free.
        if active.lane.active is active:
            self._release(active)

    def _conclude(self, ending: _Ending) -> None:
        """Send the terminal event (the Response as committed), cache the new state and
        report it."""
        active = ending.active
        events = active.events
        self._actions.append(events.wrap(ending.kind, ending.finished.response_json))
        if ending.checkpoint is not None:
            self.cache.put(events.response_id, ending.checkpoint, active.lane.name, active.root)
        self._report(ending.finished)
        self._after_steers(active, ending)

    # ---------------------------------------------------------------- steering

    def _after_steers(self, active: _Active, ending: _Ending) -> None:
        """After a terminal event: the steers its response accepted start the automatic
        successor, or stay queued while it waits for client tool output."""
        lane, events = active.lane, active.events
        # Calls answered by injected output inside the response wait for nothing.
        open_calls = set(active.conversation.open_call_ids)
        required = [
            {"type": "function_call_output", "call_id": item["call_id"], "name": item["name"]}
            for item in events.output
            if item["type"] == "function_call" and item["call_id"] in open_calls
        ]
        replaced = self._awaiting.get(lane.name)
        if replaced is not None:
            # Steers queued for the lane's previous response can no longer be taken.
            self._release_steers(replaced.steers)
        if ending.checkpoint is not None and required and ending.finished.status == "completed":
            self._awaiting[lane.name] = _Awaiting(events, required)
        else:
            self._awaiting.pop(lane.name, None)
        if not active.steers:
            return
        if ending.checkpoint is None:
            error = ProtocolError("response_not_active", "The steered response did not finish.")
            self._release_steers(active.steers)
            self._steers_failed(_Steered(events, active.steers, True), error)
        elif lane.name in self._awaiting:
            self._steers_pending(self._awaiting[lane.name], active.steers)
        else:
            self._release_steers(active.steers)
            frame = successor_frame(
                active.request.response_fields_json, events.response_id, active.steers, lane.name
            )
            successor = parse_event(frame, self.limits.request)
            steered = _Steered(events, active.steers, True)
            if not isinstance(successor, CreateRequest) or successor.error is not None:
                self._steers_failed(
                    steered,
                    ProtocolError(
                        "successor_creation_failed", "The successor is not a valid request."
                    ),
                )
                return
            # First on its lane: the successor runs before anything the client queued.
            lane.queue.appendleft(_Pending(successor, 0, 0, steered=steered))

    def _steers_pending(self, awaiting: _Awaiting, steers: list[Steer]) -> None:
        awaiting.steers.extend(steers)
        self._announce_pending(awaiting.events, steers, awaiting.required)

    def _announce_pending(
        self, events: ResponseEvents, steers: list[Steer], required: list[dict[str, str]]
    ) -> None:
        for steer in steers:
            self._actions.append(
                events.event(
                    "response.steer.pending",
                    steer=steer.wire(),
                    reason="waiting_for_required_input",
                    required_input=required,
                )
            )

    def _steers_failed(self, steered: _Steered, error: ProtocolError) -> None:
        for steer in steered.steers:
            self._steer_failed(
                steered.target, steer.previous_response_id, steer.input, error, steer.id
            )

    def _steer_failed(
        self,
        events: ResponseEvents | None,
        target: object,
        raw_input: object,
        error: ProtocolError,
        steer_id: str | None = None,
    ) -> None:
        steer: dict[str, object] = {
            "previous_response_id": target if isinstance(target, str) else "",
            "input": raw_input if isinstance(raw_input, str | list) else "",
        }
        if steer_id is not None:
            steer["id"] = steer_id
        fields: dict[str, object] = {
            "error": {
                "type": "invalid_request_error",
                "code": error.code,
                "message": error.message,
            },
            "steer": steer,
        }
        if events is None:
            # No response to number it within: it is the first event of its own.
            self._actions.append(
                orjson.dumps({"type": "response.steer.failed", **fields, "sequence_number": 0})
            )
        else:
            self._actions.append(events.event("response.steer.failed", **fields))

    def _steer(self, event: dict[str, Any], size: int) -> None:
        """`response.steer`: accepted for a running response (it stops at its next
        item boundary, a successor follows) or one waiting for tool output (queued for
        the client's continuation); refused with `response.steer.failed` otherwise."""
        target, raw_input = event.get("previous_response_id"), event.get("input")
        try:
            steer = parse_steer(event, size)
        except ProtocolError as e:
            self._steer_failed(None, target, raw_input, e)
            return
        running = self._running(steer.previous_response_id)
        awaiting = next(
            (
                a
                for a in self._awaiting.values()
                if a.events.response_id == steer.previous_response_id
            ),
            None,
        )
        held = running.steers if running is not None else awaiting.steers if awaiting else None
        events = running.events if running is not None else awaiting.events if awaiting else None
        if held is None or events is None:
            self._steer_failed(
                None, target, raw_input, self._not_running(steer.previous_response_id)
            )
            return
        if len(held) >= MAX_PENDING_STEERS:
            error = ProtocolError(
                "too_many_pending_steers",
                f"Response '{steer.previous_response_id}' already holds "
                f"{MAX_PENDING_STEERS} steers.",
            )
            self._steer_failed(events, target, raw_input, error)
            return
        try:
            self._hold(steer.size)
        except ProtocolError as e:
            self._steer_failed(events, target, raw_input, e)
            return
        self._actions.append(events.event("response.steer.accepted", steer=steer.wire()))
        if running is not None:
            running.steers.append(steer)
            if running.key in self._waiting:
                # Long-running mode: it goes into the turn the injected output resumes.
                self._announce_pending(events, [steer], self._required(running))
        elif awaiting is not None:
            self._steers_pending(awaiting, [steer])

    def _not_running(self, response_id: str) -> ProtocolError:
        """Why `response_id` cannot be steered or interrupted."""
        if any(e.active.events.response_id == response_id for e in self._ending.values()):
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

    # ---------------------------------------------------------------- the long-running response

    def _wait(self, active: _Active, calls: list[dict[str, Any]]) -> None:
        """Long-running mode: the model turn ended calling client tools. The response
        stays open, holding its lane (and the engine session its sequence), until
        `response.inject` answers every call, or the idle timeout, a cancel, an
        interrupt or the connection's end stops it."""
        answered = self._held_answers(active)
        active.waiting = {
            item["call_id"]: item["name"] for item in calls if item["call_id"] not in answered
        }
        if self._expiring or self._draining:
            # It could not resume on this connection: outputs it holds are committed.
            self._end_waiting(active, CONNECTION_CLOSING)
            return
        self._waiting[active.key] = active
        if not active.waiting:
            # Every call was answered while the turn still sampled: it resumes at once.
            try:
                self._resume(active)
                return
            except ProtocolError as e:
                for injection in active.injected:
                    self._inject_failed(active, active.events.response_id, injection.input, e)
                self._dequeued(sum(injection.size for injection in active.injected))
                active.injected = []
                active.waiting = {item["call_id"]: item["name"] for item in calls}
        self._actions.append(Wait(active.key, self._inject_idle_timeout))
        self._announce_pending(active.events, active.steers, self._required(active))

    def _required(self, active: _Active) -> list[dict[str, str]]:
        return [
            {"type": "function_call_output", "call_id": call_id, "name": name}
            for call_id, name in active.waiting.items()
        ]

    def wait_expired(self, key: int) -> None:
        """The idle timeout of `Wait(key)`: a response still waiting for tool output ends
        `response.incomplete` (reason `idle_timeout`)."""
        active = self._waiting.get(key)
        if active is not None:
            self._end_waiting(active, "idle_timeout")

    def _end_waiting(self, active: _Active, reason: str) -> None:
        """A response waiting for tool output ends `response.incomplete` with `reason`. It
        stays continuable: the outputs injected so far are committed, the other calls are
        open, and a `response.create` with their outputs continues it."""
        if self._waiting.pop(active.key, None) is not None:
            self._actions.append(Cancel(active.key))  # its idle timer
        if active.steers:
            self._release_steers(active.steers)
            self._steers_failed(
                _Steered(active.events, active.steers, True),
                ProtocolError("response_not_active", "The response ended waiting for tool output."),
            )
            active.steers = []
        self._terminal(
            active,
            "response.incomplete",
            "incomplete",
            self._usage(active),
            active.conversation.checkpoint(),
            incomplete_reason=reason,
        )

    def _receive_injection(self, append: AppendEvent, event: dict[str, Any], size: int) -> None:
        """`response.inject` (or `response.append`): tool outputs for a waiting response,
        committed all or nothing (`response.inject.created`); the response resumes once no
        call waits. Refused with `response.inject.failed` and the input returned."""
        response_id = event.get("response_id")
        target: _Active | None = None
        try:
            if response_id is None and event.get("type") == "response.append":
                target = self._only_waiting()
            elif not isinstance(response_id, str):
                raise ProtocolError("invalid_input", "response_id must be a response id.")
            else:
                target = self._running(response_id)
                if target is None:
                    raise self._not_waiting(response_id)
            injection = parse_injection(append, event, size)
            answered = answer(self._answerable(target), injection)
            self._hold(size)
        except ProtocolError as e:
            self._inject_failed(target, response_id, event.get("input"), e)
            return
        assert target is not None, "found above, or refused"
        target.injected.append(injection)
        if target.key not in self._waiting:
            # Its model turn still samples: held until the turn ends calling (`_wait`).
            self._actions.append(self._inject_created(target))
            return
        names = {call_id: target.waiting.pop(call_id) for call_id in answered}
        if target.waiting:
            self._actions.append(self._inject_created(target))
            return
        try:
            self._resume(target)
        except ProtocolError as e:
            # Nothing was committed: the calls wait for this output again.
            target.injected.pop()
            target.waiting.update(names)
            self._dequeued(size)
            self._inject_failed(target, response_id, event.get("input"), e)
            return
        self._actions.append(self._inject_created(target))

    def _held_answers(self, active: _Active) -> set[str]:
        """The call ids the injections `active` holds answer."""
        return {item["call_id"] for injection in active.injected for item in injection.items}

    def _answerable(self, target: _Active) -> dict[str, str]:
        """The calls an injection may answer now: the ones the response waits for; while
        its model turn still samples, the calls it completed so far that no held
        injection answers (a client may answer a call as soon as its item is done)."""
        if target.key in self._waiting:
            return target.waiting
        held = self._held_answers(target)
        return {
            item["call_id"]: item["name"]
            for item in target.events.output[target.first_item :]
            if item["type"] == "function_call" and item["call_id"] not in held
        }

    def _inject_created(self, target: _Active) -> bytes:
        events = target.events
        return events.event("response.inject.created", response_id=events.response_id)

    def _only_waiting(self) -> _Active:
        """`response.append` without an id continues the connection's waiting response."""
        waiting = list(self._waiting.values())
        if len(waiting) == 1:
            return waiting[0]
        if not waiting:
            raise ProtocolError("response_not_found", "No response waits for tool output.")
        raise ProtocolError(
            "invalid_input",
            f"{len(waiting)} responses wait for tool output: name one with response_id.",
            "response_id",
        )

    def _not_waiting(self, response_id: str) -> ProtocolError:
        """Why `response_id` takes no injection, in the codes of `response.inject.failed`."""
        error = self._not_running(response_id)
        if error.code == "response_not_active":
            return ProtocolError("response_already_completed", error.message, error.param)
        return error

    def _inject_failed(
        self, target: _Active | None, response_id: object, raw_input: object, error: ProtocolError
    ) -> None:
        fields: dict[str, object] = {
            "response_id": response_id if isinstance(response_id, str) else "",
            "input": returned_input(raw_input),
            "error": {"code": error.code, "message": error.message},
        }
        if target is None:
            # No response to number it within: it is the first event of its own.
            self._actions.append(
                orjson.dumps({"type": "response.inject.failed", **fields, "sequence_number": 0})
            )
        else:
            if not fields["response_id"]:
                fields["response_id"] = target.events.response_id
            self._actions.append(target.events.event("response.inject.failed", **fields))

    def _resume(self, active: _Active) -> None:
        """Every call is answered: append the injected outputs (then any steering input
        accepted meanwhile) to the conversation's tokens, validated as delta input and
        rendered alone, and sample the next model turn of the same response. Raises
        `ProtocolError` `invalid_input` (the conversation unchanged) if the core refuses
        the outputs."""
        items = [item for injection in active.injected for item in injection.items]
        items += [item for steer in active.steers for item in steer.items]
        spent = self._usage(active)
        limit = active.request.max_output_tokens
        left = None if limit is None else max(limit - spent.output_tokens, 0)
        segment = self._segment(active, items)
        try:
            turn = self._commit_input(active, items, left or None)
        except CoreError as e:
            raise ProtocolError("invalid_input", e.message, "input") from e
        if segment is not None:
            active.segments.append(segment)
        self._dequeued(sum(injection.size for injection in active.injected))
        self._release_steers(active.steers)
        active.injected, active.steers = [], []
        del self._waiting[active.key]
        self._actions.append(Cancel(active.key))  # its idle timer
        active.key = self._next_key
        self._next_key += 1
        self._active[active.key] = active
        active.spent, active.resumed = spent, turn
        active.parser = active.conversation.parser()
        active.first_item = len(active.events.output)
        active.events.next_turn()
        self._generate(active, active.conversation.prompt(), left)

    def _commit_input(
        self, active: _Active, items: list[dict[str, Any]], max_output_tokens: int | None
    ) -> Turn:
        """Append `items` to the response's conversation after its last model turn,
        validated as delta input and rendered alone, under the response's own settings
        (`max_output_tokens`: what is left of its budget). Raises CoreError, the
        conversation unchanged."""
        frame = resume_frame(active.request.response_fields_json, items, max_output_tokens)
        request = parse_event(frame, self.limits.request)
        assert isinstance(request, CreateRequest), "a response.create with new input"
        if request.error is not None:
            raise request.error
        return active.conversation.extend(request)

    def _stores(self, active: _Active) -> bool:
        """`active` is committed to the store before its terminal event."""
        return self._durable and active.request.store

    def _segment(self, active: _Active, then: list[dict[str, Any]]) -> TurnSegment | None:
        """The current model turn of a stored response, followed by `then` (None when
        the response is not stored)."""
        if not self._stores(active):
            return None
        return self._turn_segment(active, then)

    def _turn_segment(self, active: _Active, then: list[dict[str, Any]]) -> TurnSegment:
        ids = active.conversation.prompt().tokens_from(active.current_turn.prompt_tokens)
        return TurnSegment(len(active.events.output), ids, then)

    def _commit_held(
        self, active: _Active, checkpoint: Checkpoint | None
    ) -> tuple[Checkpoint | None, bool]:
        """The response ends holding injected outputs it acknowledged (answers to calls
        it completed, while other calls waited or its turn still sampled): they are
        committed after its last model turn, so the calls it is continued with are
        answered. Not when it cannot be continued (`checkpoint` None): they end with it.
        Returns the checkpoint to end with, and whether the outputs closed the turn."""
        held = [item for injection in active.injected for item in injection.items]
        self._dequeued(sum(injection.size for injection in active.injected))
        active.injected = []
        if checkpoint is None:
            return None, False
        segment = self._segment(active, held)
        try:
            self._commit_input(active, held, None)
        except CoreError as e:
            # Checked against the core when they arrived: only the context can refuse them.
            log.warning(
                "outputs held by %s not committed: %s", active.events.response_id, e.message
            )
            return checkpoint, False
        if segment is not None:
            active.segments.append(segment)
        return active.conversation.checkpoint(), True

    def _fail(self, active: _Active, message: str, usage: Usage) -> None:
        if active.evicts_parent and active.parent is not None:
            self.cache.evict(active.parent)
        error = {"code": "server_error", "message": message}
        self._terminal(active, "response.failed", "failed", usage, None, error=error)

    def _cancel(self, event: CancelEvent) -> None:
        target: _Active | None = None
        if event.response_id is not None:
            target = self._running(event.response_id)
        else:
            lane = self._lanes.get(event.stream_id)
            target = lane.active if lane is not None else None
        if target is None:
            lane = self._lanes.get(event.stream_id) if event.response_id is None else None
            if lane is not None and lane.rendering is not None:
                lane.rendering.cancelled = True
            # Otherwise already finished: the cancel crossed the terminal event on the wire.
            return
        self._cancel_active(target)

    def _cancel_active(self, target: _Active) -> None:
        self._stop(target)
        # Items still open are dropped: the cancelled response reports what completed.
        self._terminal(target, "response.incomplete", "cancelled", self._usage(target), None)

    def _stop(self, target: _Active) -> None:
        """`target` leaves the running responses: its engine work (or its idle timer,
        if it waits for tool output) stops."""
        if self._active.pop(target.key, None) is None:
            del self._waiting[target.key]
        self._actions.append(Cancel(target.key))

    def _running(self, response_id: str) -> _Active | None:
        """The response sampling, or waiting open for tool output, with this id."""
        for responses in (self._active, self._waiting):
            for active in responses.values():
                if active.events.response_id == response_id:
                    return active
        return None

    def _interrupt(self, event: dict[str, Any]) -> None:
        """Codex's `response.interrupt` (protocol.md section 8): the response stops at
        once, its partial items are discarded, and it stays continuable with only its
        completed items."""
        response_id = event.get("response_id")
        if not isinstance(response_id, str):
            self._refuse(
                ProtocolError(
                    "missing_required_parameter", "response_id is required.", "response_id"
                )
            )
            return
        if event.get("mode", "discard_partial_items") != "discard_partial_items":
            self._refuse(
                ProtocolError("invalid_value", "mode must be 'discard_partial_items'.", "mode")
            )
            return
        target = self._running(response_id)
        if target is None:
            # Crossed its terminal event on the wire, or never existed here: an error,
            # never silence, so a client waiting for an answer does not hang.
            self._refuse(self._not_running(response_id))
            return
        waiting = target.key in self._waiting
        self._stop(target)
        events = target.events
        self._actions.append(events.event("response.interrupt.accepted", response_id=response_id))
        completed = {item["id"] for item in events.output}
        for index, item_id in sorted(events.open_items(completed)):
            self._actions.append(
                events.event(
                    "response.output_item.interrupted", output_index=index, item_id=item_id
                )
            )
        usage = self._usage(target)
        if target.compaction is not None and target.compaction.before is not None:
            # Interrupted while summarizing: the turn as rendered before (no instruction
            # to summarize) is what stays warm, as the store rebuilds it.
            target.conversation, target.turn = target.compaction.before
        # A waiting response's model turn is committed already: nothing is partial.
        checkpoint = (
            target.conversation.checkpoint() if waiting else self._completed_checkpoint(target)
        )
        self._terminal(
            target,
            "response.incomplete",
            "incomplete",
            usage,
            checkpoint,
            incomplete_reason="interrupted",
        )

    def _completed_checkpoint(self, active: _Active) -> Checkpoint | None:
        """The conversation with only the model turn's completed items as its output,
        rendered as the model would have sampled them (the partial tokens are gone); the
        items are the ones the client saw, so a function call keeps its call id."""
        texts: dict[str, list[str]] = {"message": [], "reasoning": []}
        calls = []
        completed = active.events.output[active.first_item :]
        for item in completed:
            if item["type"] == "function_call":
                calls.append((item["name"], item["arguments"]))
            else:
                texts[item["type"]].append(item["content"][0]["text"])
        # Several items of one kind (a preamble, then more text) become one.
        text, reasoning = ("\n\n".join(texts[kind]) or None for kind in ("message", "reasoning"))
        try:
            active.conversation.commit_items(
                orjson.dumps(completed).decode(),
                self._format.completion_tokens(text=text, reasoning=reasoning, calls=calls),
            )
        except CoreError as e:
            log.warning(
                "interrupted response %s is not continuable: %s", active.events.response_id, e
            )
            return None
        return active.conversation.checkpoint()

    def _release(self, active: _Active) -> None:
        active.lane.active = None
        self._lane_freed(active.lane)

    def _lane_freed(self, lane: _Lane) -> None:
        if lane.free and lane.queue:
            self._ready.append(lane)
        self._pump()
        self._finish_expiry()

    def _report(self, finished: Finished) -> None:
        if self._baseline is not None:
            self._baseline.commit(finished.response_id, finished.response_json)
        if self._observer is not None:
            self._observer.finished(finished)

    def _book(
        self,
        active: _Active,
        response_json: bytes,
        usage: Usage,
        status: str = "cancelled",
        response_id: str | None = None,
    ) -> None:
        """Engine work that ends without a terminal event (a client gone mid-turn, a
        `/responses/compact` summary) is booked all the same, to the key that asked:
        the prompt was prefilled and the tokens sampled. Nothing is cached or stored."""
        if self._observer is None:
            return
        self._observer.finished(
            Finished(
                response_id or active.events.response_id,
                active.request,
                response_json,
                None,
                usage,
                self._principal,
                active.overhead_ns,
                active.turn,
                status=status,
                created_at=active.events.created_at,
            )
        )

    def _lifetime_error(self) -> ProtocolError:
        return ProtocolError(
            "websocket_connection_limit_reached",
            "This connection reached its lifetime limit; open a new connection to continue.",
        )

    def _finish_expiry(self) -> None:
        if not self._expiring or self.in_flight or self.closed:
            return
        refused = False
        for lane in self._lanes.values():
            while lane.queue:
                pending = lane.queue.popleft()
                self._refuse_turn(pending, self._lifetime_error(), lane.name)
                refused = refused or pending.steered is None or not pending.steered.automatic
        if not refused:
            self._refuse(self._lifetime_error())
        self._ready.clear()
        self._dequeued(self._queued_bytes)
        self.closed = True
        self._actions.append(Close(1000, "connection lifetime reached"))
