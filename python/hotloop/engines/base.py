"""The engine interface: the one seam between the protocol layer and inference.

An engine takes the exact prompt token ids from the rendered-token cache and streams
back sampled token ids. It never sees text or items; it must not re-tokenize.
Each client connection gets its own `EngineSession`, so an engine can keep per-connection
state (its KV/prefix cache, the replica it routed to) across turns. A session carries
its API key's cache salt (`auth.ApiKeys.cache_salt`): an engine shares cached prompt
state only between sessions of the same salt, so no tenant is served, or can time, a
prefix another tenant sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    # Annotations only: engines (and their tests) import without the compiled classes.
    from hotloop._core import ChatFormat, CreateRequest, Prompt


@dataclass(frozen=True)
class Sampling:
    """Per-request sampling settings (not inherited through previous_response_id)."""

    max_output_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    stop_tokens: tuple[int, ...] = field(default_factory=tuple)


class EngineError(Exception):
    """An engine failure, mapped by the protocol layer to `response.failed`."""

    def __init__(self, code: str, message: str, *, before_first_token: bool = True) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.before_first_token = before_first_token


class EngineSession(Protocol):
    """One connection's view of an engine."""

    def generate(
        self, prompt: Prompt, sampling: Sampling, route_key: str | None = None
    ) -> AsyncIterator[list[int]]:
        """Stream sampled ids in batches. Stops after a stop token or at
        `max_output_tokens`. Cancelling the consuming task (or `aclose()` on the
        iterator) stops generation promptly. Raises EngineError on failure. The
        consumer ends every stream with `close_stream`. `route_key` names the
        conversation (the same on every node): an engine with several replicas sends
        every turn of it to the same one; one that holds its model itself ignores it."""
        ...

    async def close(self) -> None: ...


ENGINE_CACHED: ContextVar[int | None] = ContextVar("engine_cached", default=None)
"""The prompt ids the engine said it served from its own KV cache for the generation
the current task consumes (None: it did not say; vLLM, SGLang and llama.cpp server do).
An engine sets it (None when its stream starts, the figure before its last batch), the
transport reads it when the stream has ended, for the response's usage
(`usage.input_tokens_details.engine_cached_tokens`). A context variable, not a session
attribute: one session serves a connection's concurrent responses, each consumed by
its own task, and an async generator runs in the context of the task iterating it."""


@dataclass(frozen=True)
class Serving:
    """The response an engine call serves: its id, and the request that asked for it."""

    response_id: str
    request: CreateRequest


SERVING: ContextVar[Serving | None] = ContextVar("serving", default=None)
"""The response the generation about to start serves, set by whoever runs the
protocol's engine work (`Generate.start`) for its call of `generate` only: read it in
that call, not while the stream runs. An engine generates from its prompt alone and does
not read it; it is for a wrapper of an engine that answers for the response as a whole
(a stateless peer that renders the request again, as a benchmark's baseline does:
hotloop.lab.baseline). A context variable, for the reason `ENGINE_CACHED` is one: a
session serves concurrent responses, each consumed by its own task. Unset after the
call because a callback scheduled later from that task keeps the task's context (uvicorn's
keep-alive timer, armed when the terminal event ends an HTTP body, until the
connection's next request), and with the response its request, whose body (a resent
history: hundreds of KB) it would keep alive through the agent's think time."""


async def close_stream(stream: AsyncIterator[list[int]]) -> None:
    """End a stream from `EngineSession.generate`, finished or not: an engine (or a
    wrapper counting it) releases what the generation held."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


PACED: ContextVar[bool] = ContextVar("paced", default=False)
"""The stream the current task consumes is paced (`coalesced`): its consumer waits
between asks, so an engine reading its ids from a socket leaves it unread meanwhile
and one read takes what arrived (`Link.hold_reads`)."""


async def coalesced(
    stream: AsyncIterator[list[int]], window: float, streaming: Callable[[], bool]
) -> AsyncIterator[list[int]]:
    """`stream` with its batches merged over `window` seconds (`--stream-coalesce-ms`):
    once `streaming()` (the response has streamed its first delta), after handing over
    a batch it waits `window` before asking the engine for the next, which then holds
    every id sampled meanwhile (an engine hands over all the ids ready when asked: the
    upstream's connection reads what arrived in one go, the sim computes what is due).
    The first delta is not delayed, no id waits longer than `window` (plus the event
    loop's timer resolution), and a response costs one delta event per window instead
    of one per engine batch. The engine is told (`PACED`: `stream` runs in the
    consuming task's context)."""
    PACED.set(True)
    try:
        async for ids in stream:
            yield ids
            if streaming():
                await asyncio.sleep(window)
    finally:
        await close_stream(stream)


TEXT_ONLY = ("text",)
# The Responses API's documented `temperature` and `top_p`: what a request that sets
# neither is served with, unless the engine has defaults of its own.
API_SAMPLING = (1.0, 1.0)


class Engine(Protocol):
    """A model served by some inference backend."""

    @property
    def model(self) -> str:
        """The model name clients send and responses echo."""
        ...

    @property
    def chat_format(self) -> ChatFormat: ...

    @property
    def context_window(self) -> int: ...

    @property
    def modalities(self) -> tuple[str, ...]:
        """What the model takes as input: `("text",)`, or `("text", "image")` for a model
        with vision, whose requests may carry `input_image` parts (the prompt then
        marks where each image stood; a text-only model refuses them with
        `unsupported_content`)."""
        ...

    @property
    def sampling_defaults(self) -> tuple[float, float]:
        """The `temperature` and `top_p` it samples with when a request sets none: what
        Responses echo for such a request."""
        ...

    async def start(self) -> None: ...

    def session(self, cache_salt: str | None = None) -> EngineSession:
        """A connection's session. `cache_salt` names the tenant whose prefix cache it
        uses (None: the cache every unsalted session shares): an engine never serves
        it a prefix from a session of another salt, nor reports such a hit
        (`ENGINE_CACHED`); one that cannot keep them apart (llama.cpp server) reports
        no hit for a salted session."""
        ...

    async def close(self) -> None: ...


class WrappedEngine:
    """`engine` as it is, but for what a subclass changes (its sessions): the base of a
    wrapper of an engine (the shutdown drain's count of generations, a benchmark's peer
    that feeds it prompts of its own)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @property
    def model(self) -> str:
        return self.engine.model

    @property
    def chat_format(self) -> ChatFormat:
        return self.engine.chat_format

    @property
    def context_window(self) -> int:
        return self.engine.context_window

    @property
    def modalities(self) -> tuple[str, ...]:
        return self.engine.modalities

    @property
    def sampling_defaults(self) -> tuple[float, float]:
        return self.engine.sampling_defaults

    async def start(self) -> None:
        await self.engine.start()

    def session(self, cache_salt: str | None = None) -> EngineSession:
        return self.engine.session(cache_salt)

    async def close(self) -> None:
        await self.engine.close()
