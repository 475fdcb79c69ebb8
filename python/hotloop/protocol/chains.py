"""Where a request's conversation starts (`Chains`): a fork of the checkpoint its
`previous_response_id` or `conversation` names in the connection's cache, or a new
conversation; whether a failure consumes the parent; the chain's root (its routing
key); or the refusal of a parent that is missing, or that the transport could not read
or rebuild. It reads the cache and never changes it.
"""

from __future__ import annotations

from hotloop._core import Conversation, CreateRequest
from hotloop.protocol.connection_cache import ConnectionCache, is_conversation
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.lanes import Lane
from hotloop.protocol.port import Settings


class Chains:
    """A connection's chains: the conversation each request continues."""

    def __init__(self, cache: ConnectionCache, settings: Settings) -> None:
        self.cache = cache
        self.settings = settings
        self.unreadable: dict[str, ProtocolError] = {}
        """Parent ids the transport could not rebuild (`Connection.store_unavailable`,
        `cannot_continue`), and the refusal of the request that continues one."""

    def chain(
        self, parent: str | None, lane: Lane, conversation: bool = False
    ) -> tuple[Conversation, bool, str | None] | ProtocolError:
        """The conversation a request continues (a fork of `parent`'s checkpoint, or a
        new one), whether a failure evicts the parent, and the root of the parent's
        chain (its routing key; None for a new conversation); or why it cannot.
        `conversation`: `parent` is a conversation's id (its state as
        `Ledger.warm_conversation` put it in the cache)."""
        if parent is None:
            return self.settings.conversation(), False, None
        # The transport already tried the store (`Ledger.warm`): a miss here is final,
        # unless the store could not be read. A response id never names a
        # conversation's state, nor the other way round.
        cached = None if conversation != is_conversation(parent) else self.cache.get(parent)
        checkpoint = cached.checkpoint if cached is not None else None
        unreadable = self.unreadable.pop(parent, None)
        if cached is None or checkpoint is None:
            if unreadable is None and conversation:
                return ProtocolError(
                    "not_found",
                    f"Conversation with id '{parent}' not found.",
                    "conversation",
                    status=404,
                )
            if unreadable is None:
                return ProtocolError.not_found(parent)
            return unreadable
        # A continuation on the lane that made the parent consumes it on failure; a
        # fork from another lane must leave the parent to its own lane.
        return checkpoint.fork(), cached.lane == lane.name, cached.root

    def continued(
        self, request: CreateRequest, lane: Lane
    ) -> tuple[Conversation, bool, str | None] | ProtocolError:
        """`chain` of what `request` continues: its `previous_response_id` or its
        `conversation`."""
        conversation = request.conversation
        parent = request.previous_response_id or conversation
        return self.chain(parent, lane, conversation is not None)
