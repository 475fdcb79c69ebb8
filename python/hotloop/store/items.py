"""Input items in the form `GET /v1/responses/{id}/input_items` returns them.

Requests may send items in their short forms (a string `content`, no `type`, no `id`);
the list endpoint returns full items the SDK's `ResponseItem` models accept. Items the
client sent without an id get a stable one derived from the response id and position,
so the same item has the same id on every read and pagination cursors stay valid.
"""

from __future__ import annotations

from typing import Any

import orjson

_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


def listed_items(response_id: str, input_items: bytes) -> list[dict[str, Any]]:
    """The input items of `response_id` (a JSON array as stored), in wire form."""
    suffix = response_id.removeprefix("resp_")
    items: list[dict[str, Any]] = orjson.loads(input_items)
    return [_listed(item, suffix, position) for position, item in enumerate(items)]


def _listed(item: dict[str, Any], suffix: str, position: int) -> dict[str, Any]:
    kind = item.get("type") or ("message" if "role" in item else "item")
    listed = dict(item, type=kind)
    listed.setdefault("id", f"{_ID_PREFIX.get(kind, 'item')}_{suffix}_{position}")
    if kind == "message":
        listed["content"] = _message_content(listed.get("role"), listed.get("content"))
        listed.setdefault("status", "completed")
    elif kind in ("function_call", "function_call_output"):
        listed.setdefault("status", "completed")
    elif kind == "reasoning":
        listed.setdefault("summary", [])
    return listed


def _message_content(role: object, content: object) -> list[Any]:
    assistant = role == "assistant"
    if isinstance(content, str):
        part: dict[str, Any] = {"type": "output_text" if assistant else "input_text"}
        part["text"] = content
        if assistant:
            part["annotations"] = []
        return [part]
    if not isinstance(content, list):
        return []
    if not assistant:
        return content
    # Output text parts carry `annotations` on the wire, even when the client omitted them.
    return [
        dict(part, annotations=part.get("annotations", []))
        if isinstance(part, dict) and part.get("type") == "output_text"
        else part
        for part in content
    ]


def page_of(
    items: list[dict[str, Any]], *, ascending: bool, limit: int, after: str | None
) -> tuple[list[dict[str, Any]], bool]:
    """The page after the item `after` (None: from the start) in the given order, and
    whether more follow: the in-memory twin of the database's indexed query."""
    ordered = items if ascending else items[::-1]
    start = 0
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            return [], False
        start = ids.index(after) + 1
    return ordered[start : start + limit], len(ordered) > start + limit
