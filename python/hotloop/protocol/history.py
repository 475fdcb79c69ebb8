"""Content-addressed states: a request that resends its whole history continues from the
longest state the process rendered of it (docs/protocol.md section 5, "Whole history").

Every state a turn leaves (its prompt, rendered before the engine samples; its end, the
response's output appended as the sampled ids) is kept under the content address of its
history (`Mark`): the core's digest of the prefix (instructions, tools, reasoning effort)
chained with the digest of each item's parsed form (`CreateRequest.history_digests`),
a response's outputs as the server sent them in its `output`
(`history_after_output`). A request without `previous_response_id` or `conversation`
looks its addresses up from the longest down; a hit forks that state and renders only
the items after it, so the prompt is the one `previous_response_id` would have given:
the items a full render would give, except that a replayed output that parses to the
output the server sent is the model's sampled ids verbatim.

The part of the history a key sent before is not even parsed again: the core hashes the
raw bytes of each `input` element while it parses (`parse_request` with the key's
`ConnectionCache.seen`), and the leading elements that are, byte for byte, those of a
request whose prompt state the cache holds (`History.remember`) are recognized as that
state's items; `CreateRequest.seen_items` of them, whose digests the request does not
have. Such a request is looked up from there on; when no state is left there (evicted
between the parse and the lookup), it is parsed again whole (`Start.whole`).

The states live in one API key's process-wide cache (`Ledger.http_cache`): a key finds
only its own, under the cache budget, and an evicted state is a miss that renders
everything. This module owns the addresses and the lookup; the cache owns the memory.
It renders nothing and never sees a socket.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import orjson

from hotloop._core import Checkpoint, CoreError, CreateRequest, history_after_output
from hotloop.protocol.connection_cache import CachedResponse, ConnectionCache, Mark, history_key

T = TypeVar("T")


@dataclass(frozen=True)
class Start:
    """Where a turn starts in content: the state it continues from its history (None
    when it continues by id, or found none), how many of its input items that state
    holds already, and the address its prompt will have (None: not content-addressed)."""

    found: CachedResponse | None
    skip: int
    mark: Mark | None
    whole: CreateRequest | None = None
    """The request parsed again whole: its items recognized by their bytes had no state
    left (the turn runs this one instead)."""


NOWHERE = Start(None, 0, None)


class History:
    """One API key's content-addressed states, in its process-wide cache."""

    def __init__(self, cache: ConnectionCache) -> None:
        self.cache = cache

    def start(self, request: CreateRequest, parent: Mark | None, continues: bool) -> Start:
        """Where `request` starts. `continues`: it names a response or a conversation,
        whose state's mark is `parent` (None when that state has none: a chain rebuilt
        from the store, a conversation): then its prompt's address extends the parent's
        when the prefix is the same, and nothing is looked up. Otherwise the longest
        cached state of its history is looked up."""
        if request.error is not None:
            return NOWHERE
        if request.compaction_trigger:
            # A compaction summarizes the whole input anew, from no state: what was
            # recognized by its bytes is parsed.
            whole = request.parse_whole()
            return NOWHERE if whole is None else replace(NOWHERE, whole=whole)
        if continues:
            if parent is None or parent.prefix != request.prefix_digest:
                # A changed prefix re-renders the chain: its address would need every
                # item's digest again, which the parent does not keep.
                return NOWHERE
            digest = request.history_digests(parent.digest)[-1]
            return Start(None, 0, Mark(parent.prefix, digest))
        mark = Mark(request.prefix_digest, request.history_digests()[-1])
        skip, _, key = longest(request, self.cache.find)
        if key is not None:
            request.settle()
            return Start(self.cache.get(key), skip, mark)
        whole = request.parse_whole()
        if whole is not None:
            return replace(self.start(whole, parent, continues), whole=whole)
        return Start(None, 0, mark)

    def remember(self, request: CreateRequest) -> None:
        """`request`'s prompt state was just kept (`keep`): its raw address names it, so
        that a request resending the same bytes and more is not parsed again up to
        there."""
        self.cache.seen.remember(request)

    def keep(self, mark: Mark, checkpoint: Checkpoint, root: str) -> None:
        """A state under its address: a turn's prompt (its items rendered, before
        sampling), which a retry of the same request or a client that replays less of
        the output than the server sent (a chat client without the reasoning) continues
        from; or a response's end that another cache (a socket's) holds by id, so that
        a whole-history retry on another socket or over HTTP finds it. (In a cache that
        holds a state by id, its mark finds it already.)"""
        self.cache.put(history_key(mark.digest), checkpoint, None, root, mark=mark)


def longest(
    request: CreateRequest, find: Callable[[bytes], T | None]
) -> tuple[int, bytes, T | None]:
    """The longest state `find` holds of `request`'s history, by address: how many of its
    items it holds, its address, and what `find` gave (None, 0 and the prefix's address
    when it holds none). With items recognized by their bytes (`seen_items`), the
    addresses start after them, and a state holding them all is a hit; otherwise they
    start at the prefix, which no state holds alone."""
    digests = request.history_digests()
    seen = request.seen_items
    for at in range(len(digests) - 1, -1 if seen else 0, -1):
        found = find(digests[at])
        if found is not None:
            return seen + at, digests[at], found
    return 0, digests[0], None


def end_mark(prompt: Mark | None, output: list[dict[str, object]]) -> Mark | None:
    """The address of a response's end state: its prompt's, with its `output` items (as
    sent) appended. None when the prompt has none or an item is not one a client can
    replay as input (an MCP call, say): such a state is found by its id only."""
    if prompt is None:
        return None
    try:
        digest = history_after_output(prompt.digest, orjson.dumps(output).decode())
    except CoreError:
        return None
    return Mark(prompt.prefix, digest)


__all__ = ["NOWHERE", "History", "Start", "end_mark", "longest"]
