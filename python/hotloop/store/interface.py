"""What a store is (`hotloop.store`'s interface): the records it keeps (`StoredResponse`,
`ModelTurn`, pages of input items, a stored chain replayed into a fresh `Conversation`),
its error (`StoreError`), who may read a record (`may_read`), and the async `Store`
protocol every backend implements. The backends (`sqlite.py`, `postgres.py`, behind
`writer.py`; `redis_cache.py` in front) import this module; `open_store`, in the package,
picks one of them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import orjson

from hotloop.protocol.compaction import compacted
from hotloop.protocol.mcp_tools import replayable

if TYPE_CHECKING:
    from hotloop._core import ChatFormat, Conversation
    from hotloop.protocol.compaction import Compactor
    from hotloop.store.quota import Usage
    from hotloop.store.sql import Work

Order = Literal["asc", "desc"]
T = TypeVar("T")

# Seconds a commit waits after its first response for more to share it. Zero by default:
# responses put while a commit is under way already share the next one, and a wait here
# is added to the last token -> `response.completed` time of every lone agent's turn.
COMMIT_WINDOW = 0.0
DURABILITIES = ("power-loss", "process-crash")
"""What an acknowledged response survives: `power-loss` (every commit fsync'd: SQLite
`synchronous=FULL`, PostgreSQL `synchronous_commit=on`) or `process-crash` (committed
to the operating system, or to the PostgreSQL server, before it is acknowledged, not
fsync'd first: a crash of hotloop loses nothing, a power loss or kernel crash may lose
the last commits)."""


class StoreError(Exception):
    """A store failure with a stable code: `store_unavailable` (the database cannot
    commit or be read: down, disk full, read-only, locked past the retry deadline, or a
    record it refuses), `store_closed` (a put after shutdown began), `store_damaged`
    (at startup: the database is unreadable, corrupt or from a newer hotloop)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ModelTurn:
    """Where one model turn of a stored long-running response ends (see
    `StoredResponse.model_turns`): counts into `output` and `output_token_ids`, and the
    input items committed after it."""

    outputs_end: int
    ids_end: int
    inputs_after: int


@dataclass(frozen=True)
class StoredResponse:
    """A response that ended with `store=true`, captured right after its terminal event.

    `response` is the Response object exactly as the terminal event carries it (a JSON
    object, bytes); `input_items` is the request's input as a JSON array (the delta when
    the request continued a previous response), followed by the input committed inside
    a long-running response; `owner` is the API key id that created it (None when auth is
    off). `output_token_ids` is the output segment as the rendered-token cache holds it
    (the sampled ids verbatim) and `fingerprint` names the chat format and tokenizer that
    produced them (`format_fingerprint`).

    `model_turns` is how a long-running response interleaves its input and output: one
    `ModelTurn` bound per model turn, in order, each giving where that turn's items end
    in `output`, where its ids end in `output_token_ids`, and how many input items were
    committed after it inside the response (injected tool outputs, then steering input),
    taken from the end of `input_items`. Empty for a response of one model turn (the
    whole input, then the whole output).
    """

    id: str
    owner: str | None
    previous_response_id: str | None
    created_at: int
    response: bytes
    input_items: bytes
    output_token_ids: Sequence[int] = ()
    fingerprint: str = ""
    model_turns: Sequence[ModelTurn] = ()

    def segments(self, output: list[Any]) -> list[tuple[bytes, list[Any], Sequence[int]]]:
        """The response as its conversation holds it, given its `output` items: per model
        turn, the input items before it as a JSON array (the request's, or the ones
        committed inside the response after the previous turn; possibly empty), its output
        items and its output token ids. Raises ValueError when `model_turns` does not fit
        the record."""
        ids = self.output_token_ids
        if not self.model_turns:
            return [(self.input_items, output, ids)]
        items = orjson.loads(self.input_items)
        if not isinstance(items, list):
            raise ValueError("input_items is not a JSON array")
        at_input = len(items) - sum(turn.inputs_after for turn in self.model_turns)
        if at_input < 0:
            raise ValueError("model_turns counts more input items than the record has")
        before = items[:at_input]
        segments: list[tuple[bytes, list[Any], Sequence[int]]] = []
        at_output = at_ids = 0
        for turn in self.model_turns:
            if not (
                at_output <= turn.outputs_end <= len(output)
                and at_ids <= turn.ids_end <= len(ids)
                and turn.inputs_after >= 0
            ):
                raise ValueError("model_turns does not fit the record")
            segments.append(
                (
                    orjson.dumps(before),
                    output[at_output : turn.outputs_end],
                    ids[at_ids : turn.ids_end],
                )
            )
            before = items[at_input : at_input + turn.inputs_after]
            at_input += turn.inputs_after
            at_output, at_ids = turn.outputs_end, turn.ids_end
        if at_output != len(output) or at_ids != len(ids):
            raise ValueError("model_turns does not cover the output")
        if before:
            # Input committed after the last model turn (outputs held when it ended).
            segments.append((orjson.dumps(before), [], ()))
        return segments


def may_read(stored_owner: str | None, owner: str | None) -> bool:
    """Who sees a stored response. With auth on, a key sees only what it stored: a
    response stored while auth was off (no owner) belongs to no key and is invisible to
    all of them. With auth off (no caller owner) the single tenant sees everything."""
    return owner is None or stored_owner == owner


def format_fingerprint(chat_format: ChatFormat) -> str:
    """What must match for stored token ids to be valid in a new conversation: the
    format, its tokenizer (name and vocabulary size) and its stop tokens."""
    tokenizer = chat_format.tokenizer
    text = (
        f"{chat_format.name}|{tokenizer.name}|{tokenizer.vocab_size}|"
        f"{','.join(map(str, chat_format.stop_tokens))}"
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


PAGE_CHUNK_BYTES = 64 * 1024
"""What `InputItemPage.body` joins small items into, per piece of the reply."""


@dataclass(frozen=True)
class InputItemPage:
    """One page of `GET /v1/responses/{id}/input_items`: its items' JSON in wire form,
    as the store holds them, and the ids of its first and last item. A page may be
    15 MB: it is served by joining the stored bytes, never parsed nor serialized again
    (issue 21: 16 concurrent 15 MB reads held the event loop for another tenant's GET)."""

    items: list[bytes]
    has_more: bool
    # The SDK types both ids as strings; an empty page has no item to name.
    first_id: str = ""
    last_id: str = ""

    @property
    def data(self) -> list[dict[str, Any]]:
        """The items parsed, for a caller that looks inside them."""
        return [orjson.loads(item) for item in self.items]

    def body(self) -> list[bytes]:
        """The page's JSON, in pieces to write one after another: the small items
        joined up to `PAGE_CHUNK_BYTES`, a larger item a piece of its own (not copied)."""
        tail = orjson.dumps(
            {"first_id": self.first_id, "last_id": self.last_id, "has_more": self.has_more}
        )
        pieces: list[bytes] = []
        pending = [b'{"object":"list","data":[']
        size = 0
        for n, item in enumerate(self.items):
            separator = b"," if n else b""
            if len(item) >= PAGE_CHUNK_BYTES:
                pieces += (b"".join([*pending, separator]), item)
                pending, size = [], 0
                continue
            pending += (separator, item)
            size += len(item) + 1
            if size >= PAGE_CHUNK_BYTES:
                pieces.append(b"".join(pending))
                pending, size = [], 0
        pending.append(b"]," + tail[1:])
        pieces.append(b"".join(pending))
        return pieces


@dataclass(frozen=True)
class Chain:
    """The stored responses from the root of a chain to the one asked for, oldest first."""

    responses: list[StoredResponse]

    @property
    def head(self) -> StoredResponse:
        return self.responses[-1]

    @property
    def root(self) -> str:
        """The id of the chain's first response: the conversation's name."""
        return self.responses[0].id

    def replay(
        self,
        conversation: Conversation,
        compactor: Compactor,
        fingerprint: str = "",
        rerendered: Callable[[], None] | None = None,
    ) -> None:
        """Rebuild the rendered state of `head` into an empty conversation: every
        response's input items, then its output. Instructions and tools are not
        inherited through `previous_response_id`, so the whole chain renders under the
        head's own prefix; the next request applies its own on top (and the core
        re-renders from the prefix only if they differ).

        An output stored under `fingerprint` (the serving format's) is appended as its
        stored token ids, so the rebuilt prompt is exactly the one the original
        connection held; any other output is rendered again from its text, and
        `rerendered` is called for each. Compaction items render as their summary
        (`compactor` opens them), and a response compacted by `context_management`
        restarts the chain from its output (rendered from text), as it did when it ran.
        A long-running response replays turn by turn: each model turn's output, then
        the input committed inside the response after it (`StoredResponse.segments`).
        Raises CoreError from the core if a stored item no longer validates,
        ProtocolError if a compaction item no longer opens, ValueError if a stored
        record is not JSON or does not fit together."""
        head = orjson.loads(self.head.response)
        instructions = head.get("instructions")
        prefix: dict[str, Any] = {
            "instructions": instructions if isinstance(instructions, str) else None,
            "tools_json": orjson.dumps(head.get("tools") or []).decode(),
        }
        outputs = [orjson.loads(stored.response).get("output") or [] for stored in self.responses]
        start = max((i for i, output in enumerate(outputs) if compacted(output)), default=-1)
        for index, stored in enumerate(self.responses):
            if index < start:
                continue
            exact = index > start and bool(fingerprint) and stored.fingerprint == fingerprint
            for turn, (input_items, stored_output, ids) in enumerate(
                stored.segments(outputs[index])
            ):
                output = replayable(stored_output)
                # A compacted response restarts the chain from its output.
                if index > start or turn > 0:
                    conversation.append_items(
                        compactor.expand_items(input_items).decode(), **prefix
                    )
                if exact and ids:
                    conversation.append_output(orjson.dumps(output).decode(), ids)
                elif output:
                    if rerendered is not None:
                        rerendered()
                    items = compactor.expand_items(orjson.dumps(output)).decode()
                    conversation.append_items(items, **prefix)


class Store(Protocol):
    """Where `store=true` responses live. Every method is safe to call from the event
    loop: none blocks it."""

    async def put(self, response: StoredResponse) -> None:
        """Commit a finished response durably. Returns once its transaction committed
        (responses arriving together share one commit); raises StoreError
        `store_unavailable` when it was not committed (the caller fails the response
        instead of acknowledging it), `store_closed` after shutdown began."""
        ...

    async def get(self, response_id: str, owner: str | None) -> bytes | None:
        """The stored Response object (JSON), or None if unknown, deleted or not
        `owner`'s."""
        ...

    async def delete(self, response_id: str, owner: str | None) -> bool:
        """Delete a response and its input items; False if there was nothing to delete."""
        ...

    async def list_input_items(
        self,
        response_id: str,
        owner: str | None,
        *,
        order: Order = "desc",
        limit: int = 20,
        after: str | None = None,
    ) -> InputItemPage | None:
        """A page of the response's input items in wire form, or None if unknown."""
        ...

    async def load_chain(self, response_id: str, owner: str | None) -> Chain | None:
        """The chain ending at `response_id`, or None if it or any ancestor is gone."""
        ...

    async def transact(self, work: Work[T]) -> T:
        """Run `work` in one durable transaction on the database (the background
        responses' tables, `background.py`); raises StoreError as a commit does."""
        ...

    async def query(self, work: Work[T]) -> T:
        """Run `work`, which only reads, as the store's reads run (never on the
        writer's time)."""
        ...

    def counted(self, owner: str | None, change: Usage) -> None:
        """What `owner` stores changed by `change` (conversations: the quota)."""
        ...

    def quota_refusal(self, owner: str | None) -> str | None:
        """Why `owner` may store no more responses (its storage quota, `quota.py`), or
        None when it may."""
        ...

    @property
    def healthy(self) -> bool:
        """False after a failed commit, until a write succeeds again (`/health` 503)."""
        ...

    def pending(self) -> int:
        """Puts accepted but not yet committed."""
        ...

    async def close(self) -> None:
        """Commit what was put, then release the database. Later puts raise StoreError
        `store_closed`."""
        ...
