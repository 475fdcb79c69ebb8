"""The connection cache: checkpoints of finished responses, by response id.

Owns the memory bound of cached conversation state: each connection's cache is bounded
by bytes (`Checkpoint.memory_bytes`) with least-recently-used eviction, and all caches
of the process share one global budget in fair shares per API key, so one agent cannot
starve the others. An evicted id behaves exactly like an unknown one. It does not know
about lanes or requests; the state machine decides what to store and what to evict.

An entry may carry its `Mark`, the content address of the history it holds
(`history.py`): the cache finds the entry by it (`find`), keeps one entry per address,
and an entry that must no longer answer to its response id can stay under its address
alone (`unname`). The raw addresses of the requests whose states it holds (`seen`, the
core's `SeenItems`) are forgotten with the entry that holds the state.

One response id can be held by several caches at once (the HTTP cache of a key and
every socket that continued the stored response, each rebuilt from the store): the
budget therefore names an entry by (cache, response id), never by the id alone, and
its byte count is exactly the sum of the live entries.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

from hotloop._core import Checkpoint, SeenItems

CONVERSATION_PREFIX = "conv_"
HISTORY_PREFIX = "hist_"
"""The key of an entry held under its content address only (`ConnectionCache.unname`,
`history.History.keep`): no response id starts with it."""

STATES_PER_CHAIN = 4
"""Entries held under their content address alone that one chain (`root`) keeps in a
cache, its newest: every turn leaves two (its prompt and its end), and a client that
resends its whole history continues from its last turn's (a retry, from the prompt; the
next turn, from the end), or from an earlier one only when it edits or cuts its history.
Each older one would cost a checkpoint's own nodes and its entry, a few KB, for every
turn of every agent for as long as the key's cache kept it."""


def history_key(digest: bytes) -> str:
    return HISTORY_PREFIX + digest.hex()


@dataclass(frozen=True)
class Mark:
    """Where a state stands in content (`history.py`): the address of the prefix it was
    rendered with, and the address of its whole history (prefix, then every item, a
    response's outputs as the server sent them)."""

    prefix: bytes
    digest: bytes


def is_conversation(key: str) -> bool:
    """A cache key names a conversation's state (`Ledger.warm_conversation`), not a
    response's."""
    return key.startswith(CONVERSATION_PREFIX)


@dataclass(frozen=True)
class ConversationStart:
    """What a turn on a conversation starts from (`Ledger.warm_conversation`)."""

    version: tuple[int, int]
    """The conversation as it was read (its next item position and its item count; any
    change moves one of them): the turn's items end a turn a later one may start from
    only if nothing changed the conversation before they are appended."""
    fresh_tokens: int
    """Tokens rendered to start the turn (the items after the cached state it forked):
    not served from the cache."""


@dataclass(frozen=True)
class CachedResponse:
    """A finished response's state: where to continue from, which lane made it (a
    failed continuation on the same lane evicts it; a failed fork does not), and the
    id of its chain's first response (the conversation's name on every node)."""

    checkpoint: Checkpoint
    lane: str | None
    memory_bytes: int
    root: str
    start: ConversationStart | None = None
    """A conversation's state, put for the turn that starts from it."""
    mark: Mark | None = None
    """The state's content address, when it has one (`history.py`)."""


class CacheBudget:
    """The process-wide cap on cached state, shared by every connection's cache, in
    fair shares per API key: when the total exceeds the cap, the key holding the most
    bytes gives back its least recently used entry first, so one tenant's warm-ups
    evict its own state, never a smaller tenant's. Counts lookups and evictions of all
    connections (for metrics)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used_bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        """Entries dropped for memory, by a connection's bound or the global one."""
        self._lru: dict[str | None, OrderedDict[tuple[ConnectionCache, str], int]] = {}
        """Each key's entries (by its caches' `owner`), least recently used first."""
        self._held: dict[str | None, int] = {}
        """Each key's bytes."""
        self._holders: dict[str, set[ConnectionCache]] = {}

    def admit(self, cache: ConnectionCache, response_id: str, size: int) -> None:
        entry = (cache, response_id)
        self.release(cache, response_id)
        self._lru.setdefault(cache.owner, OrderedDict())[entry] = size
        self._held[cache.owner] = self._held.get(cache.owner, 0) + size
        self._holders.setdefault(response_id, set()).add(cache)
        self.used_bytes += size
        while self.used_bytes > self.max_bytes:
            victim = self._heaviest_oldest(entry)
            if victim is None:
                break  # the newest entry always stays: the response just sent
            victim[0].evict(victim[1])
            self.evictions += 1

    def _heaviest_oldest(
        self, keep: tuple[ConnectionCache, str]
    ) -> tuple[ConnectionCache, str] | None:
        """The least recently used entry of the key holding the most bytes, `keep`
        aside (a key whose only entry it is gives the next key's)."""
        for owner in sorted(self._held, key=self._held.__getitem__, reverse=True):
            for entry in self._lru[owner]:
                if entry != keep:
                    return entry
        return None

    def grow(self, cache: ConnectionCache, response_id: str, size: int) -> None:
        """An entry counts `size` more bytes, in its place in the LRU order."""
        self._lru[cache.owner][(cache, response_id)] += size
        self._held[cache.owner] += size
        self.used_bytes += size

    def touch(self, cache: ConnectionCache, response_id: str) -> None:
        self._lru[cache.owner].move_to_end((cache, response_id))

    def release(self, cache: ConnectionCache, response_id: str) -> None:
        lru = self._lru.get(cache.owner)
        size = None if lru is None else lru.pop((cache, response_id), None)
        if lru is None or size is None:
            return
        self.used_bytes -= size
        self._held[cache.owner] -= size
        if not lru:
            del self._lru[cache.owner], self._held[cache.owner]
        holders = self._holders[response_id]
        holders.discard(cache)
        if not holders:
            del self._holders[response_id]

    def evict_everywhere(self, response_id: str, owner: str | None) -> int:
        """Drop `response_id` from every cache of API key id `owner` (a deleted
        response must not stay continuable on any socket), with the copies of its state
        held by content (`history.History.keep`). Returns how many held it."""
        holders = [c for c in self._holders.get(response_id, ()) if c.owner == owner]
        marks = {mark for cache in holders if (mark := cache.mark(response_id)) is not None}
        for cache in holders:
            cache.evict(response_id)
        for mark in marks:
            key = history_key(mark.digest)
            for cache in [c for c in self._holders.get(key, ()) if c.owner == owner]:
                cache.evict(key)
        return len(holders)


class ConnectionCache:
    """One connection's checkpoints, bounded by bytes with LRU eviction. `owner` is
    the API key id of whoever the cache serves (None when auth is off)."""

    def __init__(self, max_bytes: int, budget: CacheBudget, owner: str | None = None) -> None:
        self.max_bytes = max_bytes
        self.used_bytes = 0
        self.evictions = 0
        self.owner = owner
        self._budget = budget
        self._entries: OrderedDict[str, CachedResponse] = OrderedDict()
        self._addresses: dict[bytes, str] = {}
        """The key of the entry holding each content address."""
        self._states: dict[str, list[str]] = {}
        """Each chain's entries held under their address alone, oldest first."""
        self.seen = SeenItems()
        """The raw addresses of requests whose prompt states it holds (`history.py`)."""

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: str) -> bool:
        return response_id in self._entries

    def get(self, response_id: str) -> CachedResponse | None:
        entry = self._entries.get(response_id)
        if entry is None:
            self._budget.misses += 1
        else:
            self._budget.hits += 1
            self._entries.move_to_end(response_id)
            self._budget.touch(self, response_id)
        return entry

    def put(
        self,
        response_id: str,
        checkpoint: Checkpoint,
        lane: str | None,
        root: str,
        start: ConversationStart | None = None,
        mark: Mark | None = None,
    ) -> None:
        # A re-put replaces: its old size must not stay counted, but what it took over
        # from an evicted state before it (`_pass_on_oldest`) is the new one's to count.
        size = checkpoint.memory_bytes + self._inherited(response_id)
        self.evict(response_id)
        if mark is not None:
            # The same history under another key is the same state: one entry holds it.
            held = self._addresses.get(mark.digest)
            if held is not None:
                size += self._inherited(held)
                self.evict(held)
            self._addresses[mark.digest] = response_id
        self._entries[response_id] = CachedResponse(checkpoint, lane, size, root, start, mark)
        self.used_bytes += size
        if response_id.startswith(HISTORY_PREFIX):
            states = self._states.setdefault(root, [])
            states.append(response_id)
            if len(states) > STATES_PER_CHAIN:
                self._pass_on_oldest(states)
        # The newest entry always stays: the response just sent must be continuable.
        while self.used_bytes > self.max_bytes and len(self._entries) > 1:
            self.evict(next(iter(self._entries)))
            self.evictions += 1
            self._budget.evictions += 1
        self._budget.admit(self, response_id, size)

    def _inherited(self, key: str) -> int:
        """Bytes the entry under `key` counts beyond its own checkpoint's (0 if none)."""
        entry = self._entries.get(key)
        return 0 if entry is None else entry.memory_bytes - entry.checkpoint.memory_bytes

    def _pass_on_oldest(self, states: list[str]) -> None:
        """Evict a chain's oldest state; the next takes over its bytes. Each state counts
        what it adds to the checkpoint before it, so the chain's first counts its whole
        history: the nodes the evicted one shared with the next stay alive for it (what
        it held alone and is freed stays counted, a bound's safe side)."""
        oldest = self._entries[states[0]]
        self.evict(states[0])
        heir = states[0]
        entry = self._entries[heir]
        self._entries[heir] = replace(entry, memory_bytes=entry.memory_bytes + oldest.memory_bytes)
        self.used_bytes += oldest.memory_bytes
        self._budget.grow(self, heir, oldest.memory_bytes)

    def find(self, digest: bytes) -> str | None:
        """The key of the entry whose history has content address `digest`, if any (not
        counted as a lookup: `get` it)."""
        return self._addresses.get(digest)

    def mark(self, response_id: str) -> Mark | None:
        """The entry's `mark` (None when there is none), not counted as a lookup."""
        entry = self._entries.get(response_id)
        return None if entry is None else entry.mark

    def unname(self, response_id: str) -> None:
        """The entry no longer answers to `response_id` (a `store=false` HTTP response:
        nothing continues it by id); one with a content address stays under that
        address alone, in its place in the LRU order's newest end."""
        entry = self._entries.get(response_id)
        if entry is None:
            return
        self.evict(response_id)
        if entry.mark is not None:
            key = history_key(entry.mark.digest)
            self.put(key, entry.checkpoint, None, entry.root, entry.start, entry.mark)

    def start(self, response_id: str) -> ConversationStart | None:
        """The entry's `start` (None when there is none), not counted as a lookup."""
        entry = self._entries.get(response_id)
        return None if entry is None else entry.start

    def evict(self, response_id: str) -> None:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            if response_id.startswith(HISTORY_PREFIX):
                states = self._states[entry.root]
                states.remove(response_id)
                if not states:
                    del self._states[entry.root]
            mark = entry.mark
            if mark is not None and self._addresses.get(mark.digest) == response_id:
                del self._addresses[mark.digest]
                self.seen.forget(mark.digest)
            self.used_bytes -= entry.memory_bytes
            self._budget.release(self, response_id)

    def clear(self) -> None:
        """Drop everything (the socket closed): the cache dies with its connection."""
        for response_id in list(self._entries):
            self.evict(response_id)
