"""A model's own chat format, from its files: the vocabulary (a `tokenizer.json`, a GGUF,
a Mistral `tekken.json`, or an OpenAI encoding name) and the chat template (a
`tokenizer_config.json`, a `chat_template.jinja`, the GGUF's `tokenizer.chat_template`,
or any `.jinja` file), as `hotloop serve --upstream-tokenizer`, `--chat-template`,
`--chat-template-kwargs`, `--chat-template-verbatim` and `--tool-parser` name them, and
as `hotloop.TokenCache` takes them (`TemplateChoice.format`).

This module owns where those files are looked for and how the operator's choice is
spelled; rendering, tokenizing and parsing are the compiled core's (`ChatFormat.template`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hotloop._core import ChatFormat, ChatTemplate, CoreError, Tokenizer

# The special-token variables transformers passes to a template, as tokenizer_config.json
# names them.
TOKEN_VARIABLES = ("bos_token", "eos_token", "unk_token", "pad_token")


def load_tokenizer(source: str) -> Tokenizer:
    """The vocabulary at `source`: a `.gguf`, a `tekken*.json`, a `tokenizer.json`, a
    model directory holding one of the last two, or an OpenAI encoding name."""
    path = Path(source)
    if path.is_dir():
        found = [path / n for n in ("tokenizer.json", "tekken.json") if (path / n).is_file()]
        if not found:
            raise ValueError(f"{source} holds no tokenizer.json or tekken.json")
        path = found[0]
    if path.suffix == ".gguf":
        return Tokenizer.from_gguf(str(path))
    if path.suffix == ".json":
        if path.name.startswith("tekken"):
            return Tokenizer.from_tekken(path.read_text())
        return Tokenizer.from_tokenizer_json(path.read_bytes())
    return Tokenizer.openai(source)


def _folder(tokenizer_source: str) -> Path:
    path = Path(tokenizer_source)
    return path if path.is_dir() else path.parent


def special_token_strings(tokenizer_source: str) -> list[tuple[str, str]]:
    """`bos_token`, `eos_token`, ... for a template given as a `.jinja` file: from the
    GGUF's metadata, or from the `tokenizer_config.json` beside the vocabulary (strings
    or AddedToken objects); none when neither exists."""
    if tokenizer_source.endswith(".gguf"):
        return ChatTemplate.gguf_tokens(tokenizer_source)
    config_path = _folder(tokenizer_source) / "tokenizer_config.json"
    if not config_path.is_file():
        return []
    config = json.loads(config_path.read_text())
    tokens: list[tuple[str, str]] = []
    for name in TOKEN_VARIABLES:
        value = config.get(name)
        text = value.get("content") if isinstance(value, dict) else value
        if isinstance(text, str):
            tokens.append((name, text))
    return tokens


def load_template(spec: str, tokenizer_source: str) -> ChatTemplate:
    """The chat template `spec` names. `auto`: the one that comes with the vocabulary (the
    GGUF's own, else a `chat_template.jinja` or the `tokenizer_config.json` beside the
    `tokenizer.json`). A path: a GGUF, a `tokenizer_config.json`, or a `.jinja` file
    rendered with the special-token strings of the vocabulary's files."""
    if spec == "auto":
        if tokenizer_source.endswith(".gguf"):
            try:
                return ChatTemplate.from_gguf(tokenizer_source)
            except CoreError as e:
                # A base model's GGUF carries none.
                raise ValueError(f"{e.message}: give --chat-template PATH") from e
        folder = _folder(tokenizer_source)
        for candidate in (folder / "chat_template.jinja", folder / "tokenizer_config.json"):
            if candidate.is_file():
                return load_template(str(candidate), tokenizer_source)
        raise ValueError(
            f"no chat template comes with {tokenizer_source} (no chat_template.jinja or "
            "tokenizer_config.json beside it): give --chat-template PATH"
        )
    path = Path(spec)
    if path.suffix == ".gguf":
        return ChatTemplate.from_gguf(spec)
    if path.suffix == ".json":
        name = path.parent.name or path.stem
        return ChatTemplate.from_tokenizer_config(path.read_bytes(), name=name)
    return ChatTemplate.from_source(
        path.stem, path.read_text(), special_token_strings(tokenizer_source)
    )


@dataclass(frozen=True)
class TemplateChoice:
    """The operator's choice of a model's own chat template and how to serve it."""

    template: str = "auto"
    """`auto` (the template that comes with the vocabulary) or a path (see `load_template`)."""
    tool_parser: str = "auto"
    """`auto` (from the template's markers) or hermes, llama3_json, mistral, deepseek_v3."""
    kwargs_json: str | None = None
    """Template kwargs as a JSON object, e.g. `{"enable_thinking": false}`."""
    verbatim: bool = False
    """Keep the model's sampled ids where the template renders them unchanged (the
    engine's prefix cache then holds the whole prompt) instead of re-encoding them."""
    special_tokens_in_content: str = "plain"
    """What special-token text in content becomes: `plain` text, `refuse`d, or `allow`ed
    as a real special token (see docs/tokenizers-and-formats.md)."""

    def format(self, tokenizer_source: str) -> ChatFormat:
        """The generic chat format over the vocabulary at `tokenizer_source`."""
        return ChatFormat.template(
            load_template(self.template, tokenizer_source),
            load_tokenizer(tokenizer_source),
            kwargs_json=self.kwargs_json,
            tool_parser=None if self.tool_parser == "auto" else self.tool_parser,
            verbatim=self.verbatim,
            special_tokens_in_content=self.special_tokens_in_content,
        )


__all__ = ["TemplateChoice", "load_template", "load_tokenizer", "special_token_strings"]
