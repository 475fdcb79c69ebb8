"""What happens to a response after its terminal event, for both transports.

`Ledger` is the protocol's `Observer`. A `store=true` response is committed through
`persist` before its terminal event goes out (the transports await it for the
connection's `Persist` action). For every finished response it books usage per API key
id and updates metrics, deferred to the event loop's next turn so it never delays the
terminal frame; each response is booked on its own, and one that cannot be booked is
counted and logged without stopping the others. It also owns the process-wide caches of
rendered state that HTTP requests continue from (one per API key id, all under the
global cache budget), and the rebuild of a stored chain into a checkpoint on a cache
miss.

It does not decide what goes on the wire and never sees a response before it ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from pathlib import Path
from typing import Any

import orjson

from hotloop import logs
from hotloop._core import (
    Checkpoint,
    Conversation,
    CoreError,
    CreateRequest,
    Policy,
    SeenItems,
)
from hotloop.auth import ApiKeys, key_id
from hotloop.engines.base import Engine
from hotloop.metrics import Metrics
from hotloop.protocol import (
    CacheBudget,
    ConnectionCache,
    Finished,
    Observer,
    ProtocolError,
    TurnSegment,
)
from hotloop.protocol.compaction import Compactor
from hotloop.protocol.connection_cache import ConversationStart
from hotloop.shutdown import Drain
from hotloop.store import (
    COMMIT_WINDOW,
    Chain,
    ModelTurn,
    Store,
    StoredResponse,
    StoreError,
    format_fingerprint,
    open_store,
)
from hotloop.store import conversations as conversation_tables
from hotloop.store.items import listed_items
from hotloop.usage import Usage

log = logging.getLogger("hotloop.ledger")

APPENDED = ("completed", "incomplete")
"""The statuses whose items a response appends to its conversation: a failed or
cancelled response appends nothing, so that the next turn starts from what was
there before it."""


class Ledger:
    """Bookkeeping shared by every connection and request of the process."""

    def __init__(
        self,
        engine: Engine,
        *,
        cache_memory_bytes: int,
        max_cached_bytes: int,
        data_dir: str | Path | None = None,
        policy: Policy | None = None,
        keys: ApiKeys | None = None,
        commit_window: float = COMMIT_WINDOW,
        busy_timeout: float = 5.0,
        durability: str = "power-loss",
        cache: str | None = None,
        quota_bytes: int = 2**62,
        quota_rows: int = 2**62,
        compactor: Compactor | None = None,
        whole_history: str = "bytes",
    ) -> None:
        """`data_dir`: where the store lives, a directory (SQLite) or a PostgreSQL URL;
        None for no durable store (`store=true` is then a no-op). `commit_window`,
        `busy_timeout`, `durability`, `cache`, `quota_bytes` and `quota_rows`: see `open_store`.
        `compactor`: the server's compaction key, to rebuild chains that hold compaction
        items (one of the ledger's own otherwise). `whole_history`: how a request that
        resends its whole history finds the state it continues (`history_cache`,
        `seen_items`): bytes, items or off (`Config.whole_history`)."""
        # Usage and metrics name a key by its tenant label, never by its store id.
        self.keys = keys or ApiKeys()
        self.usage = Usage()
        self.metrics = Metrics(self.usage)
        self.drain = Drain()
        # Every generation, over either transport, goes through the drain.
        self.engine = self.drain.engine(engine)
        # The global cap on cached state, shared by the WebSocket connections' caches
        # and the HTTP caches.
        self.budget = CacheBudget(cache_memory_bytes)
        self.store: Store | None = None
        self._data_dir = data_dir
        self._store_options: dict[str, Any] = {
            "commit_window": commit_window,
            "busy_timeout": busy_timeout,
            "durability": durability,
            "cache": cache,
            "quota_bytes": quota_bytes,
            "quota_rows": quota_rows,
        }
        self.fingerprint = format_fingerprint(engine.chat_format)
        self.format_name = engine.chat_format.name
        self.metrics.cache_counts = lambda: (
            self.budget.hits,
            self.budget.misses,
            self.budget.evictions,
        )
        self._max_cached_bytes = max_cached_bytes
        self.whole_history = whole_history
        self._policy = policy
        self.compactor = compactor or Compactor.ephemeral()
        self._http_caches: dict[str | None, ConnectionCache] = {}
        self._unbooked: deque[tuple[Finished, str, dict[str, str | None]]] = deque()
        self.watchers: list[Observer] = []
        """Told of every finished response of the process as its connection reports it,
        before it is booked: for a wrapper of the server that keeps state of its own per
        response (`hotloop bench serve --baseline`: the peer's message store)."""

    async def start(self) -> None:
        """Open the durable store (when a data directory is configured) and start
        watching the event loop for stalls."""
        self.metrics.loop_watch.start()
        self.metrics.gc_pauses.start()
        if self._data_dir is not None and self.store is None:
            self.store = await open_store(
                self._data_dir, metrics=self.metrics, **self._store_options
            )

    @property
    def durable(self) -> bool:
        """`store=true` responses are committed before their terminal event."""
        return self.store is not None

    def storage_refusal(self, principal: str | None) -> str | None:
        """Why API key `principal` may store no more responses (its storage quota), or
        None when it may (always with auth off, or without a store)."""
        if self.store is None or principal is None:
            return None
        return self.store.quota_refusal(key_id(principal))

    async def close(self) -> None:
        """Book what is left and close the store (every acknowledged response was
        committed before its terminal event). Called after the last response ended."""
        self.metrics.loop_watch.stop()
        self.metrics.gc_pauses.stop()
        self._book_all()
        if self.store is not None:
            await self.store.close()

    # ---------------------------------------------------------------- the caches

    def http_cache(self, owner: str | None) -> ConnectionCache:
        """The process-wide cache HTTP requests of API key id `owner` continue from.
        One per key: an id never resolves to another key's state."""
        cache = self._http_caches.get(owner)
        if cache is None:
            cache = ConnectionCache(self._max_cached_bytes, self.budget, owner)
            self._http_caches[owner] = cache
        return cache

    def history_cache(self, owner: str | None) -> ConnectionCache | None:
        """The cache whose states API key id `owner`'s whole-history requests continue
        (`hotloop.protocol.history`): its HTTP cache; None when `whole_history` is off."""
        return None if self.whole_history == "off" else self.http_cache(owner)

    def seen_items(self, principal: str | None) -> SeenItems | None:
        """What a request of API key `principal` is parsed with (`parse_request`'s
        `seen`): its HTTP cache's raw addresses, when `whole_history` is bytes."""
        if self.whole_history != "bytes":
            return None
        return self.http_cache(None if principal is None else key_id(principal)).seen

    async def restore(self, response_id: str, owner: str | None) -> tuple[Checkpoint, str] | None:
        """Rebuild a stored chain into a checkpoint (the slow, correct path of a cache
        miss), with the id of the chain's first response; None if the store does not
        have it for this owner. Raises StoreError when the store cannot be read."""
        if self.store is None:
            return None
        try:
            chain = await self.store.load_chain(response_id, owner)
        except StoreError as e:
            # The response may well exist (another node committed it): never answer
            # that it does not.
            log.error("cannot load %s from the store: %s", response_id, e.message)
            raise
        if chain is None:
            return None
        # Rendering a long chain takes long (0.17 s for a million tokens): it runs in a
        # worker thread, as a large frame's render does (the core releases the GIL for
        # large items), so every other connection is served meanwhile.
        rebuilt = await asyncio.to_thread(self._rebuild, response_id, chain, owner)
        if rebuilt is None:
            return None
        checkpoint, rerenders = rebuilt
        self.metrics.store_rebuilds.inc()
        self.metrics.store_rerenders.inc(rerenders)
        return checkpoint, chain.root

    async def warm(self, cache: ConnectionCache, parent: str | None, owner: str | None) -> None:
        """Make `parent` a hit in `cache` when the store can rebuild it. Both transports
        await this before a request reaches its `Connection` (the state machine cannot
        await), so the read runs in the store's thread, never on the event loop. Raises
        StoreError when the store cannot be read."""
        if parent is None or parent in cache:
            return
        restored = await self.restore(parent, owner)
        if restored is not None:
            checkpoint, root = restored
            cache.put(parent, checkpoint, None, root)

    async def warm_request(
        self, cache: ConnectionCache, request: CreateRequest, owner: str | None
    ) -> None:
        """Everything an HTTP request continues from, made ready in `cache`: its
        `previous_response_id` (`warm`), its `conversation` (`warm_conversation`) and
        the response `prompt_cache_diagnostics` compares with (the caller's only).
        Every HTTP route that runs a request awaits this, a background one included:
        it must start from the same state a foreground one would. Raises as those do."""
        await self.warm(cache, request.previous_response_id, owner)
        await self.warm_conversation(cache, request, owner)
        await self.warm(cache, request.comparison_response_id, owner)

    async def warm_conversation(
        self, cache: ConnectionCache, request: CreateRequest, owner: str | None
    ) -> None:
        """Put the state of `request`'s conversation in `cache` under the conversation's
        id, ready for the request to extend: the newest state the cache holds of it
        whose items are still as they were (up to a response's last item, or up to an
        item added through the items API: `conversations.state_ends`), forked, and the
        items after it rendered; without one, every item rendered from the store. Each
        item added through the items API it renders leaves a state of its own
        (`conversations.item_state`). A conversation changed through its items API is
        so re-rendered from the first changed item when the items before it were added
        through the API, from the end of the response holding it otherwise; never from
        scratch while a state before it is cached. Nothing is put for an unknown (or another key's)
        conversation: the request is refused as one. Raises StoreError when the store
        cannot be read, ProtocolError (the core's refusal) when the items no longer
        render (an item deleted that a later one answers)."""
        conversation_id = request.conversation
        if conversation_id is None or request.error is not None:
            return
        if self.store is None:
            return
        # The state an earlier request put stays until this one's replaces it: a request
        # already queued on the connection may start meanwhile and needs one.
        try:
            history = await self._conversation_history(cache, conversation_id, owner)
        except StoreError:
            cache.evict(conversation_id)  # it may be stale: never start from it
            raise
        if history is None:
            cache.evict(conversation_id)
            return
        cached = None if history.key is None else cache.get(history.key)
        checkpoint = None if cached is None else cached.checkpoint
        rest = history.rest
        fields = orjson.loads(request.response_fields_json)
        compactor = self.compactor.bound(owner)

        def render() -> tuple[Checkpoint, int, list[tuple[int, Checkpoint]]] | ProtocolError:
            conversation = (
                Conversation(
                    self.engine.chat_format,
                    context_window=self.engine.context_window,
                    policy=self._policy,
                )
                if checkpoint is None
                else checkpoint.fork()
            )
            held = conversation.token_count
            tools = orjson.dumps(fields.get("tools") or []).decode()
            states: list[tuple[int, Checkpoint]] = []
            for position, added, item in rest:
                try:
                    conversation.append_items(
                        compactor.expand_items(b"[" + item + b"]").decode(),
                        instructions=fields.get("instructions"),
                        tools_json=tools,
                    )
                except CoreError as e:
                    return ProtocolError.from_core(e)
                except ProtocolError as e:
                    return e
                if added:
                    states.append((position, conversation.checkpoint()))
            return conversation.checkpoint(), conversation.token_count - held, states

        # Rendering many items takes long: in a worker thread, as a chain's rebuild.
        rendered = await asyncio.to_thread(render) if rest else render()
        self.metrics.conversation_items_rendered.inc(len(rest))
        if isinstance(rendered, ProtocolError):
            cache.evict(conversation_id)
            raise rendered
        state, fresh_tokens, states = rendered
        for position, item_state in states:
            key = conversation_tables.item_state(conversation_id, position)
            cache.put(key, item_state, None, conversation_id)
        start = ConversationStart(history.version, fresh_tokens)
        cache.put(conversation_id, state, None, conversation_id, start)

    async def _conversation_history(
        self, cache: ConnectionCache, conversation_id: str, owner: str | None
    ) -> conversation_tables.History | None:
        """The conversation read for a turn starting from the newest state `cache`
        holds (`conversations.history`)."""
        assert self.store is not None
        # The reader asks whether the cache holds a response's state: a dict lookup,
        # safe from the store's thread; an entry evicted meanwhile is read again.
        read = conversation_tables.history(conversation_id, owner, cache.__contains__)
        history = await self.store.query(read)
        if history is None or history.key is None or history.key in cache:
            return history
        read = conversation_tables.history(conversation_id, owner, lambda _: False)
        return await self.store.query(read)

    def _rebuild(
        self, response_id: str, chain: Chain, owner: str | None
    ) -> tuple[Checkpoint, int] | None:
        """The chain's checkpoint and how many of its outputs were rendered again from
        text (None if it no longer renders); its compaction items open as `owner`'s.
        Runs in a worker thread: it touches nothing shared, the caller counts the
        metrics on the loop."""
        conversation = Conversation(
            self.engine.chat_format,
            context_window=self.engine.context_window,
            policy=self._policy,
        )
        rerenders = 0

        def rerendered() -> None:
            nonlocal rerenders
            rerenders += 1

        try:
            chain.replay(conversation, self.compactor.bound(owner), self.fingerprint, rerendered)
        except (CoreError, ProtocolError) as e:
            log.warning("stored chain of %s no longer renders: %s", response_id, e.message)
            return None
        except ValueError as e:
            # A record stored before the store refused unreadable JSON.
            log.error("stored chain of %s cannot be read (%s)", response_id, type(e).__name__)
            return None
        return conversation.checkpoint(), rerenders

    # ---------------------------------------------------------------- observers

    def observer(self, principal: str | None, transport: str = "websocket") -> Books:
        """The protocol `Observer` for one connection (or one HTTP request) that
        authenticated with `principal` (the API key, None when auth is off)."""
        return Books(self, principal, transport)

    def record(self, response: Finished, transport: str) -> None:
        """Book a finished response on the loop's next turn, after the terminal frame
        (`watchers` are told now)."""
        for watcher in self.watchers:
            watcher.finished(response)
        if not self._unbooked:
            asyncio.get_running_loop().call_soon(self._book_all)
        # The connection's and request's ids, for the log line the booking writes.
        self._unbooked.append((response, transport, logs.current_ids()))

    def _book_all(self) -> None:
        while self._unbooked:
            finished, transport, ids = self._unbooked.popleft()
            try:
                self._book(finished, transport, ids)
            except Exception as e:
                # One response that cannot be booked must not stop booking for the
                # others (they are taken off the queue before booking).
                self.metrics.store_errors.labels("booking").inc()
                log.error(
                    "usage of response %s not booked (%s)", finished.response_id, type(e).__name__
                )

    def _book(self, finished: Finished, transport: str, ids: dict[str, str | None]) -> None:
        label = self.keys.label(finished.principal)
        usage = finished.usage
        log.info(
            "response %s %s over %s: %d input tokens (%d cached), %d output",
            finished.response_id,
            finished.status,
            transport,
            usage.input_tokens,
            usage.cached_tokens,
            usage.output_tokens,
            extra={**ids, "response_id": finished.response_id, "event": "response.finished"},
        )
        metrics = self.metrics
        metrics.turns.labels(transport, finished.status).inc()
        metrics.turn_overhead.labels(transport).observe(finished.overhead_ns / 1e9)
        if finished.turn is not None:
            metrics.record_prompt(
                prompt_tokens=finished.turn.prompt_tokens,
                cached_tokens=finished.turn.cached_tokens,
            )
            if finished.turn.invalidated:
                metrics.prompt_rewrites.labels(self.format_name).inc()
        self.usage.record(
            label,
            input_tokens=usage.input_tokens,
            cached_tokens=usage.cached_tokens,
            output_tokens=usage.output_tokens,
        )

    def persist(self, finished: Finished) -> asyncio.Future[ConversationStart | None]:
        """Start committing a `store=true` response, before its terminal event is sent.
        The commit counts as in flight for the shutdown drain from this call on (the
        generation that produced it may end meanwhile). The future gives where a turn
        continuing the response on its conversation starts (`_append`; None when it
        is on none, or its items end no turn), and raises StoreError
        `store_unavailable` when it was not committed: the connection then fails the
        response instead of acknowledging it."""
        self.drain.hold()
        commit = asyncio.get_running_loop().create_task(self._commit(finished))
        commit.add_done_callback(self._committed)
        return commit

    def _committed(self, commit: asyncio.Task[ConversationStart | None]) -> None:
        self.drain.release()
        if not commit.cancelled():
            # Read here too: the socket that waited for it may be gone (its failure was
            # logged by the store, and the response never acknowledged).
            commit.exception()

    async def _commit(self, finished: Finished) -> ConversationStart | None:
        if self.store is None:
            raise StoreError("store_unavailable", "This server has no durable store.")
        request = finished.request
        if request.store:
            await self._put(finished)
        if request.conversation is not None and finished.status in APPENDED:
            return await self._append(finished, request.conversation)
        return None

    async def _append(self, finished: Finished, conversation_id: str) -> ConversationStart | None:
        """The response's input items, then its output items, onto its conversation;
        where a turn continuing the response's state on it starts (its automatic
        successor: `protocol/steering.py`), when that state is the conversation's."""
        assert self.store is not None
        owner = key_id(finished.principal) if finished.principal is not None else None
        response_id = finished.response_id
        items = [(str(item["id"]), orjson.dumps(item)) for item in _in_order(finished)]
        if not items:
            return None
        started = finished.conversation_start
        read = None if started is None else started.version
        added = conversation_tables.add(conversation_id, owner, items, response_id, read)
        appended = await self.store.transact(added)
        if appended is None:
            # Deleted while the response ran: nothing to append to.
            log.info(
                "conversation %s is gone: response %s not appended", conversation_id, response_id
            )
            return None
        self.store.counted(owner, conversation_tables.added_usage(items))
        # Nothing of the conversation is rendered to continue the response's state.
        return ConversationStart(appended.version, 0) if appended.ends_turn else None

    async def _put(self, finished: Finished) -> None:
        assert self.store is not None
        request = finished.request
        input_items = request.input_json.encode()
        if finished.segments:
            input_items, output_ids, turns = _interleaved(input_items, finished.segments)
        else:
            output_ids, turns = _output_ids(finished), []
        stored = StoredResponse(
            id=finished.response_id,
            owner=key_id(finished.principal) if finished.principal is not None else None,
            previous_response_id=request.previous_response_id,
            created_at=finished.created_at,
            response=finished.response_json,
            input_items=input_items,
            output_token_ids=output_ids,
            fingerprint=self.fingerprint,
            model_turns=turns,
        )
        await self.store.put(stored)


def _output_ids(finished: Finished) -> list[int]:
    """The assistant segment as the cache holds it: the sampled ids verbatim (with the
    format's end-of-message token). Empty when the response cannot be continued."""
    if finished.checkpoint is None or finished.turn is None:
        return []
    return finished.checkpoint.fork().prompt().tokens_from(finished.turn.prompt_tokens)


def _in_order(finished: Finished) -> list[dict[str, Any]]:
    """The response's items as its model saw them, for its conversation: the request's
    input, then each model turn's output followed by the input committed inside the
    response after it (a long-running response's injected tool outputs and steering
    input), input items with the ids its stored input items list."""
    input_items = finished.request.input_json.encode()
    if finished.segments:
        input_items, _, _ = _interleaved(input_items, finished.segments)
    inputs = listed_items(finished.response_id, input_items)
    outputs = orjson.loads(finished.response_json).get("output") or []
    at_input = len(inputs) - sum(len(segment.then) for segment in finished.segments)
    items, at_output = inputs[:at_input], 0
    for segment in finished.segments:
        items += outputs[at_output : segment.outputs_end]
        items += inputs[at_input : at_input + len(segment.then)]
        at_output, at_input = segment.outputs_end, at_input + len(segment.then)
    return items + outputs[at_output:]


def _interleaved(
    input_items: bytes, segments: tuple[TurnSegment, ...]
) -> tuple[bytes, list[int], list[ModelTurn]]:
    """A long-running response that took input while it ran, as the store keeps it:
    the request's input items (their bytes as sent) followed by the input committed
    inside the response, every model turn's ids in one run, and the bounds between."""
    ids: list[int] = []
    inside: list[dict[str, Any]] = []
    turns = []
    for segment in segments:
        ids += segment.token_ids
        inside += segment.then
        turns.append(ModelTurn(segment.outputs_end, len(ids), len(segment.then)))
    if inside:
        items = orjson.dumps(inside)
        head = input_items.rstrip()[:-1].rstrip()
        input_items = items if head.endswith(b"[") else head + b"," + items[1:]
    return input_items, ids, turns


class Books:
    """A `protocol.Observer` bound to one principal: finished responses are booked
    under its key id (`owner`, which also scopes `Ledger.warm`'s store reads)."""

    def __init__(self, ledger: Ledger, principal: str | None, transport: str) -> None:
        self.ledger = ledger
        self.principal = principal
        self.owner = key_id(principal) if principal is not None else None
        self.transport = transport

    def finished(self, response: Finished) -> None:
        self.ledger.record(response, self.transport)


__all__ = ["Books", "Ledger"]
