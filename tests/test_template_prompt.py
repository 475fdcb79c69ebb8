"""The generic chat-template path (`hotloop._core.TemplatePrompt`) against the
hand-written ChatML format and the reference renderer.

SmolLM2's own template (from its GGUF) and the Qwen2.5 tool template render the golden
ChatML cases to the same ids as `ChatFormat.chatml` (the golden ids are llama.cpp's,
tests/test_format_chatml.py); Responses items become the messages vLLM builds; a
multi-turn conversation stays equal to a from-scratch render + encode; the template's
tool-call parser reads the model's calls back.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hotloop import _core
from hotloop.lab.hf_template import HfTemplate
from hotloop.lab.open_model import QWEN_TOOLS_TEMPLATE
from test_format_chatml import (
    GOLDEN,
    SMOLLM2_SYSTEM,
    llama_tokens,
    reference_messages,
    reference_tools,
    smollm2_path,
)


def smollm2_template(case: dict[str, Any]) -> _core.ChatTemplate:
    if reference_tools(case) is None:
        return _core.ChatTemplate.from_gguf(smollm2_path())
    return _core.ChatTemplate.from_source("qwen2.5-tools", QWEN_TOOLS_TEMPLATE)


def golden_cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads(GOLDEN.read_text())
    return cases


def test_smollm2_template_gives_the_chatml_ids() -> None:
    tokenizer = _core.Tokenizer.from_gguf(smollm2_path())
    for case in golden_cases():
        tools = reference_tools(case)
        prompt = _core.TemplatePrompt(
            smollm2_template(case),
            tokenizer,
            tools_json=json.dumps(tools) if tools else None,
            kwargs_json=json.dumps({"default_system": SMOLLM2_SYSTEM}),
        )
        prompt.push_messages(json.dumps(reference_messages(case)))
        prompt.prompt(True)
        assert prompt.text == case["text"], case["name"]
        assert prompt.ids == case["tokens"], case["name"]


def test_responses_items_become_the_messages_vllm_builds() -> None:
    tokenizer = _core.Tokenizer.from_gguf(smollm2_path())
    template = _core.ChatTemplate.from_source("qwen2.5-tools", QWEN_TOOLS_TEMPLATE)
    for case in golden_cases():
        if any(i.get("role") == "developer" for i in case["items"]):
            continue  # vLLM keeps `developer`; the golden reference maps it to `system`.
        prompt = _core.TemplatePrompt(
            template, tokenizer, instructions=case["prefix"].get("instructions")
        )
        items = [
            {"type": "message", "role": i["role"], "content": i["text"]}
            if i["type"] == "message"
            else i
            for i in case["items"]
        ]
        prompt.push_items(json.dumps(items))
        got = json.loads(prompt.messages_json)
        for message in got:
            for call in message.get("tool_calls", []):
                assert call.pop("id")
            message.pop("tool_call_id", None)
        assert got == reference_messages(case), case["name"]


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_turn_by_turn_prompt_equals_the_reference_render_and_encode() -> None:
    """Five agent turns through the Qwen2.5 tool template: each prompt equals jinja2's
    render of all messages tokenized from scratch; append-stable, so the window is used."""
    tokenizer = _core.Tokenizer.from_gguf(smollm2_path())
    template = _core.ChatTemplate.from_source("qwen2.5-tools", QWEN_TOOLS_TEMPLATE)
    prompt = _core.TemplatePrompt(
        template,
        tokenizer,
        instructions="Be brief.",
        tools_json=json.dumps([WEATHER]),
        kwargs_json=json.dumps({"default_system": SMOLLM2_SYSTEM}),
        check_every=2,
    )
    reference = HfTemplate(QWEN_TOOLS_TEMPLATE)
    chat_tools = [
        {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    ]
    for turn in range(5):
        items: list[dict[str, Any]] = [
            {"type": "message", "role": "user", "content": f"Weather {turn}?"},
        ]
        if turn:
            items = [
                {
                    "type": "function_call",
                    "call_id": f"c{turn}",
                    "name": "get_weather",
                    "arguments": '{"city": "Oslo"}',
                },
                {"type": "function_call_output", "call_id": f"c{turn}", "output": f"{turn} °C\n"},
                {"type": "message", "role": "assistant", "content": "Noted."},
                *items,
            ]
        prompt.push_items(json.dumps(items))
        before = len(prompt)
        kept = prompt.prompt(True)
        text = reference.render(
            json.loads(prompt.messages_json),
            tools=chat_tools,
            add_generation_prompt=True,
            default_system=SMOLLM2_SYSTEM,
        )
        assert prompt.text == text
        assert prompt.ids == llama_tokens(text)
        assert turn == 0 or kept >= before - 4
    assert prompt.stability == (True, None)
    stats = prompt.stats
    # The first two turns change messages next to the first one: rendered whole.
    assert stats["full_renders"] == 2 and stats["window_renders"] == 3, stats
    assert stats["window_mismatches"] == 0


def test_the_templates_tool_parser_reads_calls_back() -> None:
    tokenizer = _core.Tokenizer.from_gguf(smollm2_path())
    template = _core.ChatTemplate.from_source("qwen2.5-tools", QWEN_TOOLS_TEMPLATE)
    assert template.tool_parser == "hermes"
    prompt = _core.TemplatePrompt(
        template, tokenizer, kwargs_json=json.dumps({"default_system": SMOLLM2_SYSTEM})
    )
    prompt.push_messages(json.dumps([{"role": "user", "content": "hi"}]))
    prompt.prompt(True)
    parser = prompt.parser()
    call = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    sampled = [
        *tokenizer.encode(f"Checking.\n<tool_call>\n{call}\n</tool_call>"),
        tokenizer.special("<|im_end|>"),
    ]
    events = parser.feed(sampled)
    done, outcome, message = parser.finish()
    assert outcome == "stopped", message
    calls = [e for e in events + done if e[0] == "call_done"]
    assert [(c[2], json.loads(c[4])) for c in calls] == [("get_weather", {"city": "Oslo"})]


def test_unknown_tool_parser_and_bad_templates_are_refused() -> None:
    tokenizer = _core.Tokenizer.from_gguf(smollm2_path())
    template = _core.ChatTemplate.from_source("t", "{{ messages }}")
    with pytest.raises(_core.CoreError) as bad_parser:
        _core.TemplatePrompt(template, tokenizer, tool_parser="nope")
    assert bad_parser.value.code == "invalid_value"
    with pytest.raises(_core.CoreError) as bad_template:
        _core.ChatTemplate.from_source("t", "{% if %}")
    assert bad_template.value.code == "invalid_template"
    raising = _core.ChatTemplate.from_source("t", "{{ raise_exception('no system role') }}")
    with pytest.raises(_core.CoreError) as raised:
        raising.render("[]")
    assert raised.value.code == "template_error" and "no system role" in raised.value.message
