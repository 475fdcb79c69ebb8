"""Token usage per API key: input, cached and output tokens, counted per process.

Owns the running totals and their JSON form (`GET /v1/usage`); `/metrics` renders them
too. Recording is a few integer adds: the caller does it after the terminal event has
been sent, so it never delays a response. Totals live in memory (they are counters for
operators, not a billing ledger) and count `store=false` responses too: no content is
kept, only numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ANONYMOUS = "anonymous"
"""The key id under which requests are counted when auth is off."""


@dataclass
class TokenUsage:
    responses: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "responses": self.responses,
            "input_tokens": self.input_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.input_tokens + self.output_tokens,
        }


class Usage:
    """Totals per API key id (`auth.ApiKeys` names keys by id, never by secret)."""

    def __init__(self) -> None:
        self._by_key: dict[str, TokenUsage] = {}

    def record(
        self, key: str | None, *, input_tokens: int, cached_tokens: int, output_tokens: int
    ) -> None:
        """Count one finished response (any terminal outcome that reported usage)."""
        totals = self._by_key.get(key or ANONYMOUS)
        if totals is None:
            totals = self._by_key[key or ANONYMOUS] = TokenUsage()
        totals.responses += 1
        totals.input_tokens += input_tokens
        totals.cached_tokens += cached_tokens
        totals.output_tokens += output_tokens

    def of(self, key: str | None) -> TokenUsage:
        return self._by_key.get(key or ANONYMOUS) or TokenUsage()

    def keys(self) -> dict[str, TokenUsage]:
        return dict(self._by_key)


__all__ = ["ANONYMOUS", "TokenUsage", "Usage"]
