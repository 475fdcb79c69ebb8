"""The token-id request bodies kept between an upstream conversation's sessions.

The core writes a request's token-id prompt as JSON keeping the previous body's prefix
(`hotloop._core.PromptBody`), so a turn costs its new ids. A WebSocket session keeps
its body between turns; an HTTP request's session lasts one request, so without this
the next request of the same conversation (`previous_response_id`, or the whole history
again) would write every id of its prompt once more: O(history) per turn. A session
that ends leaves its body here under its cache salt and its conversation's key
(`Generate.route_key`, which a client may choose: with the salt, another tenant naming
the same conversation never takes this one's body), and the next session of that
conversation takes it. Bounded: at most `KEPT_BODIES` conversations and
`KEPT_BODY_BYTES` of their last bodies, the least recently left dropped first (a body
holds about 7 bytes per id of its prompt: the last request body, which the next request
rewrites in place from its first changed byte). The bounds hold one body for each of
hundreds of agents at 100k tokens: were they fewer than the agents resending their
histories, every turn would take the least recently left one's place and write its whole
prompt again (about 1 ms for 100k ids, against 0.05 ms for a turn's new ids).
"""

from __future__ import annotations

from collections import OrderedDict

from hotloop._core import PromptBody

KEPT_BODIES = 4096
KEPT_BODY_BYTES = 256 << 20

BodyKey = tuple[str | None, str]
"""A session's cache salt and its conversation's key."""


class KeptBodies:
    """Bodies by conversation key, at most `limit` of them and `limit_bytes` of their
    last requests' bytes."""

    def __init__(self, limit: int = KEPT_BODIES, limit_bytes: int = KEPT_BODY_BYTES) -> None:
        self._limit = limit
        self._limit_bytes = limit_bytes
        self._bodies: OrderedDict[BodyKey, tuple[PromptBody, int]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._bodies)

    def take(self, key: BodyKey) -> PromptBody | None:
        """The body the conversation's last session left, now the caller's."""
        kept = self._bodies.pop(key, None)
        if kept is None:
            return None
        self._bytes -= kept[1]
        return kept[0]

    def keep(self, key: BodyKey, body: PromptBody, size: int) -> None:
        """Keep `body`, whose last request was `size` bytes."""
        self.take(key)
        self._bodies[key] = (body, size)
        self._bytes += size
        while len(self._bodies) > self._limit or self._bytes > self._limit_bytes:
            _, (_, dropped) = self._bodies.popitem(last=False)
            self._bytes -= dropped
