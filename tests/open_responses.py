"""Validation against the Open Responses specification's own schemas: its published
OpenAPI document (tests/data/openresponses-openapi.json, see tests/data/README.md),
checked with `jsonschema`. Responses, compaction objects, and every streamed event by
its `type` (WebSocket errors by the specification's WebSocket error envelope)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import orjson
from jsonschema import Draft202012Validator

SPEC = Path(__file__).parent / "data" / "openresponses-openapi.json"

# Events hotloop sends that the specification does not define, and why.
# - Reasoning text: the openai SDK's models (and gpt-oss clients) name these events
#   `response.reasoning_text.*`; the specification names them `response.reasoning.*`.
#   One name per event: hotloop keeps the SDK's.
# - `response.compaction.compacting`: OpenAI's event for automatic compaction
#   (`context_management`), which the specification does not list.
NOT_IN_SPEC = frozenset(
    {
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.compaction.compacting",
    }
)


@cache
def _document() -> dict[str, Any]:
    document: dict[str, Any] = orjson.loads(SPEC.read_bytes())
    return document


@cache
def validator(schema: str) -> Draft202012Validator:
    """A validator of the component `schema`, its references resolved in the document."""
    root = {"$ref": f"#/components/schemas/{schema}", "components": _document()["components"]}
    return Draft202012Validator(root)


@cache
def _event_schemas() -> dict[str, str]:
    schemas: dict[str, str] = {}
    for name, schema in _document()["components"]["schemas"].items():
        if name.endswith("StreamingEvent"):
            kind = schema["properties"]["type"]["enum"][0]
            schemas[kind] = name
    return schemas


def errors(schema: str, instance: Any) -> list[str]:
    """Every violation of `schema` by `instance`, as `path: message` lines."""
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
        for e in validator(schema).iter_errors(instance)
    ]


def check_response(response: dict[str, Any]) -> None:
    """Raise AssertionError unless `response` is a valid `ResponseResource`."""
    found = errors("ResponseResource", response)
    assert not found, f"Response object breaks the Open Responses schema: {found}"


def check_compaction(resource: dict[str, Any]) -> None:
    found = errors("CompactResource", resource)
    assert not found, f"compaction object breaks the Open Responses schema: {found}"


def check_event(event: dict[str, Any], *, websocket: bool) -> bool:
    """Validate one streamed event by its type; False for the known events the
    specification does not define (`NOT_IN_SPEC`), AssertionError for anything else."""
    kind = event.get("type")
    if kind == "error" and websocket:
        schema = "WebSocketErrorEvent"
    elif kind in NOT_IN_SPEC:
        return False
    else:
        found_schema = _event_schemas().get(str(kind))
        assert found_schema is not None, f"event type {kind!r} is not in the specification"
        schema = found_schema
    found = errors(schema, event)
    assert not found, f"{kind} breaks the Open Responses schema: {found}"
    return True
