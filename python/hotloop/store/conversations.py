"""Conversations: durable, ordered lists of items owned by an API key (`/v1/conversations`).

This module owns the two tables of a conversation (`conversations`, `conversation_items`)
and every statement on them, for SQLite and PostgreSQL alike: a statement is written
once with `:name` parameters and runs on either database (`sql.py`). The operations
run on the store's writer thread inside one transaction each (`Store.transact`; reads
through `Store.query`, on the store's readers), so a
conversation's items and the responses that append to it share one writer and one
commit order.

Items are ordered by `position`, given from the conversation's `next_position` and
never reused. Each item also keeps `ordinal`, its place among the live items when it
was added: while no earlier item has been deleted since, its place now equals it. That
is how the rendered-token cache knows which prefix of a conversation it still holds
(`state_ends`): the items a response appended end at an item marked
`ends_turn`, and the checkpoint cached under that response's id renders exactly the
conversation up to that item while the item's ordinal still holds (a deletion before
it moves its place; items added after the deletion are counted with it). A response marks
its last item so only when the conversation is still as the response read it (the
version: `next_position` and `item_count`, which every change moves); otherwise its
state holds other items than the conversation.

What a key stores here counts towards its storage quota (`quota.py`): a conversation's
metadata and each item's JSON, one row each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson

from hotloop.store.quota import Usage, owned_usage
from hotloop.store.sql import Sql

MAX_ITEMS_PER_REQUEST = 20
"""Items one `POST /v1/conversations` or `.../items` may add (OpenAI's bound)."""

# The tables, as each database spells them (a migration of each store appends them).
SQLITE_TABLES = (
    """CREATE TABLE conversations (
        id TEXT PRIMARY KEY,
        owner TEXT,
        created_at INTEGER NOT NULL,
        metadata BLOB NOT NULL,
        next_position INTEGER NOT NULL DEFAULT 0,
        item_count INTEGER NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE conversation_items (
        conversation_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        id TEXT NOT NULL,
        item BLOB NOT NULL,
        response_id TEXT,
        ends_turn INTEGER NOT NULL DEFAULT 0,
        ordinal INTEGER NOT NULL,
        PRIMARY KEY (conversation_id, position)
    ) WITHOUT ROWID""",
    "CREATE INDEX conversation_items_by_id ON conversation_items (conversation_id, id)",
)
POSTGRES_TABLES = (
    """CREATE TABLE conversations (
        id text PRIMARY KEY,
        owner text,
        created_at bigint NOT NULL,
        metadata bytea NOT NULL,
        next_position bigint NOT NULL DEFAULT 0,
        item_count bigint NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE conversation_items (
        conversation_id text NOT NULL,
        position bigint NOT NULL,
        id text NOT NULL,
        item bytea NOT NULL,
        response_id text,
        ends_turn integer NOT NULL DEFAULT 0,
        ordinal bigint NOT NULL,
        PRIMARY KEY (conversation_id, position)
    )""",
    "CREATE INDEX conversation_items_by_id ON conversation_items (conversation_id, id)",
)

# What each key's conversations hold (`records.USAGE_QUERY` adds it to the responses').
USAGE_PARTS = owned_usage(
    "conversations", "metadata", "conversation_items", "item", "conversation_id"
)

_OWNED = "id = :id AND (CAST(:owner AS TEXT) IS NULL OR owner = :owner)"


@dataclass(frozen=True)
class ConversationRecord:
    id: str
    owner: str | None
    created_at: int
    metadata: bytes

    def to_json(self) -> bytes:
        """The SDK's `Conversation`."""
        return orjson.dumps(
            {
                "id": self.id,
                "object": "conversation",
                "created_at": self.created_at,
                "metadata": orjson.loads(self.metadata),
            }
        )


@dataclass(frozen=True)
class ItemPlace:
    """Where one live item stands, without its JSON: what a turn reads of every item."""

    position: int
    response_id: str | None
    ends_turn: bool
    ordinal: int


def item_state(conversation_id: str, position: int) -> str:
    """The cache key of a conversation's state up to an item added through the items
    API (`Ledger.warm_conversation` puts one for each such item it renders)."""
    return f"{conversation_id}@{position}"


def state_ends(conversation_id: str, places: Sequence[ItemPlace]) -> list[tuple[int, int, str]]:
    """(items up to and including it, its position, the cache key of the state up to
    it) of every item a cached state may end at, newest first: the last item a
    response appended (the state under the response's id) and every item added through
    the items API (`item_state`), while still where it was added (no item before it
    deleted since: `ordinal`). An item deleted invalidates the states after it made
    before, not those made since (their items were counted after the deletion)."""
    ends: list[tuple[int, int, str]] = []
    for count, place in enumerate(places, 1):
        if place.ordinal != count:
            continue
        if place.response_id is None:
            ends.append((count, place.position, item_state(conversation_id, place.position)))
        elif place.ends_turn:
            ends.append((count, place.position, place.response_id))
    return ends[::-1]


@dataclass(frozen=True)
class History:
    """What a turn on a conversation reads of it: the cache key of the state it starts
    from (None: from nothing), how many items that state holds, and the items after
    them, in order: (position, added through the items API, JSON)."""

    key: str | None
    held: int
    rest: list[tuple[int, bool, bytes]]
    version: tuple[int, int]
    """The conversation's next item position and item count (`ConversationStart`)."""


NewItem = tuple[str, bytes]
"""An item to add: its id and its JSON (wire form)."""


def _text(value: str) -> bool:
    """Whether a text column can hold `value` (PostgreSQL's cannot hold NUL): an id
    that cannot be stored names nothing."""
    return "\x00" not in value


def _conversation(sql: Sql, conversation_id: str, owner: str | None) -> ConversationRecord | None:
    if not _text(conversation_id):
        return None
    row = sql.execute(
        f"SELECT id, owner, created_at, metadata FROM conversations WHERE {_OWNED}",
        {"id": conversation_id, "owner": owner},
    ).fetchone()
    if row is None:
        return None
    return ConversationRecord(row[0], row[1], int(row[2]), bytes(row[3]))


def _version(sql: Sql, conversation_id: str) -> tuple[int, int]:
    row = sql.execute(
        "SELECT next_position, item_count FROM conversations WHERE id = :id",
        {"id": conversation_id},
    ).fetchone()
    return int(row[0]), int(row[1])


@dataclass(frozen=True)
class Appended:
    """Items appended to a conversation (`add`)."""

    version: tuple[int, int]
    """The conversation's version once they are (`History.version`)."""
    ends_turn: bool
    """A response's items, appended where it read the conversation: its state is the
    conversation's up to them, and a turn continuing it starts at `version`."""


def _append(
    sql: Sql,
    conversation_id: str,
    items: Sequence[NewItem],
    response_id: str | None,
    read: tuple[int, int] | None = None,
) -> Appended:
    """`items` after the conversation's last; a response's (`response_id`) end a turn
    a later one may start from only if the conversation is still as the response
    read it (`read`, its version): otherwise its cached state holds other items."""
    position, count = _version(sql, conversation_id)
    ends_turn = response_id is not None and read == (position, count)
    for index, (item_id, item) in enumerate(items):
        sql.execute(
            "INSERT INTO conversation_items"
            " (conversation_id, position, id, item, response_id, ends_turn, ordinal) VALUES"
            " (:conversation_id, :position, :id, :item, :response_id, :ends_turn, :ordinal)",
            {
                "conversation_id": conversation_id,
                "position": position + index,
                "id": item_id,
                "item": item,
                "response_id": response_id,
                "ends_turn": int(ends_turn and index == len(items) - 1),
                "ordinal": count + index + 1,
            },
        )
    version = (position + len(items), count + len(items))
    sql.execute(
        "UPDATE conversations SET next_position = :next, item_count = :count WHERE id = :id",
        {"id": conversation_id, "next": version[0], "count": version[1]},
    )
    return Appended(version, ends_turn)


def added_usage(items: Sequence[NewItem]) -> Usage:
    return Usage(sum(len(item) for _, item in items), len(items))


def create(record: ConversationRecord, items: Sequence[NewItem]) -> Callable[[Sql], None]:
    def run(sql: Sql) -> None:
        sql.execute(
            "INSERT INTO conversations (id, owner, created_at, metadata)"
            " VALUES (:id, :owner, :created_at, :metadata)",
            {
                "id": record.id,
                "owner": record.owner,
                "created_at": record.created_at,
                "metadata": record.metadata,
            },
        )
        _append(sql, record.id, items, None)

    return run


def get(conversation_id: str, owner: str | None) -> Callable[[Sql], ConversationRecord | None]:
    return lambda sql: _conversation(sql, conversation_id, owner)


def update(
    conversation_id: str, owner: str | None, metadata: bytes
) -> Callable[[Sql], tuple[ConversationRecord, int] | None]:
    """The updated record and how many bytes its metadata grew by."""

    def run(sql: Sql) -> tuple[ConversationRecord, int] | None:
        found = _conversation(sql, conversation_id, owner)
        if found is None:
            return None
        sql.execute(
            "UPDATE conversations SET metadata = :metadata WHERE id = :id",
            {"id": conversation_id, "metadata": metadata},
        )
        updated = ConversationRecord(found.id, found.owner, found.created_at, metadata)
        return updated, len(metadata) - len(found.metadata)

    return run


def delete(conversation_id: str, owner: str | None) -> Callable[[Sql], Usage | None]:
    """What the conversation and its items held, or None if it is not `owner`'s."""

    def run(sql: Sql) -> Usage | None:
        found = _conversation(sql, conversation_id, owner)
        if found is None:
            return None
        row = sql.execute(
            "SELECT coalesce(sum(length(item)), 0), count(*) FROM conversation_items"
            " WHERE conversation_id = :id",
            {"id": conversation_id},
        ).fetchone()
        sql.execute(
            "DELETE FROM conversation_items WHERE conversation_id = :id", {"id": conversation_id}
        )
        sql.execute("DELETE FROM conversations WHERE id = :id", {"id": conversation_id})
        return Usage(len(found.metadata) + int(row[0]), 1 + int(row[1]))

    return run


def add(
    conversation_id: str,
    owner: str | None,
    items: Sequence[NewItem],
    response_id: str | None = None,
    read: tuple[int, int] | None = None,
) -> Callable[[Sql], Appended | None]:
    """Append `items` (a response's when `response_id` is given, which read the
    conversation at version `read`); None when the conversation is not `owner`'s (or
    was deleted meanwhile)."""

    def run(sql: Sql) -> Appended | None:
        if _conversation(sql, conversation_id, owner) is None:
            return None
        return _append(sql, conversation_id, items, response_id, read)

    return run


def page(
    conversation_id: str,
    owner: str | None,
    *,
    ascending: bool,
    limit: int,
    after: str | None,
) -> Callable[[Sql], tuple[list[bytes], bool] | None]:
    """A page of items (JSON) and whether more follow; None if not `owner`'s."""

    def run(sql: Sql) -> tuple[list[bytes], bool] | None:
        if _conversation(sql, conversation_id, owner) is None:
            return None
        bound = -1 if ascending else 2**62
        if after is not None and not _text(after):
            return [], False
        if after is not None:
            found = sql.execute(
                "SELECT position FROM conversation_items WHERE conversation_id = :id AND"
                " id = :item",
                {"id": conversation_id, "item": after},
            ).fetchone()
            if found is None:
                return [], False
            bound = int(found[0])
        comparison, order = (">", "ASC") if ascending else ("<", "DESC")
        rows = sql.execute(
            "SELECT item FROM conversation_items WHERE conversation_id = :id AND"
            f" position {comparison} :bound ORDER BY position {order} LIMIT :limit",
            {"id": conversation_id, "bound": bound, "limit": limit + 1},
        ).fetchall()
        items = [bytes(row[0]) for row in rows]
        return items[:limit], len(items) > limit

    return run


def item(conversation_id: str, owner: str | None, item_id: str) -> Callable[[Sql], bytes | None]:
    def run(sql: Sql) -> bytes | None:
        if not _text(item_id) or _conversation(sql, conversation_id, owner) is None:
            return None
        row = sql.execute(
            "SELECT item FROM conversation_items WHERE conversation_id = :id AND id = :item",
            {"id": conversation_id, "item": item_id},
        ).fetchone()
        return None if row is None else bytes(row[0])

    return run


def delete_item(
    conversation_id: str, owner: str | None, item_id: str
) -> Callable[[Sql], tuple[ConversationRecord, Usage] | None]:
    """The conversation and what the deleted item held; None if either is missing."""

    def run(sql: Sql) -> tuple[ConversationRecord, Usage] | None:
        found = _conversation(sql, conversation_id, owner)
        if found is None or not _text(item_id):
            return None
        row = sql.execute(
            "SELECT position, length(item) FROM conversation_items"
            " WHERE conversation_id = :id AND id = :item",
            {"id": conversation_id, "item": item_id},
        ).fetchone()
        if row is None:
            return None
        sql.execute(
            "DELETE FROM conversation_items WHERE conversation_id = :id AND position = :position",
            {"id": conversation_id, "position": int(row[0])},
        )
        sql.execute(
            "UPDATE conversations SET item_count = item_count - 1 WHERE id = :id",
            {"id": conversation_id},
        )
        return found, Usage(int(row[1]), 1)

    return run


def history(
    conversation_id: str, owner: str | None, cached: Callable[[str], bool]
) -> Callable[[Sql], History | None]:
    """The conversation as a turn starts from it: the newest state on it (`state_ends`)
    `cached` says the cache holds (only where the conversation is unchanged up to its
    last item), and the items after it; None if not `owner`'s. Every item's place is
    read, the JSON of the items after that state only."""

    def run(sql: Sql) -> History | None:
        if _conversation(sql, conversation_id, owner) is None:
            return None
        version = _version(sql, conversation_id)
        rows = sql.execute(
            "SELECT position, response_id, ends_turn, ordinal FROM conversation_items"
            " WHERE conversation_id = :id ORDER BY position",
            {"id": conversation_id},
        ).fetchall()
        places = [ItemPlace(int(r[0]), r[1], bool(r[2]), int(r[3])) for r in rows]
        ends = state_ends(conversation_id, places)
        start = next((end for end in ends if cached(end[2])), None)
        held, after, key = (0, -1, None) if start is None else start
        rows = sql.execute(
            "SELECT position, response_id, item FROM conversation_items"
            " WHERE conversation_id = :id AND position > :after ORDER BY position",
            {"id": conversation_id, "after": after},
        ).fetchall()
        rest = [(int(r[0]), r[1] is None, bytes(r[2])) for r in rows]
        return History(key, held, rest, version)

    return run


__all__ = [
    "MAX_ITEMS_PER_REQUEST",
    "POSTGRES_TABLES",
    "SQLITE_TABLES",
    "USAGE_PARTS",
    "Appended",
    "ConversationRecord",
    "History",
    "ItemPlace",
    "NewItem",
    "item_state",
    "state_ends",
]
