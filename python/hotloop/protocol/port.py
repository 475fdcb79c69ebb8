"""What a protocol unit may ask of the connection that holds it (`Port`), and what every
turn on a connection is served with (`Settings`).

A unit (a response, steering, the long-running response, interrupt, summarization, the
MCP loop) never holds the `Connection`: it is handed a port, and the connection is one.
The port says what the services are (emit an action, hold and release queued bytes and
lanes, a new key for engine work, the connection's caches, its settings), so a unit can
be read, and driven in a test, knowing only these. A unit that needs more of its own
(the running responses, a chain's start) declares it beside itself, extending `Port`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from hotloop._core import ChatFormat, Conversation, CreateRequest, Limits, Policy
from hotloop.protocol.actions import Action, Finished
from hotloop.protocol.connection_cache import ConnectionCache
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.history import History
from hotloop.protocol.lanes import Lane


@dataclass(frozen=True)
class Settings:
    """What every turn on a connection is served with, fixed at the upgrade."""

    chat_format: ChatFormat
    context_window: int
    model: str
    policy: Policy | None
    principal: str | None
    """The API key the connection authenticated with."""
    session_key: str | None
    request_id: str | None
    sampling_defaults: tuple[float, float]
    durable: bool
    storage_refusal: Callable[[str | None], str | None] | None
    """Why a key may store no more (`Ledger.storage_refusal`), or None."""
    inject: bool
    stop_tokens: tuple[int, ...]
    model_required: bool = False
    """A request without `model` is refused (no `--default-model`)."""

    def over_quota(self, request: CreateRequest) -> ProtocolError | None:
        """The refusal of a `store=true` request (a warm-up too: it is stored like any
        other), or of a turn on a conversation (it appends to it), from a key at its
        storage quota."""
        stores = request.store or request.conversation is not None
        if not (stores and self.durable and self.storage_refusal is not None):
            return None
        message = self.storage_refusal(self.principal)
        if message is None:
            return None
        return ProtocolError("insufficient_quota", message, "store", status=429)

    def conversation(self) -> Conversation:
        """A new conversation in the connection's format."""
        return Conversation(
            self.chat_format, context_window=self.context_window, policy=self.policy
        )


class Port(Protocol):
    """The connection's services, as a unit sees them."""

    settings: Settings
    cache: ConnectionCache
    """The connection's cache of conversations, by response id."""
    history: History | None
    """The caller's states by the content address of their history (`history.py`)."""
    request_limits: Limits | None
    """The core's bounds on a request (items, bytes), for the requests a unit derives."""
    clock: Callable[[], int]
    emit: Callable[[Action], None]
    """Send a server frame or hand out work, after everything emitted before it."""

    def new_key(self) -> int:
        """A key for new work (`Generate`, `Render`, `Persist`, `Wait`, `McpCall`)."""
        ...

    def hold(self, size: int) -> None:
        """Count `size` bytes of waiting input in the connection's bounds; raises the
        `ProtocolError` that refuses them past a bound."""
        ...

    def dequeued(self, size: int) -> None:
        """`size` held bytes leave the bounds."""
        ...

    def release(self, lane: Lane) -> None:
        """The response that held `lane` ended: the lane takes its next request."""
        ...

    def refuse(self, error: ProtocolError, stream_id: str | None = None) -> None:
        """An `error` event."""
        ...

    def report(self, finished: Finished) -> None:
        """A finished response to the observer (usage, metrics, the store)."""
        ...
