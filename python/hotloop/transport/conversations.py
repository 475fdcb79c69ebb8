"""`/v1/conversations`: create, read, update and delete conversations and their items.

HTTP only, over the durable store (`store/conversations.py` owns the tables). Items are
validated as `input` items are (the core's `parse_request`, with the same limits), kept
in wire form with ids like a response's input items (`store/items.py`), and at most
`MAX_ITEMS_PER_REQUEST` are added per request. Everything is owned by the API key that
created it: another key, like an unknown id, gets 404 `not_found`. A conversation's
items count towards its key's storage quota (`--store-quota-bytes/rows`): past it, a
request that adds to it is refused with 429 `insufficient_quota`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import orjson

from hotloop._core import CoreError, Limits, parse_request
from hotloop.events import new_id
from hotloop.protocol.errors import ProtocolError
from hotloop.store import Store
from hotloop.store import conversations as tables
from hotloop.store.conversations import MAX_ITEMS_PER_REQUEST, ConversationRecord, NewItem
from hotloop.store.items import listed_items
from hotloop.store.quota import Usage
from hotloop.transport.stored import page_query

Reply = Callable[[int, bytes], Awaitable[None]]


def not_found(conversation_id: str) -> ProtocolError:
    return ProtocolError(
        "not_found", f"Conversation with id '{conversation_id}' not found.", status=404
    )


def item_not_found(item_id: str) -> ProtocolError:
    return ProtocolError("not_found", f"Item with id '{item_id}' not found.", status=404)


def new_items(items: object, limits: Limits | None, param: str = "items") -> list[NewItem]:
    """`items` validated as a request's `input` and in wire form with their ids.
    Raises ProtocolError (the core's code, `param` naming the item) when one is refused."""
    if not isinstance(items, list):
        raise ProtocolError("invalid_type", f"'{param}' must be an array of items.", param)
    if len(items) > MAX_ITEMS_PER_REQUEST:
        raise ProtocolError(
            "array_above_max_length",
            f"Invalid '{param}': array too long. Expected an array with maximum length "
            f"{MAX_ITEMS_PER_REQUEST}, but got an array with length {len(items)} instead.",
            param,
        )
    body = orjson.dumps({"model": "conversation", "input": items})
    try:
        error = parse_request(body, limits).error
    except CoreError as e:
        error = e
    if error is not None:
        refused = ProtocolError.from_core(error)
        where = refused.param or "input"
        raise ProtocolError(
            refused.code,
            refused.message.replace("'input", f"'{param}"),
            param + where.removeprefix("input"),
        )
    listed = listed_items(new_id("resp_"), orjson.dumps(items)) if items else []
    added = [(str(item["id"]), orjson.dumps(item)) for item in listed]
    for index, (item_id, _) in enumerate(added):
        if "\x00" in item_id:
            # No store can name it (a PostgreSQL text column cannot hold NUL).
            raise ProtocolError(
                "invalid_value", "An item id cannot hold a NUL character.", f"{param}[{index}].id"
            )
    return added


def _metadata(body: dict[str, Any]) -> bytes:
    metadata = body.get("metadata")
    if metadata is None:
        return b"{}"
    fine = isinstance(metadata, dict) and len(metadata) <= 16
    if fine and all(
        isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
        for k, v in metadata.items()
    ):
        return orjson.dumps(metadata)
    raise ProtocolError(
        "invalid_value",
        "'metadata' must be an object of at most 16 string values (keys up to 64 "
        "characters, values up to 512).",
        "metadata",
    )


def _object(body: bytes) -> dict[str, Any]:
    try:
        parsed = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError as e:
        raise ProtocolError("invalid_json", f"The body is not valid JSON: {e}") from e
    if not isinstance(parsed, dict):
        raise ProtocolError("invalid_type", "The body must be a JSON object.")
    return parsed


def item_list(items: list[bytes], has_more: bool) -> bytes:
    """The SDK's `ConversationItemList` (`ConversationItemList` of `items.create` too)."""
    data = [orjson.loads(item) for item in items]
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else "",
            "last_id": data[-1]["id"] if data else "",
            "has_more": has_more,
        }
    )


class ConversationsApi:
    """The routes under `/v1/conversations` for one store. `evict` is told of every
    conversation whose items changed or that was deleted (the cached turn state
    under its id is dropped everywhere: the next turn reads it again)."""

    def __init__(
        self,
        store: Store | None,
        limits: Limits | None,
        evict: Callable[[str, str | None], object],
    ) -> None:
        self._store = store
        self._limits = limits
        self._evict = evict

    async def route(
        self,
        method: str,
        parts: list[str],
        query_string: bytes,
        body: Callable[[], Awaitable[bytes]],
        reply: Reply,
        owner: str | None,
        allow: Callable[..., None],
    ) -> None:
        store = self._store
        if store is None:
            raise ProtocolError(
                "not_found",
                "This server has no durable store (--data-dir): it keeps no conversations.",
                status=404,
            )
        query = parse_qs(query_string.decode("latin-1"))
        match parts:
            case []:
                allow(method, "POST")
                await self._create(store, _object(await body()), reply, owner)
            case [conversation_id]:
                allow(method, "GET", "POST", "DELETE")
                if method == "GET":
                    found = await store.query(tables.get(conversation_id, owner))
                    if found is None:
                        raise not_found(conversation_id)
                    await reply(200, found.to_json())
                elif method == "POST":
                    metadata = _metadata(_object(await body()))
                    updated = await store.transact(tables.update(conversation_id, owner, metadata))
                    if updated is None:
                        raise not_found(conversation_id)
                    store.counted(owner, Usage(updated[1], 0))
                    await reply(200, updated[0].to_json())
                else:
                    freed = await store.transact(tables.delete(conversation_id, owner))
                    if freed is None:
                        raise not_found(conversation_id)
                    store.counted(owner, Usage() - freed)
                    self._evict(conversation_id, owner)
                    deleted = {"id": conversation_id, "object": "conversation.deleted"}
                    await reply(200, orjson.dumps({**deleted, "deleted": True}))
            case [conversation_id, "items"]:
                allow(method, "GET", "POST")
                if method == "GET":
                    ascending, limit, after = page_query(query)
                    page = await store.query(
                        tables.page(
                            conversation_id, owner, ascending=ascending, limit=limit, after=after
                        )
                    )
                    if page is None:
                        raise not_found(conversation_id)
                    await reply(200, item_list(*page))
                else:
                    await self._add(store, conversation_id, _object(await body()), reply, owner)
            case [conversation_id, "items", item_id]:
                allow(method, "GET", "DELETE")
                if method == "GET":
                    found_item = await store.query(tables.item(conversation_id, owner, item_id))
                    if found_item is None:
                        raise item_not_found(item_id)
                    await reply(200, found_item)
                else:
                    removed = await store.transact(
                        tables.delete_item(conversation_id, owner, item_id)
                    )
                    if removed is None:
                        raise item_not_found(item_id)
                    store.counted(owner, Usage() - removed[1])
                    self._evict(conversation_id, owner)
                    # OpenAI answers with the conversation the item was deleted from.
                    await reply(200, removed[0].to_json())
            case _:
                raise ProtocolError("not_found", "No such conversations route.", status=404)

    async def _create(
        self, store: Store, body: dict[str, Any], reply: Reply, owner: str | None
    ) -> None:
        items = new_items(body.get("items") or [], self._limits)
        metadata = _metadata(body)
        self._within_quota(store, owner)
        record = ConversationRecord(new_id("conv_"), owner, int(time.time()), metadata)
        await store.transact(tables.create(record, items))
        store.counted(owner, Usage(len(metadata), 1) + tables.added_usage(items))
        await reply(200, record.to_json())

    async def _add(
        self,
        store: Store,
        conversation_id: str,
        body: dict[str, Any],
        reply: Reply,
        owner: str | None,
    ) -> None:
        items = new_items(body.get("items"), self._limits)
        self._within_quota(store, owner)
        if await store.transact(tables.add(conversation_id, owner, items)) is None:
            raise not_found(conversation_id)
        store.counted(owner, tables.added_usage(items))
        self._evict(conversation_id, owner)
        await reply(200, item_list([item for _, item in items], False))

    @staticmethod
    def _within_quota(store: Store, owner: str | None) -> None:
        refusal = store.quota_refusal(owner)
        if refusal is not None:
            raise ProtocolError("insufficient_quota", refusal, status=429)


__all__ = ["ConversationsApi", "item_list", "new_items", "not_found"]
