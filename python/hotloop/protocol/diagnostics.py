"""`prompt_cache_diagnostics`: a new response's prompt against the token sequence of the
response named by `prompt_cache_options.comparison_response_id`.

hotloop holds both sequences exactly (the comparison's checkpoint in the cache, the new
turn's prompt), so it says how many tokens of the new prompt were reusable, the index of
the first token that differs, and the part of the prompt it falls in: `instructions`,
`tools` (in the order chatml and harmony render them, before any item), an input item
(`input[i]`, for a request that sends its whole history), or `history` / `input` for a
continuation (`previous_response_id`: the chain before the new items, the new items).
The shapes are the openai SDK's (`cache_hit`, `cache_miss` with `reason`,
`cache_missed_tokens`, `comparison_reusable_tokens`, `comparison_response_not_found`);
`first_difference` and `part` are hotloop's.
"""

from __future__ import annotations

from typing import Any

import orjson

from hotloop._core import Checkpoint, Conversation, CoreError, CreateRequest, Prompt, Turn


def diagnose(
    fresh: Conversation,
    request: CreateRequest,
    prompt: Prompt,
    turn: Turn,
    compared: Checkpoint | None,
) -> dict[str, Any]:
    """The diagnostics of `prompt` (rendered for `request`, its `turn`) against the
    checkpoint `compared` (None: not found for this caller). `fresh` is an empty
    conversation of the server's format, rendered into to find the parts' ends."""
    if compared is None:
        return {"type": "comparison_response_not_found"}
    before = compared.fork().prompt()
    reusable = prompt.common_prefix_len(before)
    if reusable >= compared.token_count:
        return {"type": "cache_hit", "comparison_reusable_tokens": reusable}
    part = _part(fresh, request, turn, reusable)
    return {
        "type": "cache_miss",
        "reason": "tools_changed" if part == "tools" else "input_changed",
        "cache_missed_tokens": len(prompt) - reusable,
        "comparison_reusable_tokens": reusable,
        "first_difference": reusable,
        "part": part,
    }


def _part(fresh: Conversation, request: CreateRequest, turn: Turn, index: int) -> str:
    """The part of the new prompt token `index` is in."""
    fields = orjson.loads(request.response_fields_json)
    instructions = fields.get("instructions")
    tools = orjson.dumps(fields.get("tools") or []).decode()
    try:
        fresh.append_items("[]", instructions=instructions, tools_json="[]")
        alone = fresh.prompt()
        fresh.append_items("[]", tools_json=tools)
        # The tools may render inside the instructions' message (chatml's system turn):
        # the instructions end where the two renders part.
        if index < alone.common_prefix_len(fresh.prompt()):
            return "instructions"
        if index < fresh.token_count:
            return "tools"
        if request.previous_response_id is not None:
            # A continuation: the parent's chain, then the new items.
            return "history" if index < turn.prompt_tokens - turn.new_tokens else "input"
        for i, item in enumerate(orjson.loads(request.input_json)):
            fresh.append_items(orjson.dumps([item]).decode())
            if index < fresh.token_count:
                return f"input[{i}]"
    except CoreError:
        # An item that renders only in context (a tool output without its call, in
        # isolation): the difference is in the input.
        return "input"
    # Past every item: the assistant turn's header (the template or the tokenizer).
    return "template"


__all__ = ["diagnose"]
