"""Strict validation of server frames with the openai SDK's own pydantic models."""

from __future__ import annotations

from typing import Any, Literal

import orjson
from openai.types.beta.beta_responses_server_event import BetaResponsesServerEvent
from openai.types.responses.responses_server_event import ResponsesServerEvent
from pydantic import BaseModel, ConfigDict, TypeAdapter

SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(ResponsesServerEvent)
BETA_SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(BetaResponsesServerEvent)
INJECT_EVENTS = {"response.inject.created", "response.inject.failed"}
# protocol.md section 8's `response.inject.failed` codes the beta SDK's enum lacks
# (it has response_already_completed and response_not_found), and the queue bounds'.
INJECT_CODES = {"invalid_input", "websocket_queue_limit_reached", "queue_memory_exceeded"}
# `incomplete_details.reason` values of section 8 the SDK's enum lacks.
REASONS = {"interrupted", "idle_timeout", "connection_closing"}


def validate(frame: bytes | str) -> dict[str, Any]:
    """Validate one frame against the SDK's union of WebSocket server events (strict
    types, discriminated by `type`) and return it as a dict. Codex's interrupt frames,
    which the SDK does not model, are checked against `CODEX_EVENTS`; the SDK's enum of
    `incomplete_details.reason` lacks Codex's `interrupted`, so such a terminal is
    checked with every other field strict and that one value allowed. The beta
    injection events are checked against the SDK's beta models, the same way for the
    error codes their enum lacks (`INJECT_CODES`); so are the long-running response's
    `idle_timeout` and `connection_closing`."""
    event: dict[str, Any] = orjson.loads(frame)
    codex = CODEX_EVENTS.get(event["type"])
    reason = ((event.get("response") or {}).get("incomplete_details") or {}).get("reason")
    if codex is not None:
        codex.model_validate_json(frame, strict=True)
    elif event["type"] in INJECT_EVENTS:
        code = (event.get("error") or {}).get("code")
        if code in INJECT_CODES:
            known = {**event, "error": {**event["error"], "code": "response_not_found"}}
            BETA_SERVER_EVENT.validate_json(orjson.dumps(known), strict=True)
        else:
            BETA_SERVER_EVENT.validate_json(frame, strict=True)
    elif reason in REASONS:
        known = {**event, "response": {**event["response"], "incomplete_details": None}}
        SERVER_EVENT.validate_json(orjson.dumps(known), strict=True)
    else:
        SERVER_EVENT.validate_json(frame, strict=True)
    return event


class _InterruptAccepted(BaseModel):
    """Codex's `response.interrupt.accepted` (not in the openai SDK)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["response.interrupt.accepted"]
    response_id: str
    sequence_number: int
    stream_id: str | None = None


class _ItemInterrupted(BaseModel):
    """Codex's `response.output_item.interrupted` (not in the openai SDK)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["response.output_item.interrupted"]
    output_index: int
    item_id: str
    sequence_number: int
    stream_id: str | None = None


CODEX_EVENTS: dict[str, type[BaseModel]] = {
    "response.interrupt.accepted": _InterruptAccepted,
    "response.output_item.interrupted": _ItemInterrupted,
}


def final(conn: Any) -> Any:
    """Read an SDK WebSocket connection (`client.responses.connect()`) up to the
    response's terminal event and return the response; an `error` event fails."""
    for event in conn:
        if event.type in ("response.completed", "response.failed", "response.incomplete"):
            return event.response
        assert event.type != "error", event
    raise AssertionError("the socket closed before a terminal event")
