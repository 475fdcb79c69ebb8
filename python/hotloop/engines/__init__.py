"""Inference engines: prompt token ids in, sampled token ids out (see base.py).

This package's front door builds the engine a configuration names (`load_engine`, by
`--engine`): `hotloop serve` and `App.from_config` both get theirs here. Each engine's
module is imported only when it is chosen: llama needs llama-cpp-python, sim nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hotloop.chat_template import TemplateChoice
from hotloop.config import ServerConfig
from hotloop.engines.base import Engine


def sim_engine(config: ServerConfig) -> Engine:
    from hotloop.engines.sim import SIM_FORMATS, from_config

    if config.sim_format not in SIM_FORMATS:
        raise SystemExit(
            f"hotloop: unknown --sim-format {config.sim_format!r}; "
            f"choose one of {', '.join(SIM_FORMATS)}"
        )
    return from_config(config)


def template_choice(
    config: ServerConfig, template: str | None, verbatim: bool
) -> TemplateChoice | None:
    """The model's own chat template as configured (`template` None: not used);
    `verbatim` is the engine's default for `--chat-template-verbatim`."""
    if template is None:
        return None
    return TemplateChoice(
        template=template,
        tool_parser=config.tool_parser,
        kwargs_json=config.chat_template_kwargs,
        special_tokens_in_content=config.special_tokens_in_content,
        verbatim=verbatim
        if config.chat_template_verbatim is None
        else config.chat_template_verbatim,
    )


def llama_engine(config: ServerConfig) -> Engine:
    from hotloop.engines.llama import LlamaConfig, LlamaEngine

    # A GGUF of the operator's comes with its own template; the built-in SmolLM2 keeps the
    # hand-written ChatML unless a template is asked for (both give the same ids).
    template = config.chat_template or ("auto" if config.llama_model_path else None)
    options: dict[str, Any] = {
        "model_path": config.llama_model_path,
        "n_ctx": config.llama_context,
        # The engine keeps each sequence's sampled ids in its KV cache: verbatim by default.
        "template": template_choice(config, template, verbatim=True),
    }
    if config.model:
        options["model"] = config.model
    engine: Engine = LlamaEngine(LlamaConfig(**options))
    return engine


def upstream_engine(config: ServerConfig) -> Engine:
    if not config.upstream_replicas and not config.upstream_router:
        raise SystemExit(
            "hotloop: --engine upstream needs --upstream-replicas URL[,URL...] "
            "or --upstream-router URL"
        )
    from hotloop.engines.upstream import UpstreamConfig, UpstreamEngine

    engine: Engine = UpstreamEngine(
        UpstreamConfig(
            dialect=config.upstream_dialect,
            replicas=config.upstream_replicas,
            model=config.model or config.upstream_served_model or "default",
            served_model=config.upstream_served_model,
            context_window=config.upstream_context_window,
            chat_format=config.upstream_format,
            tokenizer=config.upstream_tokenizer,
            default_system=config.upstream_default_system,
            template=template_choice(config, config.chat_template, verbatim=False),
            routing=config.upstream_routing,
            router=config.upstream_router,
            response_timeout=config.upstream_response_timeout,
            max_line_bytes=config.upstream_max_line_bytes,
        )
    )
    return engine


ENGINES: dict[str, Callable[[ServerConfig], Engine]] = {
    "sim": sim_engine,
    "llama": llama_engine,
    "upstream": upstream_engine,
}


def load_engine(config: ServerConfig) -> Engine:
    """The engine `config.engine` names, built from `config`."""
    build = ENGINES.get(config.engine)
    if build is None:
        raise SystemExit(
            f"hotloop: unknown engine {config.engine!r}; choose one of {', '.join(ENGINES)}"
        )
    return build(config)
