"""Hugging Face's chat-template rendering in Python: the reference hotloop's Rust
renderer is checked against and the peer it is benchmarked against.

It rebuilds what `transformers` does in `apply_chat_template` (transformers itself is
not a dependency): an `ImmutableSandboxedEnvironment` with `trim_blocks`,
`lstrip_blocks` and loop controls, the `tojson` filter as plain `json.dumps`
(`ensure_ascii=False`, no HTML escaping), the `raise_exception` and `strftime_now`
globals, and the `{% generation %}` block rendered as its body. The variables are the
ones transformers passes: `messages`, `tools`, `documents`, `add_generation_prompt`,
the special-token strings and the caller's template kwargs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox


class TemplateRaised(Exception):
    """The template called `raise_exception` (transformers raises `TemplateError`)."""


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: marks assistant text; renders the body."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's Extension declares it an instance field

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


class HfTemplate:
    """One chat template compiled as transformers compiles it."""

    def __init__(self, source: str, tokens: dict[str, str] | None = None) -> None:
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[GenerationBlock, jinja2.ext.loopcontrols],
        )
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self.template = env.from_string(source)
        self.tokens = dict(tokens or {})

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str:
        return self.template.render(
            messages=messages,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self.tokens,
            **kwargs,
        )
