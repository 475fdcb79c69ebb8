"""A connection's lanes (protocol.md section 5): each one's queue of requests and the
one response it runs at a time (rendering, sampling or committing). FIFO within a lane,
concurrent across lanes; the `RequestQueue` (`request_queue.py`) starts the head of a
free lane's queue.

Plain state: the queue moves requests through it, the response that holds a lane
frees it. A lane knows what holds it only as far as it acts on it (`Holder`,
`Waiting`): the responses and their units sit above it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from hotloop._core import CreateRequest

if TYPE_CHECKING:
    from hotloop.protocol.connection_cache import ConversationStart
    from hotloop.protocol.mcp_tools import McpTurn
    from hotloop.protocol.steers import Steered


class Holder(Protocol):
    """The response running on a lane (`response.Response`)."""

    def cancel(self) -> None:
        """`response.cancel`: it stops where it is."""
        ...


class Waiting(Protocol):
    """A turn holding its lane while work it waits for runs (`response.Rendering`)."""

    cancelled: bool
    """A cancel came meanwhile: the turn is cancelled once the work ended."""


@dataclass
class Pending:
    """A request on its lane's queue. One that has to wait keeps only its frame's text
    (`frame`: about one byte per queued byte) instead of the parsed request (about two:
    the parsed items plus the input's JSON kept for the store), and is parsed again when
    its turn comes; the parse is deterministic, so the second gives the first's result."""

    parsed: CreateRequest | None
    size: int
    parse_ns: int
    frame: str | bytes | None = None
    started: bool = False
    steered: Steered | None = None
    """The steering input this turn carries (an automatic successor, or a continuation
    with queued steers prepended): returned in `response.steer.failed` if it fails."""
    mcp: McpTurn | None = None
    """The request's MCP servers, listed before it was queued (`hotloop.protocol.mcp_tools`)."""
    start: ConversationStart | None = None
    """The state of its conversation it starts from, when the transport did not put it
    in the cache (an automatic successor continues its target's: `Ending.continued`)."""
    parent: str | None = field(init=False)
    """The request's `previous_response_id` or `conversation`, kept while only the
    frame is."""
    conversation: bool = field(init=False)
    """`parent` names a conversation (an automatic successor on a conversation names
    both: its parent is its target)."""

    def __post_init__(self) -> None:
        parsed = self.parsed
        self.parent = None if parsed is None else parsed.previous_response_id or parsed.conversation
        self.conversation = (
            parsed is not None
            and parsed.previous_response_id is None
            and parsed.conversation is not None
        )

    @property
    def request(self) -> CreateRequest:
        assert self.parsed is not None, "parsed again by TurnStart.start"
        return self.parsed

    @property
    def automatic(self) -> bool:
        """An automatic successor: no client request asked for it."""
        return self.steered is not None and self.steered.automatic


@dataclass
class Lane:
    name: str | None
    queue: deque[Pending] = field(default_factory=deque)
    active: Holder | None = None
    rendering: Waiting | None = None
    ending: object | None = None
    """The response whose terminal event waits for its commit (`response.Ending`)."""

    @property
    def free(self) -> bool:
        return self.active is None and self.rendering is None and self.ending is None
