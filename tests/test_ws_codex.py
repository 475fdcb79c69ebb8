"""The frames the Codex CLI sends (protocol.md section 10), replayed over a real socket:
its headers, a `generate: false` warm-up with the base prompt and its whole tool list
(including tool types the server cannot run), delta turns chained with
`previous_response_id` and `store: false`, `response.processed` after each response,
and, after a failure, the full history resent on the same socket."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest
from hotloop.engines.sim import SimScript
from sdk_events import validate
from servers import hotloop_server
from websockets.sync.client import ClientConnection, connect

HEADERS = {
    "Authorization": "Bearer sk-codex",
    "OpenAI-Beta": "responses_websockets=2026-02-06",
    "originator": "codex_cli_rs",
    "session-id": "0199a1b2-c3d4",
    "X-Stainless-Lang": "js",
}
SHELL = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}},
        "required": ["cmd"],
        "additionalProperties": False,
    },
}
TOOLS: list[dict[str, Any]] = [
    SHELL,
    {"type": "web_search"},
    {
        "type": "custom",
        "name": "apply_patch",
        "description": "Apply a patch.",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
    },
]
BODY: dict[str, Any] = {
    "type": "response.create",
    "model": "sim",
    "tools": TOOLS,
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199a1b2-c3d4",
    "text": {"verbosity": "low"},
    "client_metadata": {"originator": "codex_cli_rs"},
}
SCRIPT = SimScript(
    text="The tests pass.", tool="exec_command", tool_calls=2, tool_arguments='{"cmd":"ls"}'
)


def turn(ws: ClientConnection, **fields: Any) -> dict[str, Any]:
    ws.send(orjson.dumps({**BODY, **fields}).decode())
    items_done = 0
    while True:
        event = validate(ws.recv())
        if event["type"] == "response.output_item.done":
            items_done += 1
        if event["type"] in ("response.completed", "response.failed", "error"):
            break
    assert event["type"] == "response.completed", event
    response: dict[str, Any] = event["response"]
    # Codex finishes a turn only from output_item.done events, then response.completed.
    assert items_done == len(response["output"])
    ws.send(orjson.dumps({"type": "response.processed", "response_id": response["id"]}).decode())
    return response


def test_codex_session_shape(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hotloop.protocol")
    with hotloop_server(SCRIPT, api_keys=("sk-codex",)) as base:
        url = base.replace("http://", "ws://") + "/v1/responses?client=codex"
        with connect(url, additional_headers=HEADERS) as ws:
            developer = {"type": "message", "role": "developer", "content": "You are Codex."}
            warm = turn(ws, input=[developer], generate=False)
            assert warm["output"] == []
            user = {"type": "message", "role": "user", "content": "run the tests"}
            history: list[dict[str, Any]] = [developer, user]
            response = turn(ws, input=[user], previous_response_id=warm["id"])
            while True:
                history.extend(response["output"])
                calls = [i for i in response["output"] if i["type"] == "function_call"]
                if not calls:
                    break
                result = {"type": "function_call_output", "call_id": calls[0]["call_id"]}
                result["output"] = "ok"
                history.append(result)
                response = turn(ws, input=[result], previous_response_id=response["id"])
                cached = response["usage"]["input_tokens_details"]["cached_tokens"]
                assert cached > 0
            assert response["output"][-1]["content"][0]["text"] == "The tests pass."
            # After a failure Codex resends everything, without previous_response_id.
            again = turn(ws, input=history)
            assert again["previous_response_id"] is None
    # Tools the server cannot run are accepted, and said once per connection.
    skipped = [r.getMessage() for r in caplog.records if "is not rendered" in r.getMessage()]
    assert len(skipped) == 2 and any("web_search" in m for m in skipped)
