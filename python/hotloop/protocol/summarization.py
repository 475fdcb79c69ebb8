"""Compaction as engine work (protocol.md section 8): `POST /v1/responses/compact`, whose
answer is the summary the engine writes, a response whose input ends with a
`compaction_trigger` item (Codex's remote compaction: the response's one output item is
the summary), and `context_management`, whose turn summarizes
first when its prompt passed the client's threshold and then runs on a new conversation
holding the summary in place of the history. `Summarization` owns those transitions of a
response; sealing and opening summaries, and the requests they derive, are
`compaction.py`'s. It holds no connection: the responses' port, and where a
request's chain starts (`chains.py`).
"""

from __future__ import annotations

from hotloop._core import Conversation, CoreError, CreateRequest, Turn
from hotloop.events import ResponseEvents, Usage, new_id
from hotloop.protocol.chains import Chains
from hotloop.protocol.compaction import (
    Compactor,
    Summary,
    compacted_resource,
    resumed,
    summarizing,
)
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.lanes import Lane, Pending
from hotloop.protocol.response import Rendering, Response, ResponsePort
from hotloop.protocol.state import State


class Summarization:
    """A connection's summaries: the engine writes one for `/responses/compact` or for a
    turn over its compaction threshold, sealed with the server's key (`compactor`)."""

    def __init__(self, port: ResponsePort, chains: Chains, compactor: Compactor) -> None:
        self.port = port
        self.chains = chains
        self.compactor = compactor

    def receive_compact(self, request: CreateRequest, lane: Lane) -> None:
        """`POST /v1/responses/compact` (its body parsed as a request): the engine
        summarizes the conversation (the chain of `previous_response_id`, then the
        input) on `lane`; the one frame out is the `response.compaction` object, or an
        error."""
        port = self.port
        if request.error is not None:
            port.refuse(ProtocolError.from_core(request.error))
            return
        parent = request.previous_response_id or request.conversation
        summary = self.summary_turn(request, lane)
        if isinstance(summary, ProtocolError):
            port.refuse(summary)
            return
        conversation, turn, root = summary
        rendered = Rendering(
            port, lane, Pending(request, 0, 0), conversation, parent, False, 0, root
        )
        response = Response.open(rendered, ResponseEvents(request.response_fields_json), turn)
        lane.active = response
        port.generating[response.key] = response
        self.summarize(response, conversation, turn, resume=False)

    def begins(self, response: Response, rendering: Rendering) -> bool:
        """Whether a rendered turn starts with a summary, which then starts: its prompt
        passed the client's threshold (the engine summarizes first, and the turn then
        runs on the summary: `summarized`), or the client asked for compaction (a
        `compaction_trigger` item: the summary is the response)."""
        request, turn = response.request, response.turn
        threshold = request.compact_threshold
        over = threshold is not None and turn.prompt_tokens > threshold
        if not (over or request.compaction_trigger):
            return False
        summary = self.summary_turn(request, rendering.lane)
        if isinstance(summary, ProtocolError):
            # No engine work started: it leaves the running responses (in flight
            # otherwise, the connection would never be idle again).
            del self.port.generating[response.key]
            message = f"The conversation could not be compacted: {summary.message}"
            response.fail(message, Usage())
            return True
        response.overhead_ns = rendering.overhead_ns()
        resume = not request.compaction_trigger
        self.summarize(response, summary[0], summary[1], resume=resume)
        return True

    def summary_turn(
        self, request: CreateRequest, lane: Lane
    ) -> tuple[Conversation, Turn, str | None] | ProtocolError:
        """The summarization of `request`'s conversation (its parent's chain and its
        input, then the instruction to summarize) rendered for the engine, and the
        chain's root; or why not."""
        port = self.port
        chain = self.chains.continued(request, lane)
        if isinstance(chain, ProtocolError):
            return chain
        conversation, _, root = chain
        try:
            summary_tokens = self.compactor.summary_tokens
            summarize = summarizing(request, summary_tokens, port.request_limits)
            return conversation, conversation.extend(summarize), root
        except CoreError as e:
            return ProtocolError.from_core(e)

    def summarize(
        self, response: Response, conversation: Conversation, turn: Turn, *, resume: bool
    ) -> None:
        """Hand the engine the summarization; `summarized` takes it from there."""
        compaction = Summary(new_id("cmp_"), resume)
        if resume:
            compaction.before = response.conversation, response.turn
        response.enter(State.SUMMARIZING)
        response.compaction = compaction
        response.conversation, response.parser = conversation, conversation.parser()
        response.turn = turn
        if resume:
            self.port.emit(
                response.events.event(
                    "response.compaction.compacting", item_id=compaction.item_id, output_index=0
                )
            )
        response.generate(conversation.prompt(), self.compactor.summary_tokens)

    def summarized(self, response: Response) -> None:
        """The engine wrote the summary (its model turn ended `SUMMARIZING`): seal it;
        then either answer /compact, or run the turn on a new conversation holding the
        summary in place of the history."""
        port = self.port
        compaction = response.compaction
        assert compaction is not None, "the summary it wrote"
        compaction.feed(response.parser.finish()[0])
        spent = response.usage()
        item = compaction.item(self.compactor)
        response.compaction = None
        if response.request.compaction_trigger:
            # Remote compaction (Codex): a response whose one output is the item.
            port.emit(response.events.item_added(0, item))
            port.emit(response.events.item_done(0, item))
            response.terminal("response.completed", "completed", spent, None)
            return
        if not compaction.resume:
            resource = compacted_resource(item, spent)
            port.emit(resource)
            response.enter(State.DONE)
            response.book(resource, spent, "completed", compaction.item_id)
            port.release(response.lane)
            return
        events = response.events
        port.emit(events.item_added(0, item))
        port.emit(events.item_done(0, item))
        events.index_offset = 1
        # The model turn's own items follow (an interrupt keeps them, a wait looks there).
        response.first_item = len(events.output)
        conversation = port.settings.conversation()
        try:
            turn = conversation.extend(resumed(response.request, compaction.text))
        except CoreError as e:
            response.fail(f"The compacted conversation failed: {e.message}", spent)
            return
        response.conversation, response.parser = conversation, conversation.parser()
        response.turn, response.spent = turn, spent
        response.enter(State.SAMPLING)
        # New engine work, under a key of its own: the transport forgets the summary's
        # key when that task ends, which would leave this one out of a cancel's reach.
        response.key = port.new_key()
        port.generating[response.key] = response
        response.generate(conversation.prompt())
