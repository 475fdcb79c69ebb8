"""A turn from its lane to its engine call (`TurnStart`, over a `TurnPort`): where its
conversation starts (its chain, `chains.py`, or the longest state of its history the
caller's cache holds, `history.py`), its new items rendered (inline, or handed out as
`Render` work for a large request, its lane waiting meanwhile), the calls it approves
run first (`McpLoop.answer`), then its response opened and handed its prompt: a
prewarm's, a summary's first (`Summarization.begins`) or the turn's own.

It holds the turns waiting for that work, by its key; a turn refused on the way is
refused through the port (`refuse_turn`). It never holds the connection: the requests
it starts come from the `RequestQueue`, the responses it opens are `response.py`'s.
"""

from __future__ import annotations

from typing import Protocol

from hotloop._core import CoreError, CreateRequest, Turn
from hotloop.mcp_client import McpError
from hotloop.protocol.actions import OFFLOAD_BYTES, Render
from hotloop.protocol.chains import Chains
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.history import NOWHERE, Start
from hotloop.protocol.lanes import Lane, Pending
from hotloop.protocol.mcp_loop import McpLoop
from hotloop.protocol.response import Rendering, Response
from hotloop.protocol.state import State
from hotloop.protocol.steering import SteeringPort
from hotloop.protocol.summarization import Summarization


class TurnPort(SteeringPort, Protocol):
    """A connection's services, and what it does once a lane is free again."""

    def freed(self, lane: Lane) -> None:
        """What held `lane` let go of it: its next request starts when it can."""
        ...


class TurnStart:
    """A connection's turns between their lane and their engine call."""

    def __init__(
        self, port: TurnPort, chains: Chains, mcp: McpLoop, summarization: Summarization
    ) -> None:
        self.port = port
        self.chains = chains
        self.mcp = mcp
        self.summarization = summarization
        self.rendering: dict[int, Rendering] = {}
        """Turns waiting for their `Render` work or the MCP calls they approved, by its key."""

    def start(self, lane: Lane, pending: Pending) -> None:
        """Run the turn up to the engine call (`RequestQueue.pump` took it off its
        lane's queue); errors end the request here."""
        port = self.port
        start = port.clock()
        parent = pending.parent
        chain = self.chains.chain(parent, lane, pending.conversation)
        if isinstance(chain, ProtocolError):
            port.refuse_turn(pending, chain, lane.name)
            return
        conversation, evicts_parent, root = chain
        seen = self._content_start(pending, parent)
        if seen.found is not None:
            conversation, root = seen.found.checkpoint.fork(), seen.found.root
        rendering = Rendering(port, lane, pending, conversation, parent, evicts_parent, start, root)
        rendering.seen = seen
        if parent is not None:
            rendering.conversation_start = pending.start or port.cache.start(parent)
        self._render(rendering)

    def render_done(self, key: int, turn: Turn, request: CreateRequest) -> None:
        """The `Render` work `key` finished (`Render.run` returned `request`, `turn`): the
        turn goes on to the engine."""
        rendering = self._end_render(key)
        if rendering is None:
            return
        rendering.pending.parsed = request
        self._rendered(rendering, turn)
        self._render_ended(rendering)

    def render_failed(self, key: int, error: CoreError) -> None:
        """The `Render` work `key` raised: the request is refused, the lane goes on."""
        rendering = self._end_render(key)
        if rendering is not None:
            rendering.refused(error)
            self.port.freed(rendering.lane)

    def approved(self, key: int, results: list[str | McpError]) -> bool:
        """The `McpCall` work `key` of the calls a request approved finished: it renders
        with their outputs (`McpLoop.approved`). False: no turn waited for `key` (the
        calls were a response's, or the client went away)."""
        rendering = self._end_render(key)
        if rendering is None:
            return False
        self.mcp.approved(rendering.pending, results)
        self._render(rendering)
        self._render_ended(rendering)
        return True

    def _render(self, rendering: Rendering) -> None:
        """Render the turn's new items, off the event loop for a large request; one whose
        frame waits (queued, or with approved MCP calls' outputs put in) is parsed again
        first, with the render. Errors end the request here."""
        port = self.port
        lane, pending = rendering.lane, rendering.pending
        conversation = rendering.conversation
        mcp = pending.mcp
        if mcp is not None and mcp.checks:
            # The calls it approves run once it is accepted: a copy is rendered first.
            conversation = conversation.checkpoint().fork()
        frame = pending.frame
        reparse = port.reparse if mcp is None else mcp.reparse
        pending.frame = None
        skip = rendering.seen.skip
        if skip and pending.parsed is not None:
            # Only the items after the state it continues are rendered: they decide where.
            offload = pending.parsed.text_bytes(skip) >= OFFLOAD_BYTES
        else:
            offload = pending.size >= OFFLOAD_BYTES
        if offload:
            key = port.new_key()
            lane.rendering = self.rendering[key] = rendering
            if pending.parsed is not None:
                port.emit(Render(key, conversation, pending.parsed, skip))
            elif frame is not None:
                # Parsed again with the render, off the event loop, as it was the first time.
                port.emit(Render(key, conversation, lambda: reparse(frame)))
            return
        if pending.parsed is None:
            start = port.clock()
            pending.parsed = reparse(frame or b"")
            pending.parse_ns += port.clock() - start
        try:
            turn = conversation.extend(pending.request, skip)
        except CoreError as e:
            rendering.refused(e)
            return
        self._rendered(rendering, turn)

    def _rendered(self, rendering: Rendering, turn: Turn) -> None:
        """The turn rendered: the response starts; or, a request answering MCP approval
        requests, they are taken first and the calls it approved run, the rendering
        holding its lane (`McpLoop.answer`)."""
        try:
            work = self.mcp.answer(rendering.pending)
        except ProtocolError as e:
            rendering.refused(e)
            return
        if work is None:
            self._opened(rendering, rendering.rendered(turn))
            return
        rendering.lane.rendering = self.rendering[work.key] = rendering
        self.port.emit(work)

    def _opened(self, rendering: Rendering, response: Response) -> None:
        """The response of a rendered turn opened: the engine is handed its prompt (a
        prewarm's, a summary's first, or the turn's)."""
        request = response.request
        if not request.generate:
            response.overhead_ns = rendering.overhead_ns()
            response.prewarm(response.conversation.prompt())
            return
        response.announce()
        if response.mcp is not None:
            self.mcp.start(response)
        if self.summarization.begins(response, rendering):
            return
        response.overhead_ns = rendering.overhead_ns()
        response.enter(State.SAMPLING)
        response.generate(response.conversation.prompt())

    def _render_ended(self, rendering: Rendering) -> None:
        """Work a rendering waited for ended (a `Render`, approved MCP calls)."""
        active = rendering.lane.active
        if rendering.cancelled and active is not None:
            # The cancel came while rendering: the same frames as a cancel right after
            # `response.in_progress` of an inline render.
            active.cancel()
        else:
            self.port.freed(rendering.lane)

    def _content_start(self, pending: Pending, parent: str | None) -> Start:
        """Where the turn starts in content (`History.start`). A request that waited in
        its lane's queue (kept as its frame, parsed again with its render) or that calls
        MCP tools (its frame is rewritten) is not looked up: it renders everything, as a
        miss does."""
        request = pending.parsed
        history = self.port.history
        if history is None or request is None or pending.mcp is not None:
            return NOWHERE
        mark = None if parent is None else self.port.cache.mark(parent)
        start = history.start(request, mark, parent is not None)
        if start.whole is not None:
            pending.parsed = start.whole
        return start

    def _end_render(self, key: int) -> Rendering | None:
        # None when the client went away meanwhile.
        rendering = self.rendering.pop(key, None)
        if rendering is not None:
            rendering.lane.rendering = None
        return rendering
