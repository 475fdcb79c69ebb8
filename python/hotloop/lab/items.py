"""Responses API items as the peers read them (`peer`, `open_model`): the text of a
message's or an output's content, whichever form the client sent it in."""

from __future__ import annotations

from typing import Any


def content_text(content: Any) -> str:
    """A message's or output's text: a string, or the text of its content parts."""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [])
