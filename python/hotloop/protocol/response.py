"""One response on a connection, from the start of its turn to its terminal event and
commit: `Rendering` (its start: the new items rendered, inline or off the event loop,
then `response.created`), `Response` (the engine samples it: parser events, the end of
its output, its usage, its terminal Response) and `Ending` (its terminal event waits for
the store's commit). What every turn of a connection is served with is `port.py`'s `Settings`.

A response holds its lane from its start to its terminal event. The connection hands
it engine results and client events by key; what a response does to the connection
goes through the connection's own services (its actions, its byte bounds, its cache,
its lanes), a `ResponsePort`: it never holds the connection. Where it is in its life is
its `state` (`state.py`'s table). Steering, the long-running response, compaction and
the MCP loop change a response through their units (`steering.py`, `injection.py`,
`summarization.py`, `mcp_loop.py`); this module does not know their rules: when a model
turn ends in one of their states (`SUMMARIZING`, `CALLING_MCP`, `WAITING_FOR_TOOLS`),
the connection hands the response to the unit that owns it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from hotloop._core import (
    Checkpoint,
    Conversation,
    CoreError,
    CreateRequest,
    OutputParser,
    Prompt,
    Turn,
    parse_event,
)
from hotloop.engines.base import API_SAMPLING, EngineError, Sampling, Serving
from hotloop.events import ResponseEvents, Usage, new_id
from hotloop.protocol.actions import Cancel, Finished, Generate, Later, Persist, TurnSegment
from hotloop.protocol.diagnostics import diagnose
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.history import NOWHERE, Start, end_mark
from hotloop.protocol.port import Port
from hotloop.protocol.state import State, advance
from hotloop.protocol.tool_outputs import resume_frame

if TYPE_CHECKING:
    from hotloop.protocol.compaction import Summary
    from hotloop.protocol.connection_cache import ConversationStart, Mark
    from hotloop.protocol.lanes import Lane, Pending
    from hotloop.protocol.mcp_tools import McpTurn
    from hotloop.protocol.steers import Steer
    from hotloop.protocol.tool_outputs import Injection

# One line per response: its id and the request id the client saw, to match reports.
requests_log = logging.getLogger("hotloop.requests")
log = logging.getLogger("hotloop.protocol")

STORE_UNAVAILABLE = "store_unavailable"
ITEM_DONE = frozenset(("message_done", "reasoning_done", "call_done"))


class ResponsePort(Port, Protocol):
    """What a response (and a unit that moves responses) may ask of its connection,
    besides the services of every unit: the running responses by the key of their work,
    and what the connection does when a turn is refused or a response concluded."""

    generating: dict[int, Response]
    """Responses with engine work (or MCP calls) out, by its key."""
    waiting: dict[int, Response]
    """Responses waiting, open, for client tool output, by their last model turn's key."""
    ending: dict[int, Ending]
    """Responses whose terminal event waits for their `Persist` work."""

    def running(self, response_id: str) -> Response | None:
        """The response sampling, or waiting open for tool output, with this id."""
        ...

    def not_running(self, response_id: str) -> ProtocolError:
        """Why `response_id` cannot be steered, interrupted or injected into."""
        ...

    def refuse_turn(self, pending: Pending, error: ProtocolError, name: str | None) -> None:
        """A turn refused before generation (the steering input it carried returned)."""
        ...

    def concluded(self, response: Response, ending: Ending) -> None:
        """`response`'s terminal event went out (what its steers start follows)."""
        ...


@dataclass
class Rendering:
    """A turn waiting for its `Render` work; it holds its lane like an active turn."""

    port: ResponsePort
    lane: Lane
    pending: Pending
    conversation: Conversation
    parent: str | None
    evicts_parent: bool
    start: int
    root: str | None
    """The chain's first response id; None for a new chain (it is the new response)."""
    cancelled: bool = False
    conversation_start: ConversationStart | None = None
    """The conversation state it starts from (`CachedResponse.start`)."""
    seen: Start = NOWHERE
    """Where it starts in content: the state of its history it continues, if any, and
    its prompt's address (`history.py`)."""

    def refused(self, error: CoreError | ProtocolError) -> None:
        """The core refused the new items (or the approvals they answer were taken
        meanwhile): the request is refused."""
        if self.evicts_parent and self.parent is not None:
            self.port.cache.evict(self.parent)
        if isinstance(error, CoreError):
            error = ProtocolError.from_core(error)
        self.port.refuse_turn(self.pending, error, self.lane.name)

    def overhead_ns(self) -> int:
        """The time the turn took before its engine work: its parse and its render."""
        return self.pending.parse_ns + self.port.clock() - self.start

    def rendered(self, turn: Turn) -> Response:
        """The new items are in the conversation: the response opens, holding the lane,
        among the connection's running responses (it announces itself, `announce`, once
        the connection decided what it runs first)."""
        port, settings = self.port, self.port.settings
        lane, pending, conversation = self.lane, self.pending, self.conversation
        request = pending.request
        fields = request.response_fields_json
        if request.model is None:
            fields = fields.replace(
                '"model":null', '"model":' + orjson.dumps(settings.model).decode(), 1
            )
        if settings.sampling_defaults != API_SAMPLING:
            fields = engine_sampling(request, fields, settings.sampling_defaults)
        if request.conversation is not None:
            echo = orjson.dumps({"id": request.conversation}).decode()
            fields = f'{fields[:-1]},"conversation":{echo}}}'

        compared_id = request.comparison_response_id
        if compared_id is not None:
            cached = port.cache.get(compared_id)
            diagnostics = diagnose(
                settings.conversation(),
                request,
                conversation.prompt(),
                turn,
                None if cached is None else cached.checkpoint,
            )
            fields = (
                fields[:-1]
                + ',"prompt_cache_diagnostics":'
                + orjson.dumps(diagnostics).decode()
                + "}"
            )
        background = request.background
        if settings.request_id is None:
            events = ResponseEvents(
                fields, stream_id=lane.name, request_id=new_id("req_"), background=background
            )
            request_id = events.request_id
        else:
            events = ResponseEvents(fields, stream_id=lane.name, background=background)
            request_id = settings.request_id
        response = Response.open(self, events, turn)
        # The prompt's state as rendered: the engine's output may extend the
        # conversation before `_kept` runs.
        keeps = self.seen.mark is not None and port.history is not None
        kept = conversation.checkpoint() if keeps else None
        port.emit(Later(partial(self._kept, events.response_id, request_id, kept, response.root)))
        lane.active = response
        port.generating[response.key] = response
        return response

    def _kept(
        self, response_id: str, request_id: str | None, prompt: Checkpoint | None, root: str
    ) -> None:
        """After the turn's engine request is out (`Later`): its log line, and its
        prompt's state under its address for whole-history requests (`history.py`)."""
        requests_log.info("response %s request %s", response_id, request_id)
        history, mark = self.port.history, self.seen.mark
        if prompt is not None and history is not None and mark is not None:
            history.keep(mark, prompt, root)
            history.remember(self.pending.request)


def engine_sampling(request: CreateRequest, fields: str, defaults: tuple[float, float]) -> str:
    """`fields` echoing the engine's own defaults where the request set no sampling
    (the core echoes the API's). Only for engines with defaults of their own (the
    llama engine), whose turns take milliseconds: one parse of the fields is noise."""
    if request.temperature is not None and request.top_p is not None:
        return fields
    echoed = orjson.loads(fields)
    temperature, top_p = defaults
    if request.temperature is None:
        echoed["temperature"] = temperature
    if request.top_p is None:
        echoed["top_p"] = top_p
    return orjson.dumps(echoed).decode()


@dataclass
class Response:
    """A response the engine samples (or that waits, open, for tool output)."""

    port: ResponsePort
    key: int
    lane: Lane
    request: CreateRequest
    events: ResponseEvents
    conversation: Conversation
    parser: OutputParser
    turn: Turn
    parent: str | None
    evicts_parent: bool
    overhead_ns: int
    root: str
    state: State = State.OPENED
    """Where it is in its life; it moves only by `enter` (`state.py`'s table)."""
    steers: list[Steer] = field(default_factory=list)
    """Accepted steers: sampling stops at the next item boundary, a successor follows."""
    compaction: Summary | None = None
    """The summary the engine writes while `SUMMARIZING` (`conversation`, `parser` and
    `turn` are the summarization's); the turn proper starts from it afterwards."""
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
    conversation_start: ConversationStart | None = None
    """The conversation state it started from: its tokens rendered for this turn are
    not served from the cache, and its items are appended to what it read."""
    engine_cached: int | None = None
    """The prompt ids the engine said it served from its own KV cache in the current
    engine pass (earlier passes are in `spent`); None: it did not say."""
    mcp: McpTurn | None = None
    """The request's MCP servers: the calls of their tools run inside the response."""
    seen: Start = NOWHERE
    """Where it started in content (`Rendering.seen`)."""

    @classmethod
    def open(cls, rendering: Rendering, events: ResponseEvents, turn: Turn) -> Response:
        """The response of a rendered turn, starting its first model turn under a new
        key."""
        conversation = rendering.conversation
        return cls(
            port=rendering.port,
            key=rendering.port.new_key(),
            lane=rendering.lane,
            request=rendering.pending.request,
            events=events,
            conversation=conversation,
            parser=conversation.parser(),
            turn=turn,
            parent=rendering.parent,
            evicts_parent=rendering.evicts_parent,
            overhead_ns=0,
            root=rendering.root or events.response_id,
            conversation_start=rendering.conversation_start,
            mcp=rendering.pending.mcp,
            seen=rendering.seen,
        )

    def enter(self, state: State) -> None:
        """Move to `state`; raises `ImpossibleTransition` where the table leads nowhere."""
        self.state = advance(self.state, state)

    @property
    def current_turn(self) -> Turn:
        """The model turn sampling now (or last)."""
        return self.resumed or self.turn

    @property
    def stored(self) -> bool:
        """The response is committed to the store before its terminal event."""
        request = self.request
        # A conversation's turn appends its items in the same commit.
        return self.port.settings.durable and (request.store or request.conversation is not None)

    def client_calls(self) -> list[dict[str, Any]]:
        """The client function calls of the current model turn."""
        return [
            item
            for item in self.events.output[self.first_item :]
            if item["type"] == "function_call"
        ]

    def required_input(self) -> list[dict[str, str]]:
        """The tool outputs it waits for, as `required_input`."""
        return [
            {"type": "function_call_output", "call_id": call_id, "name": name}
            for call_id, name in self.waiting.items()
        ]

    # ---------------------------------------------------------------- sampling

    def announce(self) -> None:
        """`response.created` and `response.in_progress`: a background response, as
        OpenAI streams one, is created and queued first, then runs."""
        emit, events = self.port.emit, self.events
        if self.request.background:
            emit(events.lifecycle("response.created", "queued"))
            emit(events.lifecycle("response.queued", "queued"))
        else:
            emit(events.lifecycle("response.created", "in_progress"))
        emit(events.lifecycle("response.in_progress", "in_progress"))

    def prewarm(self, prompt: Prompt) -> None:
        """`generate: false` (or `prompt_cache_options.prewarm`): the engine evaluates
        `prompt` into its cache and samples nothing (`max_output_tokens` 0, each engine's
        way: docs/engines.md); `done` then completes it with an empty output."""
        self.enter(State.PREFILLING)
        self.port.emit(self.events.lifecycle("response.created", "in_progress"))
        self.generate(prompt, 0)

    def generate(self, prompt: Prompt, limit: int | None = None) -> None:
        """Hand the engine `prompt`, routed by the session header, `prompt_cache_key` or
        the chain's root so every
        turn of a conversation (its summarization too) lands where its cache is."""
        settings = self.port.settings
        request = self.request
        budget = settings.context_window - len(prompt)
        max_tokens = request.max_output_tokens if limit is None else limit
        sampling = Sampling(
            max_output_tokens=budget if max_tokens is None else min(max_tokens, budget),
            temperature=request.temperature,
            top_p=request.top_p,
            stop_tokens=settings.stop_tokens,
        )
        # The client's names for the conversation first (as HAProxy hashes them:
        # deploy/haproxy.cfg), then the chain's first response.
        route_key = settings.session_key or request.prompt_cache_key or self.root
        serving = Serving(self.events.response_id, request)
        self.port.emit(Generate(self.key, prompt, sampling, route_key, serving))

    def feed(self, ids: list[int]) -> bool:
        """Sampled ids; returns whether the engine should go on."""
        if self.state is State.SUMMARIZING:
            assert self.compaction is not None, "the summary it writes"
            self.compaction.feed(self.parser.feed(ids))
            return not self.parser.stopped
        if self.steers:
            return self._feed_to_boundary(ids)
        self.events.feed(self.parser.feed(ids), self.port.emit)
        return not self.parser.stopped

    def _feed_to_boundary(self, ids: list[int]) -> bool:
        """A steered response: tokens one at a time, up to the end of the item being
        sampled; what the engine sampled beyond it is dropped unseen, so the parser (and
        the history it commits) holds whole items only."""
        emit = self.port.emit
        for token in ids:
            parsed = self.parser.feed([token])
            self.events.feed(parsed, emit)
            if any(event[0] in ITEM_DONE for event in parsed):
                self.enter(State.CUT_FOR_STEER)
                return False
            if self.parser.stopped:
                return False
        return True

    def done(self, engine_cached: int | None = None) -> None:
        """The engine finished (stop token or max_output_tokens): the output is
        committed and the response ends; or its state says which unit goes on with it
        (the connection hands it over): `SUMMARIZING` (the summary is written),
        `CALLING_MCP` (the turn called MCP tools), `WAITING_FOR_TOOLS` (client tools,
        long-running)."""
        # Set, not added: an earlier pass's figure is in `spent` already.
        self.engine_cached = engine_cached
        if self.state is State.SUMMARIZING:
            return
        if self.state is State.PREFILLING:
            # Nothing sampled, nothing committed: the next turn extends exactly the
            # prompt the engine now holds.
            checkpoint = self.conversation.checkpoint()
            self.terminal("response.completed", "completed", self.usage(), checkpoint)
            return
        if self.state is State.CUT_FOR_STEER and not self.parser.stopped:
            self._end_steered()
            return
        parsed, outcome, message = self.parser.finish()
        self.events.feed(parsed, self.port.emit)
        usage = self.usage()
        if outcome == "malformed":
            self.fail(f"The model's output could not be parsed: {message}", usage)
            return
        try:
            self.conversation.commit_output(self.parser)
        except CoreError as e:
            self.fail(f"The model's output could not be recorded: {e.message}", usage)
            return
        if (self.events.mcp_calls or self.events.mcp_approvals) and outcome == "stopped":
            self.enter(State.CALLING_MCP)
            return
        if self.port.settings.inject and outcome == "stopped" and self.client_calls():
            self.enter(State.WAITING_FOR_TOOLS)
            return
        checkpoint = self.conversation.checkpoint()
        if outcome == "truncated":
            kind, status, reason = "response.incomplete", "incomplete", "max_output_tokens"
        else:
            kind, status, reason = "response.completed", "completed", None
        self.terminal(kind, status, usage, checkpoint, incomplete_reason=reason)

    def _end_steered(self) -> None:
        """The steered response ends at its item boundary, its sampled ids committed
        verbatim: the successor appends the steering input to these very tokens."""
        usage = self.usage()
        try:
            self.conversation.commit_output(self.parser)
        except CoreError as e:
            self.fail(f"The model's output could not be recorded: {e.message}", usage)
            return
        checkpoint = self.conversation.checkpoint()
        self.terminal(
            "response.incomplete", "incomplete", usage, checkpoint, incomplete_reason="steered"
        )

    def failed(self, error: EngineError) -> None:
        """The engine failed."""
        message = f"The engine failed ({error.code}): {error.message}"
        summary = self.compaction
        if self.state is State.SUMMARIZING and summary is not None and not summary.resume:
            # /responses/compact has no response to fail: its request gets the error.
            self.enter(State.DONE)
            self.port.refuse(ProtocolError("server_error", message, status=500))
            self.book(b"", self.usage(), "failed", summary.item_id)
            self.port.release(self.lane)
            return
        self.fail(message, self.usage())

    # ---------------------------------------------------------------- stopping

    def stop(self) -> None:
        """The response leaves the running responses: its engine work (or its idle
        timer, if it waits for tool output) stops."""
        port = self.port
        if port.generating.pop(self.key, None) is None:
            del port.waiting[self.key]
        port.emit(Cancel(self.key))

    def cancel(self) -> None:
        """`response.cancel`: it stops where it is."""
        self.stop()
        # Items still open are dropped: the cancelled response reports what completed.
        self.terminal("response.incomplete", "cancelled", self.usage(), None)

    # ---------------------------------------------------------------- endings

    def usage(self) -> Usage:
        """The response's usage so far: every model turn's prompt and output."""
        turn = self.current_turn
        # A new conversation renders its fixed prefix in this very turn: nothing of its
        # prompt came from the cache, whatever the core kept between its own steps (a
        # compacted turn runs on a new conversation too). A resumed model turn extends
        # the response's own tokens.
        spent = self.spent
        continued = self.parent is not None or self.seen.found is not None
        fresh = self.resumed is None and (not continued or spent is not None)
        cached = 0 if fresh else turn.cached_tokens
        started = self.conversation_start
        if self.resumed is None and started is not None:
            cached = max(0, cached - started.fresh_tokens)
        usage = Usage(
            input_tokens=turn.prompt_tokens,
            cached_tokens=cached,
            cache_write_tokens=turn.prompt_tokens - cached,
            output_tokens=self.parser.output_tokens,
            reasoning_tokens=self.parser.reasoning_tokens,
            engine_cached_tokens=self.engine_cached,
        )
        return usage if spent is None else usage + spent

    def fail(self, message: str, usage: Usage) -> None:
        if self.evicts_parent and self.parent is not None:
            self.port.cache.evict(self.parent)
        error = {"code": "server_error", "message": message}
        self.terminal("response.failed", "failed", usage, None, error=error)

    def book(
        self,
        response_json: bytes,
        usage: Usage,
        status: str = "cancelled",
        response_id: str | None = None,
    ) -> None:
        """Engine work that ends without a terminal event (a client gone mid-turn, a
        `/responses/compact` summary) is booked all the same, to the key that asked:
        the prompt was prefilled and the tokens sampled. Nothing is cached or stored."""
        self.port.report(
            Finished(
                response_id or self.events.response_id,
                self.request,
                response_json,
                None,
                usage,
                self.port.settings.principal,
                self.overhead_ns,
                self.turn,
                status=status,
                created_at=self.events.created_at,
            )
        )

    def end_mark(self) -> Mark | None:
        """The content address of the state it ends in: its prompt's with its output
        appended, for a response of one model turn on the prompt it was rendered with
        (a summarized turn, or one that took input while it ran, is found by id only)."""
        single = not (self.segments or self.injected or self.resumed or self.spent)
        if not single or self.compaction is not None:
            return None
        return end_mark(self.seen.mark, self.events.output)

    def turn_segment(self, then: list[dict[str, Any]]) -> TurnSegment:
        """The current model turn as the store keeps it, followed by `then`."""
        ids = self.conversation.prompt().tokens_from(self.current_turn.prompt_tokens)
        return TurnSegment(len(self.events.output), ids, then)

    def stored_segment(self, then: list[dict[str, Any]]) -> TurnSegment | None:
        """`turn_segment`, when the response is stored (None otherwise)."""
        return self.turn_segment(then) if self.stored else None

    def commit_input(self, items: list[dict[str, Any]], max_output_tokens: int | None) -> Turn:
        """Append `items` (tool outputs, steering input) to the conversation after the last
        model turn, validated as delta input and rendered alone, under the response's own
        settings (`max_output_tokens`: what is left of its budget). Raises CoreError,
        the conversation unchanged."""
        frame = resume_frame(self.request.response_fields_json, items, max_output_tokens)
        request = parse_event(frame, self.port.request_limits)
        assert isinstance(request, CreateRequest), "a response.create with new input"
        if request.error is not None:
            raise request.error
        return self.conversation.extend(request)

    def commit_held(self, checkpoint: Checkpoint | None) -> tuple[Checkpoint | None, bool]:
        """It ends holding injected outputs it acknowledged (answers to calls it
        completed, while other calls waited or its turn still sampled): they are
        committed after its last model turn, so the calls it is continued with are
        answered. Not when it cannot be continued (`checkpoint` None): they end with it.
        Returns the checkpoint to end with, and whether the outputs closed the turn."""
        held = [item for injection in self.injected for item in injection.items]
        self.port.dequeued(sum(injection.size for injection in self.injected))
        self.injected = []
        if checkpoint is None:
            return None, False
        segment = self.stored_segment(held)
        try:
            self.commit_input(held, None)
        except CoreError as e:
            # Checked against the core when they arrived: only the context can refuse them.
            log.warning("outputs held by %s not committed: %s", self.events.response_id, e.message)
            return checkpoint, False
        if segment is not None:
            self.segments.append(segment)
        return self.conversation.checkpoint(), True

    def terminal(
        self,
        kind: str,
        status: str,
        usage: Usage,
        checkpoint: Checkpoint | None,
        *,
        error: dict[str, str] | None = None,
        incomplete_reason: str | None = None,
    ) -> None:
        """The response ends: its terminal event goes out, after the store's commit
        when it is stored."""
        port = self.port
        closed = False
        if self.injected:
            checkpoint, closed = self.commit_held(checkpoint)
        stored = self.stored
        if stored and self.segments and not closed:
            # The last model turn of a response that took input while it ran.
            self.segments.append(
                self.turn_segment([])
                if checkpoint is not None
                else TurnSegment(len(self.events.output), [], [])
            )
        events = self.events
        final = events.response_json(
            status, usage=usage, error=error, incomplete_reason=incomplete_reason
        )
        ending = Ending(
            self,
            kind,
            checkpoint,
            Finished(
                events.response_id,
                self.request,
                final,
                checkpoint,
                usage,
                port.settings.principal,
                self.overhead_ns,
                self.turn,
                status=status,
                error=error,
                created_at=events.created_at,
                failure=None if error is None else error["code"],
                segments=tuple(self.segments),
                conversation_start=self.conversation_start,
            ),
        )
        if stored:
            self.enter(State.ENDING)
            self.lane.active = None
            self.lane.ending = port.ending[self.key] = ending
            port.emit(Persist(self.key, ending.finished))
            return
        ending.conclude()
        # A response refused before the engine never took its lane: nothing to free.
        if self.lane.active is self:
            port.release(self.lane)


@dataclass
class Ending:
    """A finished turn whose terminal event waits for its commit (`Persist`)."""

    response: Response
    kind: str
    """The terminal event's type; `finished` holds the Response it carries."""
    checkpoint: Checkpoint | None
    finished: Finished
    continued: ConversationStart | None = None
    """Where its conversation stands once its items were appended, when its state is
    the conversation's up to them (`Connection.persist_done`): its automatic
    successor continues the conversation from there."""

    def conclude(self) -> None:
        """Send the terminal event (the Response as committed), cache the new state and
        report it."""
        response = self.response
        response.enter(State.DONE)
        port, events = response.port, response.events
        port.emit(events.wrap(self.kind, self.finished.response_json))
        if self.checkpoint is not None:
            mark = response.end_mark()
            port.cache.put(
                events.response_id, self.checkpoint, response.lane.name, response.root, mark=mark
            )
            history = port.history
            if mark is not None and history is not None and history.cache is not port.cache:
                # Found by content only (a whole-history request that misses it renders
                # all): after the terminal frame is out.
                port.emit(Later(partial(history.keep, mark, self.checkpoint, response.root)))
        port.report(self.finished)
        port.concluded(response, self)

    def store_failed(self, message: str) -> None:
        """The commit failed: the response ends as `response.failed` (`error.message`
        starting with `store_unavailable:`), never acknowledged."""
        response = self.response
        if response.evicts_parent and response.parent is not None:
            response.port.cache.evict(response.parent)
        error = {"code": "server_error", "message": f"{STORE_UNAVAILABLE}: {message}"}
        replace(
            self,
            kind="response.failed",
            checkpoint=None,
            finished=replace(
                self.finished,
                response_json=response.events.response_json(
                    "failed", usage=self.finished.usage, error=error
                ),
                checkpoint=None,
                status="failed",
                error=error,
                failure=STORE_UNAVAILABLE,
            ),
        ).conclude()
