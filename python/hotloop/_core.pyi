"""Type stubs for hotloop._core, the compiled core (rust/src/bindings/).

This file is the contract between the Rust core and the Python layer: the server codes
against exactly these names. Keep it in step with bindings/.
"""

from collections.abc import Sequence
from typing import Literal

__version__: str

class CoreError(ValueError):
    """Every failure of the core: a stable `code`, an actionable `message`, and `param`,
    the place in the request (`input[3].call_id`, `tools[0].parameters`) or None."""

    code: str
    message: str
    param: str | None

# ---------------------------------------------------------------- tokenizers

class Tokenizer:
    """A BPE tokenizer. Text is always encoded as plain text: `<|end|>` inside a string
    is ordinary bytes, never a special token."""

    @staticmethod
    def openai(name: str) -> Tokenizer:
        """`o200k_base`, `o200k_harmony` or `cl100k_base` (embedded, no download)."""
    @staticmethod
    def from_gguf(path: str) -> Tokenizer:
        """BPE from a GGUF file's tokenizer metadata (header only)."""
    @staticmethod
    def from_tokenizer_json(data: str | bytes) -> Tokenizer:
        """BPE from a Hugging Face `tokenizer.json`."""
    @staticmethod
    def from_tekken(data: str | bytes) -> Tokenizer:
        """Mistral tekken BPE from a `tekken.json`."""
    @staticmethod
    def from_sentencepiece_model(data: bytes) -> Tokenizer:
        """SentencePiece BPE from a `.model` file's bytes."""
    @property
    def name(self) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str:
        """Decode; invalid UTF-8 becomes U+FFFD."""
    def decode_bytes(self, ids: Sequence[int]) -> bytes: ...
    def special(self, name: str) -> int | None: ...

class StreamDecoder:
    """Token ids in, UTF-8 text deltas out; never splits a multi-byte character."""

    def __init__(self, tokenizer: Tokenizer) -> None: ...
    def feed(self, ids: Sequence[int]) -> str: ...
    def finish(self) -> str: ...

class IncrementalText:
    """A growing text that keeps its token ids: appending a chunk re-encodes only the
    last pre-tokenizer pieces (rust/src/tokenizer/incremental.rs)."""

    def __init__(self, tokenizer: Tokenizer, text: str = "") -> None: ...
    def push(self, chunk: str) -> int:
        """Append `chunk`; returns the index of the first id that changed."""
    @property
    def text(self) -> str: ...
    def ids(self) -> list[int]: ...
    def ids_from(self, start: int) -> list[int]: ...
    def __len__(self) -> int: ...
    @property
    def fallbacks(self) -> int:
        """Appends whose overlap check failed and re-encoded the whole text."""

# ---------------------------------------------------------------- chat formats

class ChatFormat:
    @staticmethod
    def harmony() -> ChatFormat:
        """gpt-oss's harmony format over `o200k_harmony`."""
    @staticmethod
    def chatml(tokenizer: Tokenizer, default_system: str | None = None) -> ChatFormat:
        """ChatML (SmolLM2, Qwen) with `<tool_call>` tool calls. `default_system` is the
        system message the model's template inserts when the conversation has none."""
    @staticmethod
    def template(
        template: ChatTemplate,
        tokenizer: Tokenizer,
        *,
        kwargs_json: str | None = None,
        tool_parser: str | None = None,
        verbatim: bool = False,
        window: bool = True,
        check_every: int = 64,
        special_tokens_in_content: str = "plain",
    ) -> ChatFormat:
        """The generic format: the model's own chat template over its vocabulary, the
        prompt equal to `tokenizers.encode(render(messages), add_special_tokens=False)`
        and built by difference (see `TemplatePrompt`). `kwargs_json`: template kwargs
        (`{"enable_thinking": false}`); `tool_parser`: a parser name, None or `auto`
        for the template's own; `verbatim`: keep the model's sampled ids where the
        template renders them unchanged; `special_tokens_in_content`: special-token
        text in the input is `plain` text, `refuse`d (CoreError
        `special_token_in_content`) or `allow`ed as a real token. Raises CoreError when
        the vocabulary has no end-of-turn token."""
    @property
    def name(self) -> str:
        """`harmony`, `chatml` or `template:<template name>`."""
    @property
    def tokenizer(self) -> Tokenizer: ...
    @property
    def stop_tokens(self) -> list[int]: ...
    @property
    def tool_parser(self) -> str | None:
        """A template format's tool-call parser (`hermes`, ...); None for the others."""
    def completion_tokens(
        self,
        *,
        text: str | None = None,
        reasoning: str | None = None,
        calls: Sequence[tuple[str, str]] = (),
    ) -> list[int]:
        """The ids a model would sample after the generation header to answer with this
        reasoning, text and function calls (`(name, arguments_json)` pairs), ending with a
        stop token. The simulated engine speaks through this."""

# ---------------------------------------------------------------- requests

class Limits:
    """Per-request bounds checked while parsing (all in bytes or counts)."""

    def __init__(
        self,
        *,
        max_items: int = 10_000,
        max_text_bytes: int = 10 * 1024 * 1024,
        max_tools: int = 512,
        max_tools_bytes: int = 2 * 1024 * 1024,
        images: bool = False,
    ) -> None:
        """`images`: the model takes images, so `input_image` parts of user messages are
        accepted (each renders as `[image]`); otherwise they are refused with
        `unsupported_content` at the part."""

class Policy:
    """The built-in content policy: a multi-pattern matcher over new text only."""

    def __init__(self, patterns: Sequence[str], *, case_insensitive: bool = True) -> None: ...
    def check(self, request: CreateRequest) -> None:
        """Raise CoreError `content_policy_violation` (param: the offending text, e.g.
        `input[2].content[0].text`) if the request's instructions or input hit a pattern.
        Case-insensitive matching folds ASCII letters only."""

class CreateRequest:
    """A parsed `response.create` event (flat or nested form) or a `POST /v1/responses`
    body. Parsing never raises for a schema problem: `error` holds it, so the server can
    still echo `stream_id`."""

    type: Literal["response.create"]
    error: CoreError | None
    model: str | None
    previous_response_id: str | None
    conversation: str | None
    """The conversation's id (`conversation` as a string or `{"id": ...}`)."""
    stream_id: str | None
    store: bool
    generate: bool
    background: bool
    stream: bool
    instructions: str | None
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    reasoning_effort: str | None
    compact_threshold: int | None
    """`context_management`'s `compact_threshold`: compact when the prompt passes it."""
    prompt_cache_key: str | None
    """The conversation's name for routing, beside the session headers."""
    comparison_response_id: str | None
    """`prompt_cache_options.comparison_response_id`: asks for `prompt_cache_diagnostics`."""
    compaction_trigger: bool
    """The input ended with `{"type": "compaction_trigger"}`: compact the conversation."""
    input_item_count: int
    input_bytes: int
    frame_bytes: int
    """Bytes of the frame or HTTP body it came in: its parse and render cost grow with
    them (input, tools, instructions), so the server decides by them where they run."""
    skipped_tools: list[tuple[str, str | None]]
    """Tools of types this server does not run, `(type, name)`: accepted, not rendered."""
    prefix_digest: bytes
    """The content address (16 bytes) of what the format renders before the items:
    instructions, function tools, namespaces, reasoning effort."""
    seen_items: int
    """The leading input items recognized by their bytes (`parse_request`'s `seen`), not
    parsed: `history_digests` starts after them, and the request renders only on a
    state that holds them (else `parse_whole`)."""
    def history_digests(self, start: bytes | None = None) -> list[bytes]:
        """The chained content addresses (16 bytes each) after each parsed input item,
        starting from `start` (a parent state's address; when None, the address after
        the `seen_items`, `prefix_digest` when there are none), `start` first:
        `input_item_count - seen_items + 1` of them. Two requests whose items parse to
        the same items get the same addresses, whatever their JSON spelling."""
    def parse_whole(self) -> CreateRequest | None:
        """The request parsed again whole (no state is left of its `seen_items`); None
        when it has none or was settled."""
    def settle(self) -> None:
        """Where the request starts is settled: the body kept for `parse_whole` goes."""
    def text_bytes(self, first: int = 0) -> int:
        """Bytes of text in the input items from item `first` on (what rendering them
        costs grows with)."""
    @property
    def input_json(self) -> str:
        """The input as a JSON array of items (a string input becomes one user message)."""
    @property
    def response_fields_json(self) -> str:
        """A JSON object with the request fields a Response echoes, nulls and defaults
        filled in: frequency_penalty, instructions, max_output_tokens, max_tool_calls,
        metadata, model, parallel_tool_calls, presence_penalty, previous_response_id,
        prompt_cache_key (and prompt_cache_retention, prompt_cache_options when sent),
        reasoning, safety_identifier, service_tier, store, temperature,
        text, tool_choice, tools (function tools with description, parameters and strict),
        top_logprobs, top_p, truncation."""

class CancelEvent:
    type: Literal["response.cancel"]
    response_id: str | None
    stream_id: str | None

class ProcessedEvent:
    type: Literal["response.processed"]
    response_id: str | None

class AppendEvent:
    type: Literal["response.append"]
    response_id: str | None
    error: CoreError | None
    input_json: str

class UnknownEvent:
    type: str
    stream_id: str | None

ClientEvent = CreateRequest | CancelEvent | ProcessedEvent | AppendEvent | UnknownEvent

def parse_event(frame: str | bytes, limits: Limits | None = None) -> ClientEvent:
    """Parse one client frame. Raises CoreError `invalid_json` for malformed JSON or a
    frame that is not an object with a string `type`."""

class Body:
    """A request body written as its pieces arrive, into a buffer the process reuses (a
    bounded pool of what earlier large bodies left: a history resent each turn maps no
    fresh pages), then sealed and parsed as `bytes` is. Read (`bytes(body)`, `in`) only
    once sealed."""

    POOLED_BYTES: int
    """Bodies declared at least this long are worth a `Body` (below it the C allocator's
    heap recycles their memory anyway)."""

    def __init__(self, size: int) -> None:
        """A body declared `size` bytes long."""
    def write(self, piece: bytes) -> None:
        """Append a piece. Raises CoreError `invalid_value` once sealed."""
    def seal(self) -> None:
        """No more pieces: the body can be read and parsed."""
    def __len__(self) -> int: ...
    def __bytes__(self) -> bytes: ...
    def __contains__(self, needle: bytes) -> bool: ...
    @staticmethod
    def pooled() -> tuple[int, int]:
        """Idle pooled buffers and their bytes, process-wide."""
    @staticmethod
    def release_pool() -> None:
        """Free every idle pooled buffer (a heap trim's first step)."""

def parse_request(
    body: str | bytes | Body, limits: Limits | None = None, seen: SeenItems | None = None
) -> CreateRequest:
    """Parse an HTTP `POST /v1/responses` body (no `type` field). With `seen` (the API
    key's), a request that continues no response or conversation has the leading `input`
    elements a request the key sent (and `seen` remembered) had, byte for byte, hashed
    and not parsed (`CreateRequest.seen_items`)."""

class SeenItems:
    """One API key's raw addresses: each remembered request's `input` elements hashed as
    sent, chained after its prefix, naming the history digest of its items."""

    def __init__(self) -> None: ...
    def remember(self, request: CreateRequest) -> bool:
        """Remember the raw address of `request` (parsed with this map), naming the state
        of its whole input. Returns whether it had one."""
    def forget(self, digest: bytes) -> None:
        """Forget the raw addresses naming history digest `digest` (its state left the
        cache)."""
    def clear(self) -> None: ...
    def __len__(self) -> int: ...

class ChatRequest:
    """A `POST /v1/chat/completions` body parsed (`parse_chat_request`)."""

    request: CreateRequest
    """The request it is served as: its messages as items (a leading system or
    developer message as the instructions), tools and sampling as a Responses body's."""
    include_usage: bool
    """`stream_options.include_usage`: the stream ends with a chunk of usage."""

def parse_chat_request(
    body: str | bytes | Body, limits: Limits | None = None, seen: SeenItems | None = None
) -> ChatRequest:
    """Parse a Chat Completions body into the `CreateRequest` it is served as (with
    `seen`, its leading messages recognized by their bytes as `parse_request` does). What the
    server cannot honour (`n` above 1, `stop`, `seed`, `logprobs`, a structured
    `response_format`, `store: true`, ...) is `request.error`, code
    `unsupported_parameter`. Raises CoreError `invalid_json` as `parse_request` does."""

def history_after_output(start: bytes, output_json: str) -> bytes:
    """The content address of the state at `start` with a response's `output` (the
    JSON array the server sent) appended: a client that replays those items, parsed to
    the same items, reaches the same address."""

def check_values(frame: str | bytes) -> None:
    """The boundary invariant alone: raises `CoreError` (`invalid_value`, at the field's
    path) for a number outside 64 bits or a lone surrogate, which a strict parser
    such as orjson refuses or rewrites."""

# ---------------------------------------------------------------- the cache

class Turn:
    """What `Conversation.extend` did."""

    prompt_tokens: int
    cached_tokens: int
    """Prompt tokens served from the rendered-token cache (not rendered again)."""
    new_tokens: int
    invalidated: bool
    """Earlier history was re-rendered: the prefix (instructions/tools) changed, or a
    chat template rendered earlier messages differently (`hotloop_prompt_rewrites_total`)."""

class Prompt:
    """The prompt of one turn: shares the conversation's token chunks (no copy)."""

    @staticmethod
    def from_tokens(ids: Sequence[int]) -> Prompt:
        """A prompt of ids rendered elsewhere (the benchmark peer's), sharing nothing."""
    def __len__(self) -> int: ...
    def tokens(self) -> list[int]: ...
    def tokens_from(self, start: int) -> list[int]: ...
    def common_prefix_len(self, other: Prompt) -> int:
        """Length of the shared prefix; O(shared chunks) when both share storage."""

ParseEvent = (
    tuple[str, int]
    | tuple[str, int, str]
    | tuple[str, int, str, str]
    | tuple[str, int, str, str, str]
)

class OutputParser:
    """Streaming output parser for one turn. Events are tuples:
    ("message_start", index), ("text", index, delta), ("message_done", index, text),
    ("reasoning_start", index), ("reasoning", index, delta), ("reasoning_done", index, text),
    ("call_start", index, name, call_id), ("arguments", index, delta),
    ("call_done", index, name, call_id, arguments)."""

    def feed(self, ids: Sequence[int]) -> list[ParseEvent]:
        """The events of these ids; consecutive deltas of one kind for one item come
        as one event (their text concatenated), so a batch costs one event."""
    def finish(
        self,
    ) -> tuple[list[ParseEvent], Literal["stopped", "truncated", "malformed"], str | None]:
        """Close open items. Returns events, the outcome, and a message when malformed."""
    @property
    def stopped(self) -> bool:
        """A stop token was sampled: the engine should stop."""
    @property
    def output_tokens(self) -> int: ...
    @property
    def reasoning_tokens(self) -> int: ...

class Checkpoint:
    """An immutable position in a conversation chain (one per response id)."""

    @property
    def token_count(self) -> int: ...
    @property
    def memory_bytes(self) -> int:
        """Bytes this checkpoint holds that no earlier checkpoint of its chain holds."""
    def fork(self) -> Conversation:
        """A conversation continuing from here; shares the prefix, copies nothing."""

class Conversation:
    """The rendered-token cache of one response chain, its prompt chain
    (`rust/src/prompt_chain/`): not the `/v1/conversations` resource."""

    def __init__(
        self, format: ChatFormat, *, context_window: int, policy: Policy | None = None
    ) -> None: ...
    def extend(self, request: CreateRequest, skip: int = 0) -> Turn:
        """Apply the request's prefix (instructions, tools), validate its input items
        against this chain (open calls, context budget with max_output_tokens, policy on
        new text only), render and tokenize only them, and open the assistant turn.
        `skip`: the request's first `skip` items are already in this chain (a state
        found by their `history_digests`): only the items after them are checked and
        rendered (their errors still name their place in `input`).
        Raises CoreError and leaves the conversation unchanged on failure. Releases the
        GIL from 4 KB of input (so it can run in a worker thread); meanwhile another
        thread using this object gets RuntimeError ("already mutably borrowed")."""
    def append_items(
        self,
        items_json: str,
        *,
        instructions: str | None = None,
        tools_json: str | None = None,
    ) -> Turn:
        """`extend` without a request (TokenCache and store rebuilds). Does not open an
        assistant turn. `instructions` or `tools_json` None keeps the current one."""
    def append_output(self, items_json: str, ids: Sequence[int]) -> None:
        """A stored model turn (store rebuilds): the generation header, then `ids` (the
        output segment as `commit_output` rendered it) verbatim, with `items_json` (the
        response's `output` array) as its items; function calls become open calls with
        their stored call ids. Raises CoreError and leaves the conversation unchanged
        on failure."""
    def commit_items(self, items_json: str, ids: Sequence[int]) -> None:
        """Close the open turn with `ids` as its output and `items_json` (output items)
        as its items, as `commit_output` does with a parser's: function calls keep the
        call ids given. Raises CoreError and leaves the conversation unchanged on failure."""
    def append_text(self, chunk: str) -> int:
        """Grow the last item's text (streamed or chunked content); returns tokens changed."""
    def prompt(self) -> Prompt:
        """Tokens so far, including the assistant header when a turn is open."""
    def engine_prompt(self) -> Prompt:
        """The prompt with the generation prompt (the assistant turn's header), as an
        engine is given it to answer now; the conversation is unchanged."""
    def parser(self) -> OutputParser: ...
    def commit_output(self, parser: OutputParser) -> None:
        """Append the sampled ids of the open turn verbatim and record its output items
        (function calls become open calls)."""
    def checkpoint(self) -> Checkpoint: ...
    @property
    def token_count(self) -> int: ...
    @property
    def memory_bytes(self) -> int: ...
    @property
    def open_call_ids(self) -> list[str]: ...
    @property
    def stats(self) -> dict[str, int]:
        """segments_rendered, tokens_rendered, tokens_reused, invalidations, and
        text_fallbacks (growing texts re-encoded whole because the in-place check failed)."""

class ChatTemplate:
    """A Hugging Face chat template rendered in Rust with transformers' semantics
    (`tojson` as json.dumps, `raise_exception`, `strftime_now`, Python string methods,
    loop controls, `{% generation %}`)."""

    @staticmethod
    def from_source(name: str, source: str, tokens: Sequence[tuple[str, str]] = ()) -> ChatTemplate:
        """`tokens` are the special-token variables, e.g. `[("bos_token", "<s>")]`."""
    @staticmethod
    def from_tokenizer_config(
        data: bytes, name: str = "tokenizer_config", choose: str | None = None
    ) -> ChatTemplate:
        """`chat_template` of a tokenizer_config.json (`choose` a named one)."""
    @staticmethod
    def from_gguf(path: str) -> ChatTemplate:
        """`tokenizer.chat_template` of a GGUF, with its BOS/EOS strings."""
    @staticmethod
    def gguf_tokens(path: str) -> list[tuple[str, str]]:
        """The special-token strings a GGUF names (`bos_token`, `eos_token`, ...)."""
    @property
    def name(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def tokens(self) -> list[tuple[str, str]]: ...
    def unbounded(self) -> ChatTemplate:
        """The same template rendered without its budget of steps and bytes: only for
        measuring what the budget costs."""
    @property
    def tool_parser(self) -> str | None:
        """The tool-call parser the template's markers call for, if any."""
    def render(
        self,
        messages_json: str,
        *,
        add_generation_prompt: bool = False,
        tools_json: str | None = None,
        kwargs_json: str | None = None,
    ) -> str:
        """Render chat messages (a JSON array). Raises CoreError `template_error`."""

class TemplatePrompt:
    """One conversation's prompt under a chat template: each `prompt()` renders, finds
    the first changed byte and tokenizes only from the last special token before it;
    append-stable templates render only a window of the last messages."""

    def __init__(
        self,
        template: ChatTemplate,
        tokenizer: Tokenizer,
        *,
        instructions: str | None = None,
        tools_json: str | None = None,
        kwargs_json: str | None = None,
        window: bool = True,
        check_every: int = 64,
        verbatim: bool = False,
        tool_parser: str | None = None,
        special_tokens_in_content: str = "plain",
    ) -> None: ...
    def push_items(self, items_json: str) -> None:
        """Responses-API input items (a JSON array), as vLLM converts them to messages."""
    def push_messages(self, messages_json: str) -> None:
        """Chat messages (a JSON array), as they are."""
    def push_output(self, ids: Sequence[int]) -> None:
        """Verbatim mode: the sampled ids, kept where the template renders them unchanged."""
    def prompt(self, add_generation_prompt: bool = True) -> int:
        """Bring the prompt up to date; returns how many leading ids were kept."""
    @property
    def ids(self) -> list[int]: ...
    def ids_from(self, start: int) -> list[int]: ...
    def __len__(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def messages_json(self) -> str: ...
    @property
    def template_name(self) -> str: ...
    @property
    def stability(self) -> tuple[bool, str | None] | None:
        """(window renders on, why not), after the first prompt."""
    @property
    def stats(self) -> dict[str, int]:
        """turns, full_renders, window_renders, window_checks, window_mismatches,
        rewrites, tokens_kept, tokens_encoded, bytes_encoded."""
    @property
    def tool_parser(self) -> str | None: ...
    @property
    def stop_tokens(self) -> list[int]: ...
    def parser(self) -> OutputParser:
        """The output parser of the template's tool-call family for the open turn."""

# ---------------------------------------------------------------- upstream streams

class RequestBodies:
    """A process's token-id request bodies: each written whole by the core from the
    prompt's chunks, into one buffer reused while no transport still holds it."""

    def __init__(self) -> None: ...
    def write(self, prompt: Prompt, head: bytes, tail: bytes) -> memoryview:
        """`head`, the prompt's ids as a JSON array, then `tail`: a view of the buffer,
        written over the last body (into a new buffer while a view of it is still
        held). The next call may change it: send it, and let go of the view, before."""

class ResponseReader:
    """One HTTP/1.1 response of an upstream replica, decoded from the raw bytes of each
    socket read (rust/src/upstream/http.rs): the head, the body (chunked,
    length-delimited or up to the close) and, for a 2xx answer to a stream request of
    `dialect` (`vllm`, `sglang` or `llamacpp`), its server-sent events; any other body
    is collected (`body`). `feed` and `eof` return `(ids, news)`: the new sampled ids and
    whether anything else changed (the head was read, a finishing event or `[DONE]` was
    seen, the body ended, a failure), which the properties then tell."""

    def __init__(self, dialect: str | None = None, max_line: int = 16 << 20) -> None:
        """`max_line`: the longest event line; a longer one fails the stream
        (`upstream_protocol`) instead of growing the buffer that waits for its newline."""
    def feed(self, data: bytes) -> tuple[list[int], bool]: ...
    def eof(self) -> tuple[list[int], bool]:
        """The server closed the connection: it ends a body framed by the close (a last
        event line without its newline still counts); any other stays incomplete."""
    @property
    def status(self) -> int | None:
        """The status code, once the head is read."""
    @property
    def done(self) -> bool:
        """A finishing event was seen."""
    @property
    def ended(self) -> bool:
        """`data: [DONE]` was seen."""
    @property
    def complete(self) -> bool:
        """The body was read to its end."""
    @property
    def reusable(self) -> bool:
        """Complete, and the connection may carry the next request."""
    @property
    def buffered(self) -> int:
        """The bytes held for the stream's incomplete last line (at most `max_line`)."""
    @property
    def failure(self) -> tuple[str, str, bool] | None:
        """The first failure as `(code, message, retryable)` (`upstream_error` or
        `upstream_protocol`; `retryable`: another replica may not fail so, as for an
        `error` event). The ids of the read that failed hold what came before it;
        nothing after it is read."""
    @property
    def body(self) -> bytes:
        """A collected body (at most 1 MiB of it)."""
    @property
    def timings(self) -> str | None:
        """llama.cpp server: the finishing event's `timings`, as JSON text."""
    @property
    def cached_tokens(self) -> int | None:
        """The prompt ids the engine said it served from its own KV cache: vLLM's usage
        chunk, SGLang's `meta_info`, llama.cpp server's `timings.cache_n`."""
