"""Codex's `response.interrupt` (protocol.md section 8): the response stops at once, its
partial items are discarded (`response.output_item.interrupted`), and it stays
continuable with only its completed items, rendered as the model would have sampled
them. A stateless transition of one running response, over the port of the responses
(`ResponsePort`: finding it, refusing).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from hotloop._core import Checkpoint, CoreError
from hotloop.events import qualified_name
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.response import Response, ResponsePort
from hotloop.protocol.state import State

log = logging.getLogger("hotloop.protocol")


def interrupt(port: ResponsePort, event: dict[str, Any]) -> None:
    """`response.interrupt` (decoded): the running (or waiting) response it names ends
    `response.incomplete` (reason `interrupted`); an error when there is none."""
    response_id = event.get("response_id")
    if not isinstance(response_id, str):
        port.refuse(
            ProtocolError("missing_required_parameter", "response_id is required.", "response_id")
        )
        return
    if event.get("mode", "discard_partial_items") != "discard_partial_items":
        port.refuse(ProtocolError("invalid_value", "mode must be 'discard_partial_items'.", "mode"))
        return
    target = port.running(response_id)
    if target is None:
        # Crossed its terminal event on the wire, or never existed here: an error,
        # never silence, so a client waiting for an answer does not hang.
        port.refuse(port.not_running(response_id))
        return
    waiting = target.state is State.WAITING_FOR_TOOLS
    target.stop()
    events = target.events
    port.emit(events.event("response.interrupt.accepted", response_id=response_id))
    completed = {item["id"] for item in events.output}
    for index, item_id in sorted(events.open_items(completed)):
        port.emit(
            events.event("response.output_item.interrupted", output_index=index, item_id=item_id)
        )
    usage = target.usage()
    if target.compaction is not None and target.compaction.before is not None:
        # Interrupted while summarizing: the turn as rendered before (no instruction
        # to summarize) is what stays warm, as the store rebuilds it.
        target.conversation, target.turn = target.compaction.before
    # A waiting response's model turn is committed already: nothing is partial.
    checkpoint = target.conversation.checkpoint() if waiting else completed_checkpoint(target)
    target.terminal(
        "response.incomplete",
        "incomplete",
        usage,
        checkpoint,
        incomplete_reason="interrupted",
    )


def completed_checkpoint(response: Response) -> Checkpoint | None:
    """The conversation with only the model turn's completed items as its output,
    rendered as the model would have sampled them (the partial tokens are gone); the
    items are the ones the client saw, so a function call keeps its call id."""
    texts: dict[str, list[str]] = {"message": [], "reasoning": []}
    calls = []
    completed = response.events.output[response.first_item :]
    for item in completed:
        if item["type"] == "function_call":
            calls.append((qualified_name(item), item["arguments"]))
        else:
            texts[item["type"]].append(item["content"][0]["text"])
    # Several items of one kind (a preamble, then more text) become one.
    text, reasoning = ("\n\n".join(texts[kind]) or None for kind in ("message", "reasoning"))
    chat_format = response.port.settings.chat_format
    try:
        response.conversation.commit_items(
            orjson.dumps(completed).decode(),
            chat_format.completion_tokens(text=text, reasoning=reasoning, calls=calls),
        )
    except CoreError as e:
        log.warning(
            "interrupted response %s is not continuable: %s", response.events.response_id, e
        )
        return None
    return response.conversation.checkpoint()
