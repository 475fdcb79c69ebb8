"""`TokenCache`: the rendered-token cache on its own, as a tokenizer cache for any service.

Give it a conversation id and the conversation's new items (or more text for its last
item); get back the prompt tokens, rendered through a chat format and tokenized, with
only the new part rendered. Or give it a whole conversation each time, as a stateless
front end receives it (`engine_prompt_for`): it continues from the longest conversation
it rendered before that the new one starts with (found by the content addresses of its
items, `hotloop.protocol.history`), with no id to manage. The prompt is the
conversation so far, without a generation prompt, for every format (a chat template's
render with `add_generation_prompt=False`: a template that always writes the assistant
header, as Llama 3's does, ends with it); `engine_prompt` adds the generation prompt:
the ids an engine is given to answer. The format is a hand-written one
(`ChatFormat.harmony()`, `ChatFormat.chatml(...)`) or any model's own chat template
(`ChatFormat.template(...)`, or `TokenCache.for_model(tokenizer_path)`), whose prompt
equals `tokenizers.encode(apply_chat_template(...), add_special_tokens=False)` (with
`add_generation_prompt=True` for `engine_prompt`). Conversations and states
are evicted least recently used once the cache holds more than `max_bytes`.

This module owns the id -> conversation map, the content address -> state map of whole
conversations, and their byte bound. Rendering, tokenization
and the chain itself are the compiled core's (`hotloop._core.Conversation`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from hotloop._core import (
    ChatFormat,
    Checkpoint,
    Conversation,
    Prompt,
    SeenItems,
    parse_request,
)
from hotloop.chat_template import TemplateChoice
from hotloop.protocol.history import longest

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
        self._states: OrderedDict[bytes, tuple[Checkpoint, int]] = OrderedDict()
        self._seen = SeenItems()
        """The raw addresses of the conversations whose states `_states` holds: their
        items sent again byte for byte are not parsed again (`hotloop.protocol.history`)."""
        """Whole conversations' states by content address (`engine_prompt_for`)."""
        self._bytes = 0
        self.evictions = 0
        """Conversations and states dropped to stay under `max_bytes`."""
        self.reused_tokens = 0
        """Tokens `engine_prompt_for` took from states it held instead of rendering them."""

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

    def engine_prompt_for(
        self,
        items: JsonItems,
        *,
        instructions: str | None = None,
        tools: JsonItems | None = None,
    ) -> Prompt:
        """The engine prompt (with the generation prompt, as `engine_prompt`) of a whole
        conversation: Responses-API input items, or chat messages with `role` and string
        `content`, as a stateless front end receives them every turn. Only what no held
        state covers is rendered: the longest conversation rendered before (with the same
        instructions and tools) that this one starts with is continued, matched by each
        item's parsed form, so a new turn renders only its new items whatever the JSON's
        spelling. The ids are those of a full render. Raises `CoreError` for invalid items
        or tools."""
        body = b'{"input":' + _json(items).encode()
        if instructions is not None:
            body += b',"instructions":' + orjson.dumps(instructions)
        if tools is not None:
            body += b',"tools":' + _json(tools).encode()
        request = parse_request(body + b"}", None, self._seen)
        if request.error is not None:
            raise request.error
        skip, address, state = longest(request, self._states.get)
        whole = None if state is not None else request.parse_whole()
        if whole is not None:
            # What its bytes were recognized as was evicted meanwhile: parsed whole.
            request = whole
            skip, address, state = longest(request, self._states.get)
        request.settle()
        if state is None:
            conversation = Conversation(self._format, context_window=self._context_window)
        else:
            self._states.move_to_end(address)
            conversation = state[0].fork()
        turn = conversation.extend(request, skip)
        self.reused_tokens += turn.cached_tokens
        checkpoint = conversation.checkpoint()
        end = request.history_digests()[-1]
        held = self._states.pop(end, None)
        self._bytes += checkpoint.memory_bytes - (0 if held is None else held[1])
        self._states[end] = (checkpoint, checkpoint.memory_bytes)
        self._seen.remember(request)
        self._bound()
        return conversation.prompt()

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
        """Bytes held by all cached conversations and states."""
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
        self._bound()
        return conversation.prompt()

    def _bound(self) -> None:
        """Evict while over `max_bytes`: whole conversations' states first (a miss only
        renders again), least recently used first; then conversations by id, the one just
        used always kept."""
        while self._bytes > self._max_bytes and (self._states or len(self._conversations) > 1):
            if self._states:
                address, (_, dropped) = self._states.popitem(last=False)
                self._seen.forget(address)
            else:
                _, (_, dropped) = self._conversations.popitem(last=False)
            self._bytes -= dropped
            self.evictions += 1
