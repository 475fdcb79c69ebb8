"""Durable responses: what `store=true` keeps after the terminal event.

This package owns the `Store` interface the protocol and HTTP layers call, the records
it holds, and how a stored chain is replayed into a fresh `Conversation` when the
rendered-token cache misses. It never sees a request before its terminal event and
never decides what goes on the wire; `store=false` responses never reach it.

- `StoredResponse`: one finished response, as it was sent, plus its input items and
  the sampled token ids.
- `Store`: the async interface (put after the terminal event, get, delete, list input
  items, load a chain, flush).
- `open_store(data_dir)`: the embedded default, SQLite behind one background thread
  (`sqlite.py` for the database, `writer.py` for the bounded queue in front of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson

from hotloop.protocol.compaction import compacted

if TYPE_CHECKING:
    from hotloop._core import Conversation
    from hotloop.metrics import Metrics
    from hotloop.protocol.compaction import Compactor

Order = Literal["asc", "desc"]


class StoreError(Exception):
    """A store failure with a stable code: `store_unavailable` (the database cannot be
    opened or written), `store_closed` (a put after shutdown began)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class StoredResponse:
    """A response that ended with `store=true`, captured right after its terminal event.

    `response` is the Response object exactly as the terminal event carried it (a JSON
    object, bytes); `input_items` is the request's input as a JSON array (the delta when
    the request continued a previous response); `owner` is the API key id that created
    it (None when auth is off), and only that owner can read it back.
    """

    id: str
    owner: str | None
    previous_response_id: str | None
    created_at: int
    response: bytes
    input_items: bytes
    output_token_ids: Sequence[int] = ()


@dataclass(frozen=True)
class InputItemPage:
    """One page of `GET /v1/responses/{id}/input_items`, already in wire form."""

    data: list[dict[str, Any]]
    has_more: bool

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "object": "list",
                "data": self.data,
                # The SDK types both ids as strings; an empty page has no item to name.
                "first_id": self.data[0]["id"] if self.data else "",
                "last_id": self.data[-1]["id"] if self.data else "",
                "has_more": self.has_more,
            }
        )


@dataclass(frozen=True)
class Chain:
    """The stored responses from the root of a chain to the one asked for, oldest first."""

    responses: list[StoredResponse]

    @property
    def head(self) -> StoredResponse:
        return self.responses[-1]

    def replay(self, conversation: Conversation, compactor: Compactor) -> None:
        """Rebuild the rendered state of `head` into an empty conversation: every turn's
        input items, then its output items. Instructions and tools are not inherited
        through `previous_response_id`, so the whole chain renders under the head's
        own prefix; the next request applies its own on top (and the core re-renders
        from the prefix only if they differ). Compaction items render as their summary
        (`compactor` opens them), and a response compacted by `context_management`
        restarts the chain from its output, as it did when it ran. Raises CoreError
        from the core if a stored item no longer validates (ProtocolError if a
        compaction item no longer opens)."""
        head = orjson.loads(self.head.response)
        instructions = head.get("instructions")
        tools_json = orjson.dumps(head.get("tools") or []).decode()
        outputs = [orjson.loads(stored.response).get("output") or [] for stored in self.responses]
        start = max((i for i, output in enumerate(outputs) if compacted(output)), default=-1)
        for index, stored in enumerate(self.responses):
            if index < start:
                continue
            output = orjson.dumps(outputs[index])
            for items in (output,) if index == start else (stored.input_items, output):
                conversation.append_items(
                    compactor.expand_items(items).decode(),
                    instructions=instructions if isinstance(instructions, str) else None,
                    tools_json=tools_json,
                )


class Store(Protocol):
    """Where `store=true` responses live. Every method is safe to call from the event
    loop: none blocks it. Reads see every put that returned (read-your-writes), even
    before the background writer has committed it."""

    async def put(self, response: StoredResponse) -> None:
        """Queue a finished response for persistence. Waits only when the bounded
        queue is full (backpressure), never for the disk."""
        ...

    async def get(self, response_id: str, owner: str | None) -> bytes | None:
        """The stored Response object (JSON), or None if unknown, deleted or not
        `owner`'s."""
        ...

    async def delete(self, response_id: str, owner: str | None) -> bool:
        """Delete a response and its input items; False if there was nothing to delete."""
        ...

    async def list_input_items(
        self,
        response_id: str,
        owner: str | None,
        *,
        order: Order = "desc",
        limit: int = 20,
        after: str | None = None,
    ) -> InputItemPage | None:
        """A page of the response's input items in wire form, or None if unknown."""
        ...

    async def load_chain(self, response_id: str, owner: str | None) -> Chain | None:
        """The chain ending at `response_id`, or None if it or any ancestor is gone."""
        ...

    def pending(self) -> int:
        """Puts accepted but not yet committed."""
        ...

    async def flush(self) -> None:
        """Return once everything put so far is committed (or has failed and been
        logged)."""
        ...

    async def close(self) -> None:
        """Flush, then release the database. Later puts raise StoreError `store_closed`."""
        ...


async def open_store(
    data_dir: str | Path,
    *,
    queue_size: int = 1024,
    metrics: Metrics | None = None,
) -> Store:
    """The embedded default: `responses.sqlite3` in `data_dir` (created if missing),
    written by one background thread through a bounded queue of `queue_size` puts."""
    from hotloop.store.sqlite import SQLiteDatabase
    from hotloop.store.writer import BackgroundStore

    path = Path(data_dir)
    path.mkdir(parents=True, exist_ok=True)
    return await BackgroundStore.open(
        lambda: SQLiteDatabase(path / "responses.sqlite3"),
        queue_size=queue_size,
        metrics=metrics,
    )


__all__ = [
    "Chain",
    "InputItemPage",
    "Order",
    "Store",
    "StoreError",
    "StoredResponse",
    "open_store",
]
