"""`TokenCache`: the rendered-token cache on its own, as a tokenizer cache for any service.

Give it a conversation id and the conversation's new items (or more text for its last
item); get back the prompt tokens, rendered through a chat format and tokenized, with
only the new part rendered. The prompt is the conversation so far, without a generation
prompt, for every format (a chat template's render with `add_generation_prompt=False`:
a template that always writes the assistant header, as Llama 3's does, ends with it);
`engine_prompt` adds the generation prompt: the ids an engine is given to answer.
The format is a hand-written one (`ChatFormat.harmony()`,
`ChatFormat.chatml(...)`) or any model's own chat template (`ChatFormat.template(...)`,
or `TokenCache.for_model(tokenizer_path)`), whose prompt equals
`tokenizers.encode(apply_chat_template(...), add_special_tokens=False)` (with
`add_generation_prompt=True` for `engine_prompt`). Conversations
are evicted least recently used once the cache holds more than `max_bytes`.

This module owns the id -> conversation map and its byte bound. Rendering, tokenization
and the chain itself are the compiled core's (`hotloop._core.Conversation`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from hotloop._core import ChatFormat, Conversation, Prompt
from hotloop.chat_template import TemplateChoice

JsonItems = str | bytes | Sequence[Mapping[str, Any]]


def _json(value: JsonItems) -> str:
    """Items as the JSON text the core parses (encoded once, here, if given as objects)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode()
    return orjson.dumps(list(value)).decode()


class TokenCache:
    """Prompt tokens per conversation, appended to instead of recomputed.

    >>> from hotloop import TokenCache
    >>> from hotloop._core import ChatFormat
    >>> cache = TokenCache(ChatFormat.harmony())
    >>> hi = [{"role": "user", "content": "Hi"}]
    >>> first = cache.append("conv-1", hi, instructions="Be brief.")
    >>> later = cache.append("conv-1", [{"role": "assistant", "content": "Hello!"}])
    >>> later.common_prefix_len(first) == len(first)
    True
    >>> answer = cache.engine_prompt("conv-1")  # ... then <|start|>assistant
    >>> answer.common_prefix_len(later) == len(later)
    True
    """

    def __init__(
        self,
        format: ChatFormat,
        *,
        max_bytes: int = 256 * 1024 * 1024,
        context_window: int = 1 << 40,
    ) -> None:
        """`format` renders every conversation; `max_bytes` bounds the memory they hold
        together; `context_window` is the longest prompt a conversation may reach."""
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self._format = format
        self._max_bytes = max_bytes
        self._context_window = context_window
        self._conversations: OrderedDict[str, tuple[Conversation, int]] = OrderedDict()
        self._bytes = 0
        self.evictions = 0
        """Conversations dropped to stay under `max_bytes`."""

    @classmethod
    def for_model(
        cls,
        tokenizer: str,
        chat_template: str = "auto",
        *,
        tool_parser: str = "auto",
        template_kwargs: Mapping[str, Any] | None = None,
        verbatim: bool = False,
        special_tokens_in_content: str = "plain",
        max_bytes: int = 256 * 1024 * 1024,
        context_window: int = 1 << 40,
    ) -> TokenCache:
        """A cache rendering a model's own chat template: `tokenizer` is its vocabulary (a
        tokenizer.json, tekken.json or .gguf path, or a model directory), `chat_template`
        `auto` (the template that comes with it: the GGUF's, or the chat_template.jinja /
        tokenizer_config.json beside the tokenizer.json) or a template path;
        `template_kwargs` are passed to the template (`{"enable_thinking": False}`);
        `special_tokens_in_content`: special-token text in the items is `plain` text,
        `refuse`d (`CoreError` `special_token_in_content`) or `allow`ed as a real token."""
        choice = TemplateChoice(
            template=chat_template,
            tool_parser=tool_parser,
            kwargs_json=None if template_kwargs is None else orjson.dumps(template_kwargs).decode(),
            verbatim=verbatim,
            special_tokens_in_content=special_tokens_in_content,
        )
        return cls(choice.format(tokenizer), max_bytes=max_bytes, context_window=context_window)

    def append(
        self,
        conversation_id: str,
        items: JsonItems = (),
        *,
        instructions: str | None = None,
        tools: JsonItems | None = None,
    ) -> Prompt:
        """Append Responses-API input items (a JSON array or a list of dicts) to the
        conversation, creating it if unknown, and return its prompt (without the
        generation prompt: see `engine_prompt`). `instructions` and
        `tools`, when given, replace the conversation's; when they differ from the cached
        ones the conversation re-renders (counted in `stats(...)["invalidations"]`).
        Raises `CoreError` for invalid items; the conversation is then unchanged."""
        conversation = self._conversation(conversation_id)
        conversation.append_items(
            _json(items),
            instructions=instructions,
            tools_json=None if tools is None else _json(tools),
        )
        return self._touched(conversation_id, conversation)

    def append_text(self, conversation_id: str, chunk: str) -> Prompt:
        """Grow the text of the conversation's last item (a streamed message, a tool output
        arriving in chunks) and return the prompt. Only the end of that text is
        re-tokenized. Raises KeyError for an unknown conversation."""
        conversation = self._get(conversation_id)
        conversation.append_text(chunk)
        return self._touched(conversation_id, conversation)

    def prompt(self, conversation_id: str) -> Prompt:
        """The conversation's prompt tokens, without the generation prompt. Raises
        KeyError for an unknown conversation."""
        conversation = self._get(conversation_id)
        self._conversations.move_to_end(conversation_id)
        return conversation.prompt()

    def engine_prompt(self, conversation_id: str) -> Prompt:
        """The ids an engine is given to answer now: the prompt and the generation prompt
        (the assistant turn's header), for every format: a chat template's render with
        `add_generation_prompt=True`, harmony's `<|start|>assistant`, ChatML's
        `<|im_start|>assistant\n`. The conversation is unchanged (the header is rendered
        on a shared copy), so the next `append` continues from `prompt`. Raises KeyError
        for an unknown conversation."""
        conversation = self._get(conversation_id)
        self._conversations.move_to_end(conversation_id)
        return conversation.engine_prompt()

    def stats(self, conversation_id: str) -> dict[str, int]:
        """The conversation's work counters: for the hand-written formats, segments/tokens
        rendered and reused and invalidations; for a chat template, full and window
        renders, `rewrites` (turns where the template rewrote earlier text), tokens kept
        and encoded."""
        return self._get(conversation_id).stats

    def forget(self, conversation_id: str) -> None:
        """Drop a conversation (no error if unknown)."""
        entry = self._conversations.pop(conversation_id, None)
        if entry is not None:
            self._bytes -= entry[1]

    @property
    def memory_bytes(self) -> int:
        """Bytes held by all cached conversations."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._conversations)

    def __contains__(self, conversation_id: object) -> bool:
        return conversation_id in self._conversations

    def _get(self, conversation_id: str) -> Conversation:
        entry = self._conversations.get(conversation_id)
        if entry is None:
            raise KeyError(conversation_id)
        return entry[0]

    def _conversation(self, conversation_id: str) -> Conversation:
        entry = self._conversations.get(conversation_id)
        if entry is not None:
            return entry[0]
        conversation = Conversation(self._format, context_window=self._context_window)
        self._conversations[conversation_id] = (conversation, 0)
        return conversation

    def _touched(self, conversation_id: str, conversation: Conversation) -> Prompt:
        """Re-measure a conversation after a change, mark it most recently used, and evict
        the least recently used others while the cache is over its bound."""
        size = conversation.memory_bytes
        self._bytes += size - self._conversations[conversation_id][1]
        self._conversations[conversation_id] = (conversation, size)
        self._conversations.move_to_end(conversation_id)
        while self._bytes > self._max_bytes and len(self._conversations) > 1:
            _, (_, dropped) = self._conversations.popitem(last=False)
            self._bytes -= dropped
            self.evictions += 1
        return conversation.prompt()
