"""What a `Connection` answers with and what it reports, without I/O: the work it hands
the transport (`Generate`, `Render`, `Persist`, `Cancel`, `Wait`, `McpCall`, `Close`,
`Later`; server frames are plain bytes), which frames are large enough to leave the
event loop as work of their own (`OFFLOAD_BYTES`, `offloads`), the record of a finished
response (`Finished`, with its `TurnSegment`s) and the interface it reports through
(`Observer`).

Plain data: the units of the protocol layer build these, the transport runs them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from hotloop._core import Body, Checkpoint, Conversation, CreateRequest, Prompt, Turn
from hotloop.engines.base import SERVING, EngineSession, Sampling, Serving
from hotloop.events import Usage
from hotloop.mcp_client import McpError, McpServer
from hotloop.protocol.connection_cache import ConversationStart

# Frames at least this large are rendered off the event loop (`Render`).
# Rendering text costs about 13 ns a byte (tokenization), checking and rendering tool
# schemas up to about 0.2 us a byte, a hop to a worker thread and back about 45 us (all
# measured on the 2-core dev machine): at 32 KB the hop adds a tenth to a 0.4 ms render,
# and an inline parse and render stall the loop for at most a few milliseconds. The
# frame's size decides, not one field's: a large tool list, instructions or input all
# leave the loop. An agent's tool output (a few KB) stays inline; a resumed history or
# an MCP-sized tool list no longer stalls every other connection's frames and handshakes.
OFFLOAD_BYTES = 32 * 1024
# Frames at least this large are also parsed off the event loop (`offloads`); smaller
# ones are parsed on it, so a frame of 32-64 KB takes one thread hop (its render), not
# two (a parse's, then a render's). The parse is the cheaper half: just under 64 KB it
# held the loop 0.09 ms for text and 0.62 ms for a tool list, against 0.58 and 1.17 ms
# for the inline parse and render of a frame just under `OFFLOAD_BYTES` (medians, 2-core
# dev machine, load 3), so no frame holds the loop longer than one under 32 KB already
# did, and none parses megabytes on it.
PARSE_OFFLOAD_BYTES = 2 * OFFLOAD_BYTES
# A body that resends a history its key has sent before (the key's raw addresses hold
# some: `SeenItems`) is parsed on the loop up to this size. Its leading elements are
# hashed, not parsed: 0.2-0.5 ms for the 270-600 KB bodies of 60k-130k-token sessions
# (2-core dev machine, load 4-7), less than the thread hop it saves, which with 64 agents
# on the loop waited for a worker and then for the GIL, often for milliseconds (the
# `prepare` phase's tail over HTTP, docs/benchmarks-capacity.md).
RESENT_PARSE_OFFLOAD_BYTES = 1 << 20


def offloads(frame: str | bytes | Body, resent: bool = False) -> bool:
    """Whether `frame` is parsed off the event loop (`Connection.parse` in a worker
    thread); `resent`: a body whose key's raw addresses may recognize most of it. A
    str's length in characters is a lower bound of its bytes."""
    return len(frame) >= (RESENT_PARSE_OFFLOAD_BYTES if resent else PARSE_OFFLOAD_BYTES)


@dataclass(frozen=True)
class Generate:
    """Engine work: stream sampled ids for `prompt`, feeding them to
    `engine_output(key, ids)`, then call `engine_done(key)` (or `engine_failed`).
    `route_key` names the conversation the same way on every node: the client's
    session header when it sent one, otherwise the id of the chain's first response
    (kept with every cached checkpoint and rebuilt from the store on a miss)."""

    key: int
    prompt: Prompt
    sampling: Sampling
    route_key: str
    serving: Serving
    """The response it is for (`SERVING`)."""

    def start(self, session: EngineSession) -> AsyncIterator[list[int]]:
        """The engine's stream of sampled ids for this work. Called in the task that
        consumes the stream; `SERVING` names the response during the call of `generate`
        (an engine, or a wrapper of it, can tell which response it serves), and only
        then."""
        serving = SERVING.set(self.serving)
        try:
            return session.generate(self.prompt, self.sampling, self.route_key)
        finally:
            SERVING.reset(serving)


@dataclass(frozen=True)
class Render:
    """Work too large for the event loop: `run()` in a worker thread (the core releases
    the GIL for it), then call `render_done(key, turn, request)` with what it returned,
    or `render_failed(key, error)` with its `CoreError`."""

    key: int
    conversation: Conversation
    request: CreateRequest | Callable[[], CreateRequest]
    """The request, or how to parse it again: a request that waited in its lane's queue
    kept only its frame, and a large frame is parsed here, not on the event loop."""
    skip: int = 0
    """The request's first items are in `conversation` already (`history.py`)."""

    def run(self) -> tuple[CreateRequest, Turn]:
        request = self.request if isinstance(self.request, CreateRequest) else self.request()
        return request, self.conversation.extend(request, self.skip)


@dataclass(frozen=True)
class Persist:
    """Durable work: commit `finished` (a `store=true` response) to the store, then call
    `persist_done(key)`, or `persist_failed(key, message)` when it was not committed.
    The response's terminal event waits for it; deltas were sent already."""

    key: int
    finished: Finished


@dataclass(frozen=True)
class Cancel:
    """Stop the engine work of `key`, or the idle timer of `Wait(key)`; the connection
    already sent any terminal event."""

    key: int


@dataclass(frozen=True)
class Wait:
    """Response `key` waits for injected tool output: call `wait_expired(key)` after
    `seconds` (the connection ignores it if the response resumed or ended meanwhile)."""

    key: int
    seconds: float


@dataclass(frozen=True)
class Close:
    """Close the socket after sending every frame before this action."""

    code: int = 1000
    reason: str = ""


@dataclass(frozen=True)
class McpRequest:
    """One MCP tool call: refused with `refusal` without a connection when it is set."""

    server: McpServer
    name: str
    arguments: str
    refusal: McpError | None = None


@dataclass(frozen=True)
class McpCall:
    """Remote work: run `calls` (concurrently, within `seconds`), then call
    `mcp_done(key, results)`, each result the call's output text or its `McpError`.
    `Cancel(key)` stops them."""

    key: int
    calls: tuple[McpRequest, ...]
    principal: str | None
    seconds: float


@dataclass(frozen=True)
class Later:
    """Bookkeeping that is off a turn's way to its first token (its request's log line,
    its prompt's state kept for whole-history requests): `run()` once the work handed
    out with it has started, so that the engine's request is written first. It must not
    emit."""

    run: Callable[[], None]


Action = bytes | Generate | Render | Persist | Cancel | Wait | Close | McpCall | Later


@dataclass(frozen=True)
class Finished:
    """A response that reached its terminal event, for work off the critical path
    (persistence when `request.store`, usage accounting, metrics)."""

    response_id: str
    request: CreateRequest
    response_json: bytes
    """The terminal Response object."""
    checkpoint: Checkpoint | None
    """Where to continue from; None when the response cannot be continued."""
    usage: Usage
    principal: str | None
    """The API key the connection authenticated with."""
    overhead_ns: int
    """Server time from the start of the turn to the engine call (parse, lookup,
    validate, render, tokenize)."""
    turn: Turn | None
    status: str = "completed"
    """The Response's `status` (the protocol knows it; nobody parses `response_json`)."""
    error: dict[str, str] | None = None
    """The Response's `error` (`code`, `message`) when it failed."""
    created_at: int = 0
    failure: str | None = None
    """Why it failed, as a stable code: `store_unavailable` when its commit failed (the
    wire's `error.code` is then `server_error`, the SDK's enum having nothing closer)."""
    segments: tuple[TurnSegment, ...] = ()
    """A stored long-running response that took input while it ran: every model turn
    with the input committed after it (empty otherwise: the request's input, then the
    whole output, whose ids the store takes from `checkpoint` after `turn`)."""
    conversation_start: ConversationStart | None = None
    """A turn on a conversation: the state of it the turn read."""


@dataclass(frozen=True)
class TurnSegment:
    """One model turn of a long-running response, as the store keeps it: where its items
    end in `output` (a count), its output segment's token ids as the cache holds them,
    and the input committed inside the response after it (injected tool outputs, then
    steering input; after the last turn, outputs still held when the response ended)."""

    outputs_end: int
    token_ids: list[int]
    then: list[dict[str, Any]]


class Observer(Protocol):
    """What the connection tells the rest of the server."""

    def finished(self, response: Finished) -> None:
        """Called once per terminal Response; must not block."""
        ...
