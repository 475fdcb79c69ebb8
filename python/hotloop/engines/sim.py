"""The simulated engine (`--engine sim`): a deterministic model with a configurable
speed, for measuring the server's own cost at 1,000-4,000 tokens/s without a GPU.

It answers by a script: call one function N times (with fixed arguments), then answer
with a fixed text. Its output is real token ids in the model's chat format
(`ChatFormat.completion_tokens`), so they go through the real output parser and are
cached verbatim like any model's. It models an engine's prefix cache per session:
the time to first token grows with the prompt tokens that do not extend what the
session has already seen (its previous prompt plus its previous output), so a server
that changes earlier tokens pays for it as it would on a real engine.

Timing runs on the event loop's clock: `asyncio.sleep` here *is* the simulated
inference time, not synchronisation.
"""

from __future__ import annotations

import asyncio
from array import array
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from hotloop._core import ChatFormat, Prompt
from hotloop.config import ServerConfig
from hotloop.engines.base import Sampling

TIMER_RESOLUTION = 0.001


@dataclass(frozen=True)
class SimScript:
    """What the simulated model says: `tool_calls` calls of `tool`, then `text`."""

    text: str = "Done."
    tool: str | None = None
    tool_calls: int = 0
    tool_arguments: str = "{}"


@dataclass(frozen=True)
class SimSpeed:
    """Decode speed, time to first token for a fully cached prompt, and prefill speed
    for the prompt tokens the simulated prefix cache does not hold."""

    tokens_per_second: float = 1000.0
    ttft: float = 0.02
    prefill_tokens_per_second: float = 20000.0

    def first_token_delay(self, uncached_tokens: int) -> float:
        return self.ttft + uncached_tokens / self.prefill_tokens_per_second


def count_occurrences(haystack: list[int], needle: list[int]) -> int:
    """Non-overlapping occurrences of a token sequence, searched in C over the ids'
    bytes (only matches aligned to a whole token count)."""
    if not needle or len(needle) > len(haystack):
        return 0
    hay = array("i", haystack).tobytes()
    pat = array("i", needle).tobytes()
    count, pos = 0, hay.find(pat)
    while pos >= 0:
        if pos % 4 == 0:
            count += 1
            pos = hay.find(pat, pos + len(pat))
        else:
            pos = hay.find(pat, pos + 1)
    return count


class SimEngine:
    """A simulated model over a real chat format (see the module docstring)."""

    def __init__(
        self,
        chat_format: ChatFormat,
        *,
        model: str = "sim",
        context_window: int = 1 << 20,
        speed: SimSpeed | None = None,
        script: SimScript | None = None,
    ) -> None:
        self._format = chat_format
        self._model = model
        self._context_window = context_window
        self.speed = speed or SimSpeed()
        self.script = script or SimScript()
        self.answer_ids = chat_format.completion_tokens(text=self.script.text)
        self.call_ids: list[int] = []
        if self.script.tool is not None and self.script.tool_calls > 0:
            call = (self.script.tool, self.script.tool_arguments)
            self.call_ids = chat_format.completion_tokens(calls=[call])

    @property
    def model(self) -> str:
        return self._model

    @property
    def chat_format(self) -> ChatFormat:
        return self._format

    @property
    def context_window(self) -> int:
        return self._context_window

    async def start(self) -> None:
        """Nothing to load: the script's token ids are computed at construction."""

    def session(self) -> SimSession:
        return SimSession(self)

    async def close(self) -> None:
        """Nothing to release: sessions hold only their own prefix-cache model."""


@dataclass
class _Sequence:
    """A prompt the simulated engine has processed, the ids it then generated, and
    how many calls of the script that prompt holds."""

    prompt: Prompt
    output: list[int]
    calls: int


class SimSession:
    """One connection's simulated engine: its prefix cache (the last few sequences it
    processed, as a real engine's KV cache holds several) and its script position."""

    CACHED_SEQUENCES = 8

    def __init__(self, engine: SimEngine) -> None:
        self._engine = engine
        self._recent: deque[_Sequence] = deque(maxlen=self.CACHED_SEQUENCES)
        self.prefill_tokens = 0
        """Prompt tokens this session had to prefill (not in its prefix cache)."""

    def _observe(self, prompt: Prompt) -> tuple[int, int]:
        """Find the cached sequence `prompt` extends furthest; return the prompt
        tokens that were cached and the script's calls found in the prompt."""
        marker = self._engine.call_ids[:-1]  # the call without its stop token
        cached, base, scanned = 0, None, 0
        for seq in self._recent:
            shared = prompt.common_prefix_len(seq.prompt)
            if shared > cached:
                cached = shared
            if shared == len(seq.prompt) and shared >= scanned:
                base, scanned = seq, shared
        # Calls are counted incrementally from the sequence this prompt extends:
        # resume where a call could still end inside the new tokens.
        start = max(0, scanned - max(len(marker) - 1, 0))
        tail = prompt.tokens_from(start)
        calls = 0 if base is None else base.calls
        if base is not None and base.output:
            after = tail[scanned - start :][: len(base.output)]
            if after == base.output:
                cached = max(cached, scanned + len(base.output))
        calls += count_occurrences(tail, marker)
        self._recent.append(_Sequence(prompt, [], calls))
        return cached, calls

    def choose(self, prompt: Prompt) -> tuple[list[int], int]:
        """The ids the script answers `prompt` with, and the uncached prompt tokens."""
        cached, calls = self._observe(prompt)
        engine = self._engine
        if engine.call_ids and calls < engine.script.tool_calls:
            return engine.call_ids, len(prompt) - cached
        return engine.answer_ids, len(prompt) - cached

    async def generate(self, prompt: Prompt, sampling: Sampling) -> AsyncIterator[list[int]]:
        ids, uncached = self.choose(prompt)
        self.prefill_tokens += uncached
        ids = ids[: sampling.max_output_tokens]
        speed = self._engine.speed
        loop = asyncio.get_running_loop()
        first = loop.time() + speed.first_token_delay(uncached)
        rate = speed.tokens_per_second
        sent = 0
        output = self._recent[-1].output
        while sent < len(ids):
            due = first + sent / rate
            now = loop.time()
            if now < due:
                # Event loop timers tick in milliseconds (libuv): a shorter sleep would
                # spin, so faster models deliver several tokens per wake, as batched
                # engines do.
                await asyncio.sleep(max(due - now, TIMER_RESOLUTION))
                now = loop.time()
            # Tokens whose time has come go out together: a slow consumer gets batches.
            upto = min(len(ids), max(sent + 1, int((now - first) * rate) + 1))
            batch = ids[sent:upto]
            output.extend(batch)
            sent = upto
            yield batch

    async def close(self) -> None:
        """Nothing to release."""


def from_config(config: ServerConfig) -> SimEngine:
    """The engine `hotloop serve --engine sim` runs: harmony (gpt-oss's format)."""
    return SimEngine(
        ChatFormat.harmony(),
        model=config.model or "sim",
        speed=SimSpeed(
            tokens_per_second=config.sim_tokens_per_second,
            ttft=config.sim_ttft,
            prefill_tokens_per_second=config.sim_prefill_tokens_per_second,
        ),
        script=SimScript(
            text=config.sim_text,
            tool=config.sim_tool,
            tool_calls=config.sim_tool_calls,
            tool_arguments=config.sim_tool_arguments,
        ),
    )
