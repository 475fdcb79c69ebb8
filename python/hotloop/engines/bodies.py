"""The token-id request bodies kept between an upstream conversation's sessions.

The core writes a request's token-id prompt as JSON keeping the previous body's prefix
(`hotloop._core.PromptBody`), so a turn costs its new ids. A WebSocket session keeps
its body between turns; an HTTP request's session lasts one request, so without this
the next request of the same conversation (`previous_response_id`, or the whole history
again) would write every id of its prompt once more: O(history) per turn. A session
that ends leaves its body here under its cache salt and its conversation's key
(`Generate.route_key`, which a client may choose: with the salt, another tenant naming
the same conversation never takes this one's body), and the next session of that
conversation takes it. Bounded: the last `KEPT_BODIES`
conversations, the least recently left dropped first (a body holds about 7 bytes per id
of its prompt: the last request body, which the next request rewrites in place from its
first changed byte).
"""

from __future__ import annotations

from collections import OrderedDict

from hotloop._core import PromptBody

KEPT_BODIES = 32

BodyKey = tuple[str | None, str]
"""A session's cache salt and its conversation's key."""


class KeptBodies:
    """Bodies by conversation key, at most `limit` of them."""

    def __init__(self, limit: int = KEPT_BODIES) -> None:
        self._limit = limit
        self._bodies: OrderedDict[BodyKey, PromptBody] = OrderedDict()

    def __len__(self) -> int:
        return len(self._bodies)

    def take(self, key: BodyKey) -> PromptBody | None:
        """The body the conversation's last session left, now the caller's."""
        return self._bodies.pop(key, None)

    def keep(self, key: BodyKey, body: PromptBody) -> None:
        self._bodies[key] = body
        self._bodies.move_to_end(key)
        while len(self._bodies) > self._limit:
            self._bodies.popitem(last=False)
