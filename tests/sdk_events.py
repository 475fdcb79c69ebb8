"""Strict validation of server frames with the openai SDK's own pydantic models."""

from __future__ import annotations

from typing import Any

import orjson
from openai.types.responses.responses_server_event import ResponsesServerEvent
from pydantic import TypeAdapter

SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(ResponsesServerEvent)


def validate(frame: bytes | str) -> dict[str, Any]:
    """Validate one frame against the SDK's union of WebSocket server events (strict
    types, discriminated by `type`) and return it as a dict."""
    SERVER_EVENT.validate_json(frame, strict=True)
    event: dict[str, Any] = orjson.loads(frame)
    return event
