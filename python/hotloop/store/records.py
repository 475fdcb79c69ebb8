"""What a `StoredResponse` becomes in a database, shared by every backend.

Owns the per-record checks and transformations done on the writer's thread before a
batch is committed: the record's JSON must load (a record the store could not read back
is refused here and quarantined, never committed), its input items are listed in wire
form (one row each), and a non-empty tool list is split out of the Response object and
kept once per distinct list, by hash: an agent resends the same 40 KB list every turn.
The Response is stored with the list cut out at a byte offset (`tools_at`), so a read
puts it back with two slices, without parsing.

It does not talk to a database; `sqlite.py` and `postgres.py` write the `Row`s.
"""

from __future__ import annotations

import hashlib
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from hotloop.store import background_tables, conversations
from hotloop.store.interface import InputItemPage, ModelTurn, StoredResponse
from hotloop.store.items import listed_items
from hotloop.store.quota import Usage

RESPONSE_COLUMNS = (
    "id, owner, previous_response_id, created_at, response, tools_hash, tools_at,"
    " input_items, output_token_ids, fingerprint, model_turns"
)
# Every key's usage (`quota.py`), as `Row.usage` counts it: per response its row and
# one row per input item; per conversation its row and one per item; per background
# response its row and one per kept event. Shared tool lists count for nobody.
USAGE_QUERY = f"""
SELECT owner, sum(bytes), sum(rows) FROM (
    SELECT owner, length(response) + length(input_items) AS bytes, 1 AS rows
    FROM responses WHERE owner IS NOT NULL
    UNION ALL
    SELECT r.owner, length(i.item), 1
    FROM input_items AS i JOIN responses AS r ON r.id = i.response_id
    WHERE r.owner IS NOT NULL
    {conversations.USAGE_PARTS}
    {background_tables.USAGE_PARTS}
) AS usage GROUP BY owner
"""
# What deleting one response frees (its id twice).
FREED_QUERY = """
SELECT r.owner, length(r.response) + length(r.input_items) + coalesce(sum(length(i.item)), 0),
       1 + count(i.item), r.tools_hash
FROM responses AS r LEFT JOIN input_items AS i ON i.response_id = r.id
WHERE r.id = {id} GROUP BY r.id
"""
QUARANTINE_COLUMNS = (
    "response_id, owner, reason, quarantined_at, response, input_items, output_token_ids,"
    " model_turns"
)


class RecordError(Exception):
    """A record that cannot be stored as it is (its JSON does not load, or does not have
    the shape of a Response). `reason` names the failure without any of the content."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ToolList:
    hash: str
    tools: bytes


@dataclass(frozen=True)
class Row:
    """One response ready to insert."""

    id: str
    owner: str | None
    previous_response_id: str | None
    created_at: int
    response: bytes
    """The Response JSON; with `tools` set, the list's bytes are cut out at `tools_at`."""
    tools_at: int | None
    tools: ToolList | None
    input_items: bytes
    output_token_ids: bytes
    fingerprint: str
    model_turns: bytes | None
    """`StoredResponse.model_turns` as JSON (`turns_json`); NULL for one model turn."""
    items: list[tuple[int, str, bytes]]
    """(position, id, item JSON in wire form) per input item."""

    @property
    def usage(self) -> Usage:
        """What the row and its item rows weigh against its owner's quota."""
        items = sum(len(item) for _, _, item in self.items)
        return Usage(len(self.response) + len(self.input_items) + items, 1 + len(self.items))

    def values(self) -> tuple[object, ...]:
        """The `responses` row, in `RESPONSE_COLUMNS` order."""
        return (
            self.id,
            self.owner,
            self.previous_response_id,
            self.created_at,
            self.response,
            None if self.tools is None else self.tools.hash,
            self.tools_at,
            self.input_items,
            self.output_token_ids,
            self.fingerprint,
            self.model_turns,
        )


ItemRows = Sequence[tuple[str, int, str, bytes]]
"""Input item rows as inserted: (response id, position, item id, item JSON)."""


@dataclass(frozen=True)
class Quarantined:
    """A refused record, kept whole for an operator (the `quarantine` table)."""

    record: StoredResponse
    reason: str
    at: int

    def values(self) -> tuple[object, ...]:
        """The `quarantine` row, in `QUARANTINE_COLUMNS` order."""
        record = self.record
        ids = orjson.dumps(list(record.output_token_ids))
        return (
            record.id,
            record.owner,
            self.reason,
            self.at,
            record.response,
            record.input_items,
            ids,
            turns_json(record.model_turns),
        )


Rejected = Sequence[Quarantined]


def prepare(record: StoredResponse) -> Row:
    """The row of `record`; raises RecordError when it cannot be stored."""
    try:
        response = orjson.loads(record.response)
        if not isinstance(response, dict):
            raise RecordError("the response is not a JSON object")
        listed = listed_items(record.id, record.input_items)
        items = [(n, str(item["id"]), orjson.dumps(item)) for n, item in enumerate(listed)]
        if any("\x00" in item_id for _, item_id, _ in items):
            # A text column in PostgreSQL cannot hold it: refused here, so that it cannot
            # fail the whole transaction of the responses committed with it.
            raise RecordError("an input item id holds a NUL character")
        if record.model_turns:
            try:
                record.segments(response.get("output") or [])
            except ValueError as e:
                raise RecordError(str(e)) from e
        body, tools_at, tools = _split_tools(record.response, response)
        ids = array("I", record.output_token_ids).tobytes()
    except RecordError:
        raise
    except Exception as e:
        # Whatever the record holds must not stop the writer: any failure to read it
        # refuses this record only. The type names the failure; the message may quote
        # content, so it is not kept.
        raise RecordError(type(e).__name__) from e
    return Row(
        id=record.id,
        owner=record.owner,
        previous_response_id=record.previous_response_id,
        created_at=record.created_at,
        response=body,
        tools_at=tools_at,
        tools=tools,
        input_items=record.input_items,
        output_token_ids=ids,
        fingerprint=record.fingerprint,
        model_turns=turns_json(record.model_turns),
        items=items,
    )


def quarantined(record: StoredResponse, error: RecordError) -> Quarantined:
    return Quarantined(record, error.reason, int(time.time()))


def _split_tools(raw: bytes, response: dict[str, Any]) -> tuple[bytes, int | None, ToolList | None]:
    tools = response.get("tools")
    if not tools:
        return raw, None, None
    keys = list(response)
    at = keys.index("tools")
    before = orjson.dumps({k: response[k] for k in keys[:at]})[:-1]
    after = orjson.dumps({k: response[k] for k in keys[at + 1 :]})[1:]
    head = before + (b"," if len(before) > 1 else b"") + b'"tools":'
    tail = (b"," + after) if len(after) > 1 else after
    tools_json = orjson.dumps(tools)
    digest = hashlib.sha256(tools_json).hexdigest()
    return head + tail, len(head), ToolList(digest, tools_json)


def joined(response: bytes, tools_at: int | None, tools: bytes | None) -> bytes:
    """The whole Response JSON of a stored row."""
    if tools_at is None or tools is None:
        return response
    return response[:tools_at] + tools + response[tools_at:]


def turns_json(turns: Sequence[ModelTurn]) -> bytes | None:
    """`StoredResponse.model_turns` as a column: `[[outputs_end, ids_end, inputs_after],
    ...]`, or NULL for a response of one model turn."""
    if not turns:
        return None
    return orjson.dumps([[t.outputs_end, t.ids_end, t.inputs_after] for t in turns])


def model_turns(column: bytes | None) -> tuple[ModelTurn, ...]:
    """The `model_turns` column read back."""
    if column is None:
        return ()
    return tuple(ModelTurn(*turn) for turn in orjson.loads(column))


def token_ids(blob: bytes) -> list[int]:
    ids = array("I")
    ids.frombytes(blob)
    return ids.tolist()


def page(rows: Sequence[tuple[str, bytes]], limit: int) -> InputItemPage:
    """An input item page from up to `limit + 1` stored (id, item) rows (one more tells
    whether more follow); the items stay the bytes stored."""
    kept = rows[:limit]
    return InputItemPage(
        items=[item for _, item in kept],
        has_more=len(rows) > limit,
        first_id=kept[0][0] if kept else "",
        last_id=kept[-1][0] if kept else "",
    )


__all__ = [
    "FREED_QUERY",
    "QUARANTINE_COLUMNS",
    "RESPONSE_COLUMNS",
    "USAGE_QUERY",
    "ItemRows",
    "Quarantined",
    "RecordError",
    "Rejected",
    "Row",
    "ToolList",
    "joined",
    "model_turns",
    "page",
    "prepare",
    "quarantined",
    "token_ids",
    "turns_json",
]
