"""Compaction as engine work (protocol.md section 8): `POST /v1/responses/compact`, whose
answer is the summary the engine writes, a response whose input ends with a
`compaction_trigger` item (Codex's remote compaction: the response's one output item is
the summary), and `context_management`, whose turn summarizes
first when its prompt passed the client's threshold and then runs on a new conversation
holding the summary in place of the history. `Summarization` owns those transitions of a
response; sealing and opening summaries, and the requests they derive, are
`compaction.py`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hotloop._core import Conversation, CoreError, CreateRequest, Turn
from hotloop.events import ResponseEvents, new_id
from hotloop.protocol.compaction import (
    Compactor,
    Summary,
    compacted_resource,
    resumed,
    summarizing,
)
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.lanes import Pending
from hotloop.protocol.response import Rendering, Response
from hotloop.protocol.state import State

if TYPE_CHECKING:
    from hotloop.protocol.connection import Connection
    from hotloop.protocol.lanes import Lane


class Summarization:
    """A connection's summaries: the engine writes one for `/responses/compact` or for a
    turn over its compaction threshold, sealed with the server's key (`compactor`)."""

    def __init__(self, connection: Connection, compactor: Compactor) -> None:
        self.connection = connection
        self.compactor = compactor

    def receive_compact(self, request: CreateRequest, lane: Lane) -> None:
        """`POST /v1/responses/compact` (its body parsed as a request): the engine
        summarizes the conversation (the chain of `previous_response_id`, then the
        input) on `lane`; the one frame out is the `response.compaction` object, or an
        error."""
        connection = self.connection
        if request.error is not None:
            connection.refuse(ProtocolError.from_core(request.error))
            return
        parent = request.previous_response_id or request.conversation
        summary = self.summary_turn(request, lane)
        if isinstance(summary, ProtocolError):
            connection.refuse(summary)
            return
        conversation, turn, root = summary
        rendered = Rendering(
            connection, lane, Pending(request, 0, 0), conversation, parent, False, 0, root
        )
        response = Response.open(rendered, ResponseEvents(request.response_fields_json), turn)
        lane.active = response
        connection.generating[response.key] = response
        self.summarize(response, conversation, turn, resume=False)

    def summary_turn(
        self, request: CreateRequest, lane: Lane
    ) -> tuple[Conversation, Turn, str | None] | ProtocolError:
        """The summarization of `request`'s conversation (its parent's chain and its
        input, then the instruction to summarize) rendered for the engine, and the
        chain's root; or why not."""
        connection = self.connection
        chain = connection.continued(request, lane)
        if isinstance(chain, ProtocolError):
            return chain
        conversation, _, root = chain
        try:
            summary_tokens = self.compactor.summary_tokens
            summarize = summarizing(request, summary_tokens, connection.limits.request)
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
            self.connection.outbox.append(
                response.events.event(
                    "response.compaction.compacting", item_id=compaction.item_id, output_index=0
                )
            )
        response.generate(conversation.prompt(), self.compactor.summary_tokens)

    def summarized(self, response: Response, compaction: Summary) -> None:
        """The engine wrote the summary: seal it; then either answer /compact, or run
        the turn on a new conversation holding the summary in place of the history."""
        connection = self.connection
        compaction.feed(response.parser.finish()[0])
        spent = response.usage()
        item = compaction.item(self.compactor)
        response.compaction = None
        if response.request.compaction_trigger:
            # Remote compaction (Codex): a response whose one output is the item.
            connection.outbox.append(response.events.item_added(0, item))
            connection.outbox.append(response.events.item_done(0, item))
            response.terminal("response.completed", "completed", spent, None)
            return
        if not compaction.resume:
            resource = compacted_resource(item, spent)
            connection.outbox.append(resource)
            response.enter(State.DONE)
            response.book(resource, spent, "completed", compaction.item_id)
            connection.release(response.lane)
            return
        events = response.events
        connection.outbox.append(events.item_added(0, item))
        connection.outbox.append(events.item_done(0, item))
        events.index_offset = 1
        # The model turn's own items follow (an interrupt keeps them, a wait looks there).
        response.first_item = len(events.output)
        conversation = connection.settings.conversation()
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
        response.key = connection.new_key()
        connection.generating[response.key] = response
        response.generate(conversation.prompt())
