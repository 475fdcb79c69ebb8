"""The connection cache: checkpoints of finished responses, by response id.

Owns the memory bound of cached conversation state: each connection's cache is bounded
by bytes (`Checkpoint.memory_bytes`) with least-recently-used eviction, and all caches
of the process share one global budget, so one agent cannot starve the others. An
evicted id behaves exactly like an unknown one. It does not know about lanes or
requests; the state machine decides what to store and what to evict.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from hotloop._core import Checkpoint


@dataclass(frozen=True)
class CachedResponse:
    """A finished response's state: where to continue from, which lane made it (a
    failed continuation on the same lane evicts it; a failed fork does not), and the
    id of its chain's first response (the conversation's name on every node)."""

    checkpoint: Checkpoint
    lane: str | None
    memory_bytes: int
    root: str


class CacheBudget:
    """The process-wide cap on cached state, shared by every connection's cache.
    Evicts the globally least recently used entry when the total exceeds the cap, and
    counts lookups and evictions of all connections (for metrics)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used_bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        """Entries dropped for memory, by a connection's bound or the global one."""
        self._lru: OrderedDict[str, ConnectionCache] = OrderedDict()

    def admit(self, response_id: str, cache: ConnectionCache, size: int) -> None:
        self._lru[response_id] = cache
        self.used_bytes += size
        while self.used_bytes > self.max_bytes and len(self._lru) > 1:
            oldest, owner = next(iter(self._lru.items()))
            owner.evict(oldest)
            self.evictions += 1

    def touch(self, response_id: str) -> None:
        self._lru.move_to_end(response_id)

    def release(self, response_id: str, size: int) -> None:
        if self._lru.pop(response_id, None) is not None:
            self.used_bytes -= size


class ConnectionCache:
    """One connection's checkpoints, bounded by bytes with LRU eviction."""

    def __init__(self, max_bytes: int, budget: CacheBudget) -> None:
        self.max_bytes = max_bytes
        self.used_bytes = 0
        self.evictions = 0
        self._budget = budget
        self._entries: OrderedDict[str, CachedResponse] = OrderedDict()

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
            self._budget.touch(response_id)
        return entry

    def put(self, response_id: str, checkpoint: Checkpoint, lane: str | None, root: str) -> None:
        size = checkpoint.memory_bytes
        self._entries[response_id] = CachedResponse(checkpoint, lane, size, root)
        self.used_bytes += size
        # The newest entry always stays: the response just sent must be continuable.
        while self.used_bytes > self.max_bytes and len(self._entries) > 1:
            self.evict(next(iter(self._entries)))
            self.evictions += 1
            self._budget.evictions += 1
        self._budget.admit(response_id, self, size)

    def evict(self, response_id: str) -> None:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self.used_bytes -= entry.memory_bytes
            self._budget.release(response_id, entry.memory_bytes)

    def clear(self) -> None:
        """Drop everything (the socket closed): the cache dies with its connection."""
        for response_id in list(self._entries):
            self.evict(response_id)
