"""The HTTP half of the Responses API, as one raw ASGI callable.

Routes (each also without the `/v1` prefix, and below any mount point):

- `POST /v1/responses/compact` (a sealed summary of the conversation) and
  `POST /v1/responses/input_tokens` (its prompt tokens, counted without generating)
- `POST /v1/responses`: JSON, or with `"stream": true` SSE frames (`event:` + `data:`)
  carrying exactly the WebSocket payloads. The turn runs through the same sans-I/O
  `Connection` as WebSocket mode, with the process-wide cache of the caller's key as
  its cache, so `previous_response_id` continues warm state without re-rendering; a
  miss rebuilds the chain from the store first.
- `POST /v1/chat/completions`: a Chat Completions request, parsed by the core into the
  `CreateRequest` it is served as and run as `POST /v1/responses` runs one (same key,
  bounds, cache and engines); `chat.py` writes its reply (chunks or a completion)
- `GET` / `DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`
- `GET /v1/models`, `GET /v1/models/{id}`, `GET /v1/usage` (the caller's token usage)
- `GET /health` (503 while draining or while the store cannot commit, so load balancers
  stop routing here), `GET /metrics`

Every POST body may be compressed (`Content-Encoding: gzip` or `zstd`, `encoding.py`).

This module owns HTTP concerns only: routing, Bearer auth, the turns' requests and
replies, and error envelopes; reading a body within its size limit is `bodies.py`'s, the
routes of stored responses (and the pages' query parameters) `stored.py`'s. Replies, SSE
framing and client disconnects are `exchange.py`'s; background responses' routes
(`background: true`, their resume and cancel) are `background.py`'s, which runs their
turns through this API (`Turns`). Protocol decisions are the `Connection`'s; bookkeeping
after a response is the `Ledger`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from hotloop import logs
from hotloop._core import (
    Body,
    ChatRequest,
    CoreError,
    CreateRequest,
    Policy,
    SeenItems,
    parse_chat_request,
    parse_request,
)
from hotloop.auth import ApiKeys, AuthError, key_id
from hotloop.config import ServerConfig
from hotloop.events import error_body
from hotloop.ledger import Ledger
from hotloop.mcp_client import McpClient, McpSettings
from hotloop.protocol import (
    Connection,
    ConnectionCache,
    ConnectionLimits,
    Finished,
    Observer,
    QueueMemory,
    offloads,
)
from hotloop.protocol.compaction import Compactor
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.mcp_tools import McpTurn, asks, rewritten
from hotloop.protocol.parsing import OFFLOAD_BYTES
from hotloop.protocol.response import STORE_UNAVAILABLE
from hotloop.shutdown import ShuttingDown
from hotloop.store import StoreError
from hotloop.transport.asgi import Message, Receive, Scope, Send, header
from hotloop.transport.background import BackgroundRoutes, BackgroundWork
from hotloop.transport.bodies import ClientGone, Reservation, read_body
from hotloop.transport.chat import ChatStream, completion
from hotloop.transport.conversations import ConversationsApi
from hotloop.transport.driver import Driver, Outlet
from hotloop.transport.encoding import PER_KEY, Decoder
from hotloop.transport.exchange import (
    ENDINGS,
    SSE_HEADERS,
    Emit,
    Exchange,
    disconnected,
    event_type,
    rendered,
    reply,
    reply_refusal,
    sse_frame,
    sse_frames,
)
from hotloop.transport.stored import KeyedSlots, StoredRoutes
from hotloop.turnclock import TurnClock

log = logging.getLogger("hotloop.http")

METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


class HttpApi:
    """Every HTTP route of the server (see the module docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        model: str,
        keys: ApiKeys,
        limits: ConnectionLimits | None = None,
        policy: Policy | None = None,
        queue_memory: QueueMemory | None = None,
        compactor: Compactor | None = None,
        reads_per_key: int = 2,
        background: BackgroundWork | None = None,
        default_model: str | None = None,
        mcp: McpClient | None = None,
        max_compressed_frames: int = ServerConfig.max_compressed_frames,
        send_buffer_bytes: int = ServerConfig.send_buffer_bytes,
    ) -> None:
        self.ledger = ledger
        self.model = model
        self.default_model = default_model
        """What a request without `model` is served as; None: it is refused (400)."""
        self.keys = keys
        self.limits = limits or ConnectionLimits()
        self.policy = policy
        self.queue_memory = queue_memory or QueueMemory(1 << 62, 1 << 62)
        """Request bodies count in the process's queue memory while read and parsed."""
        self.compactor = compactor or Compactor.ephemeral()
        self._compactors: dict[str | None, Compactor] = {}
        self.reads = KeyedSlots(reads_per_key)
        """Store reads in progress per key: one key's reads of 15 MB pages take a
        bounded share of the store's reader threads, never all of them."""
        self.created = int(time.time())
        self.background = background or BackgroundWork()
        """Background responses (`background: true`) running in this process."""
        self.background_routes = BackgroundRoutes(self.background, ledger, self.reads.slot, self)
        self.stored = StoredRoutes(ledger, self.background, self.background_routes, self.reads)
        self.mcp = mcp or McpClient(McpSettings())
        """Lists and calls the `mcp` tools of requests (none allowed without one)."""
        self.send_buffer_bytes = send_buffer_bytes
        """Bytes of events queued for a slow client before its generation pauses."""
        self.decoder = Decoder(
            self.limits.max_frame_bytes, max_compressed_frames, KeyedSlots(PER_KEY).slot
        )
        """Decodes compressed bodies, one per key at a time, on threads of its own."""

    async def close(self) -> None:
        await self.background.close()
        self.decoder.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = logs.bound_request_id()
        send = with_request_id(send, request_id)
        try:
            await self._route(scope, receive, send, request_id)
        except ClientGone:
            return
        except ProtocolError as e:
            await _error(send, e)
        except AuthError as e:
            await _error(send, ProtocolError(e.code, e.message, status=401))
        except ShuttingDown as e:
            await _error(send, ProtocolError(e.code, e.message, status=e.status))
        except StoreError as e:
            await _error(send, ProtocolError(e.code, e.message, status=503))

    async def _route(self, scope: Scope, receive: Receive, send: Send, request_id: str) -> None:
        method: str = scope["method"]
        parts = _route_path(scope).strip("/").split("/")
        if parts[0] == "v1":
            parts = parts[1:]
        if parts == ["health"]:
            _allow(method, "GET")
            await self._health(send)
            return
        if parts == ["metrics"]:
            _allow(method, "GET")
            await reply(send, 200, self.ledger.metrics.render().encode(), METRICS_TYPE)
            return
        if not parts or parts[0] not in ("responses", "models", "usage", "conversations", "chat"):
            raise ProtocolError("not_found", f"No route for {method} {scope['path']}.", status=404)
        credential = self.keys.authenticate(header(scope, b"authorization"))
        # The protocol layer names callers by key (it hashes them into ids itself).
        principal, owner, label = credential if credential is not None else (None, None, None)
        match parts:
            case ["conversations", *rest]:
                conversations = ConversationsApi(
                    self.ledger.store, self.limits.request, self.ledger.budget.evict_everywhere
                )

                async def read_body() -> bytes:
                    reserved = Reservation(self.queue_memory, principal)
                    try:
                        body = await self._body(scope, receive, principal, reserved)
                    finally:
                        reserved.release()
                    assert isinstance(body, bytes)  # not pooled
                    return body

                async def reply_json(status: int, payload: bytes) -> None:
                    await reply(send, status, payload)

                query_string = scope.get("query_string", b"")
                await conversations.route(
                    method, rest, query_string, read_body, reply_json, owner, _allow
                )
            case ["responses"]:
                _allow(method, "POST")
                await self._create(scope, receive, send, principal, request_id)
            case ["chat", "completions"]:
                _allow(method, "POST")
                await self._chat(scope, receive, send, principal, request_id)
            case ["responses", "compact"]:
                _allow(method, "POST")
                await self._compact(scope, receive, send, principal, request_id)
            case ["responses", "input_tokens"]:
                _allow(method, "POST")
                await self._input_tokens(scope, receive, send, principal, request_id)
            case ["responses", response_id]:
                _allow(method, "GET", "DELETE")
                if method == "GET":
                    await self.stored.retrieve(scope, receive, send, response_id, owner)
                else:
                    await self.stored.delete(send, response_id, owner)
            case ["responses", response_id, "cancel"]:
                _allow(method, "POST")
                await self.background_routes.cancel(send, response_id, owner)
            case ["responses", response_id, "input_items"]:
                _allow(method, "GET")
                await self.stored.input_items(scope, send, response_id, owner)
            case ["models"]:
                _allow(method, "GET")
                body = {"object": "list", "data": [self._model_object()]}
                await reply(send, 200, orjson.dumps(body))
            case ["models", name]:
                _allow(method, "GET")
                if name != self.model:
                    raise ProtocolError(
                        "model_not_found",
                        f"The model '{name}' does not exist.",
                        "model",
                        status=404,
                    )
                await reply(send, 200, orjson.dumps(self._model_object()))
            case ["usage"]:
                _allow(method, "GET")
                totals = self.ledger.usage.of(label)
                body = {"object": "usage", "key": label or "anonymous", **totals.to_json()}
                await reply(send, 200, orjson.dumps(body))
            case _:
                raise ProtocolError(
                    "not_found", f"No route for {method} {scope['path']}.", status=404
                )

    def _model_object(self) -> dict[str, Any]:
        return {"id": self.model, "object": "model", "created": self.created, "owned_by": "hotloop"}

    async def _health(self, send: Send) -> None:
        store = self.ledger.store
        if self.ledger.drain.draining:
            status = "draining"
        elif store is not None and not store.healthy:
            # store=true responses fail until a write commits again: route elsewhere.
            status = "store_unavailable"
        else:
            status = "ok"
        body = {"status": status, "model": self.model}
        await reply(send, 200 if status == "ok" else 503, orjson.dumps(body))

    # ---------------------------------------------------------------- POST /v1/responses

    async def _create(
        self, scope: Scope, receive: Receive, send: Send, principal: str | None, request_id: str
    ) -> None:
        if self.ledger.drain.draining:
            # Only a kept-alive connection can still send one: the listener is closed.
            raise ShuttingDown
        # Over HTTP the turn's clock starts at the request's head: reading the body
        # (the whole history, for a stateless client) is part of `prepare`.
        clock = TurnClock(time.perf_counter_ns())
        size, request, parse_ns, body = await self._request(scope, receive, principal, self._parse)
        mcp = None
        if asks(request, body):

            def reparse(body: str | bytes) -> CreateRequest:
                return self._parse(body, principal)

            body, mcp = await rewritten(
                self.mcp, bytes(body), principal, self.limits.request, reparse
            )
            request = reparse(body)
        del body  # the request holds what the response needs
        if request.background and request.error is None:

            def connect(cache: ConnectionCache, observer: Observer) -> Connection:
                return self._connection(scope, cache, principal, request_id, observer, True)

            await self.background_routes.create(
                receive, send, principal, connect, request, size, parse_ns, mcp
            )
            return
        turn = _Turn(request, size, parse_ns, clock, mcp)
        await self._respond(scope, receive, send, principal, request_id, turn, RESPONSES)

    async def _chat(
        self, scope: Scope, receive: Receive, send: Send, principal: str | None, request_id: str
    ) -> None:
        """`POST /v1/chat/completions`: the request as the core parsed it, run as a
        Responses request; its reply in Chat Completions' form (`chat.py`)."""
        if self.ledger.drain.draining:
            raise ShuttingDown
        clock = TurnClock(time.perf_counter_ns())
        size, chat, parse_ns, _ = await self._request(scope, receive, principal, self._parse_chat)
        turn = _Turn(chat.request, size, parse_ns, clock, None)
        wire = _Wire(ChatStream(chat.include_usage).sse, completion)
        await self._respond(scope, receive, send, principal, request_id, turn, wire)

    async def _respond(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        principal: str | None,
        request_id: str,
        turn: _Turn,
        wire: _Wire,
    ) -> None:
        """Run a parsed request's turn on the key's cache and reply in `wire`'s form:
        a refusal as its error envelope, else SSE frames or the finished body."""
        request = turn.request
        books = self.ledger.observer(principal, "http")
        cache = self.ledger.http_cache(books.owner)
        await self.ledger.warm_request(cache, request, books.owner)
        exchange = Exchange(books, cache)
        connection = self._connection(scope, cache, principal, request_id, exchange)
        connection.receive_request(request, turn.size, turn.parse_ns, turn.mcp)
        actions = await rendered(connection, self.mcp)
        refusal = next((a for a in actions if isinstance(a, bytes) and _is_error(a)), None)
        if refusal is not None:
            await reply_refusal(send, refusal)
            return
        if request.stream:
            await self._stream(receive, send, connection, actions, turn.clock, wire.sse)
        else:
            await self._answer(receive, send, connection, actions, exchange, wire.body)

    async def _request(
        self,
        scope: Scope,
        receive: Receive,
        principal: str | None,
        parser: Callable[[bytes | Body, str | None], Parsed],
    ) -> tuple[int, Parsed, int, bytes | Body]:
        """The body's size, the body parsed by `parser` (as `principal`'s), the parse
        time and the body (a large one in a pooled `Body`). The body counts in the
        process's queue memory until it is parsed (a body of up to 16 MiB need not live as
        long as the response: callers drop it)."""
        reserved = Reservation(self.queue_memory, principal)

        def parse(body: bytes | Body) -> Parsed:
            return parser(body, principal)

        try:
            body = await self._body(scope, receive, principal, reserved, pooled=True)
            start = time.perf_counter_ns()
            # A large body (input, tools or instructions): parsed in a worker thread,
            # unless its key resends histories (most of it is hashed, not parsed).
            seen = self.ledger.seen_items(principal)
            resent = seen is not None and len(seen) > 0
            if offloads(body, resent):
                request = await asyncio.to_thread(parse, body)
            else:
                request = parse(body)
        finally:
            reserved.release()
        return len(body), request, time.perf_counter_ns() - start, body

    async def _body(
        self,
        scope: Scope,
        receive: Receive,
        principal: str | None,
        reserved: Reservation,
        pooled: bool = False,
    ) -> bytes | Body:
        """The body of a POST as the client wrote it: read within the limit, decompressed
        when it came with a `Content-Encoding` (`encoding.py`), counted in `reserved`;
        `pooled`: for a reader that takes a `Body` (the core's parse), a large body
        declared uncompressed is written into one."""
        encoding = header(scope, b"content-encoding")
        limit = self.limits.max_frame_bytes
        body = await read_body(scope, receive, limit, reserved, pooled and encoding is None)
        if encoding is None:
            return body
        assert isinstance(body, bytes)
        body = await self.decoder.decoded(encoding, body, principal)
        reserved.add(len(body))
        return body

    def _parse(self, body: str | bytes | Body, principal: str | None) -> CreateRequest:
        """Parse a turn's body, its compaction items expanded first; the leading items a
        request of the key sent before are recognized by their bytes, not parsed (only a
        turn continues from the state holding them). Raises ProtocolError."""
        return self._parse_items(body, principal, self.ledger.seen_items(principal))

    def _parse_whole(self, body: str | bytes | Body, principal: str | None) -> CreateRequest:
        """Parse every item of a body whose whole input is rendered anew (compact,
        input_tokens). Raises ProtocolError."""
        return self._parse_items(body, principal, None)

    def _parse_items(
        self, body: str | bytes | Body, principal: str | None, seen: SeenItems | None
    ) -> CreateRequest:
        try:
            request = parse_request(body, self.limits.request, seen)
            if request.error is None:
                return request
            # A compaction item is no input item the core knows: only a refused body is
            # searched for them (a history resent each turn is not), expanded and parsed
            # again.
            raw = bytes(body) if isinstance(body, Body) else body
            expanded = self._compactor(principal).expand(raw)
            if expanded is raw:
                return request
            return parse_request(expanded, self.limits.request, seen)
        except CoreError as e:
            raise ProtocolError.from_core(e) from e

    def _parse_chat(self, body: bytes | Body, principal: str | None) -> ChatRequest:
        """Parse a Chat Completions body (it holds no compaction items). Raises
        ProtocolError."""
        try:
            return parse_chat_request(body, self.limits.request, self.ledger.seen_items(principal))
        except CoreError as e:
            raise ProtocolError.from_core(e) from e

    def _connection(
        self,
        scope: Scope,
        cache: ConnectionCache,
        principal: str | None,
        request_id: str,
        observer: Observer | None = None,
        background: bool = False,
    ) -> Connection:
        return Connection(
            chat_format=self.ledger.engine.chat_format,
            context_window=self.ledger.engine.context_window,
            model=self.default_model or self.model,
            model_required=self.default_model is None,
            cache=cache,
            limits=self.limits,
            policy=self.policy,
            observer=observer,
            principal=principal,
            session_key=session_key(scope),
            durable=self.ledger.durable,
            storage_refusal=self.ledger.storage_refusal,
            request_id=request_id,
            compactor=self._compactor(principal),
            sampling_defaults=self.ledger.engine.sampling_defaults,
            background=background,
            history=self.ledger.history_cache(cache.owner),
        )

    def _compactor(self, principal: str | None) -> Compactor:
        """The compaction key as `principal`'s: it opens that key's items only. Bound
        once per key (the keys are the configured ones), not twice per request."""
        bound = self._compactors.get(principal)
        if bound is None:
            bound = self.compactor.bound(None if principal is None else key_id(principal))
            self._compactors[principal] = bound
        return bound

    # ---------------------------------------------------------------- compact, input_tokens

    async def _compact(
        self, scope: Scope, receive: Receive, send: Send, principal: str | None, request_id: str
    ) -> None:
        """`POST /v1/responses/compact`: the engine summarizes the conversation into a
        sealed `compaction` item (`Connection.receive_compact`)."""
        _, request, _, _ = await self._request(scope, receive, principal, self._parse_whole)
        if request.model is None and self.default_model is None:
            raise ProtocolError.missing_model()
        # The summary is engine work: booked to the key like a response.
        books = self.ledger.observer(principal, "http")
        cache = self.ledger.http_cache(books.owner)
        await self.ledger.warm_request(cache, request, books.owner)
        connection = self._connection(scope, cache, principal, request_id, books)
        connection.receive_compact(request)
        replies: list[bytes] = []

        async def keep(frames: list[bytes]) -> None:
            replies.extend(frames)

        await self._run(receive, connection, connection.actions(), keep)
        if not replies:
            return  # the client went away
        if _is_error(replies[-1]):
            await reply_refusal(send, replies[-1])
        else:
            await reply(send, 200, replies[-1])

    async def _input_tokens(
        self, scope: Scope, receive: Receive, send: Send, principal: str | None, request_id: str
    ) -> None:
        """`POST /v1/responses/input_tokens`: the prompt tokens of the request, in the
        model's format and tokenizer, rendered as a turn would be (from the cached
        chain when `previous_response_id` hits: only the new items)."""
        _, request, _, _ = await self._request(scope, receive, principal, self._parse_whole)
        owner = self.ledger.observer(principal, "http").owner
        cache = self.ledger.http_cache(owner)
        await self.ledger.warm_request(cache, request, owner)
        conversation = self._connection(scope, cache, principal, request_id).conversation_for(
            request
        )
        try:
            if request.frame_bytes >= OFFLOAD_BYTES:
                turn = await asyncio.to_thread(conversation.extend, request)
            else:
                turn = conversation.extend(request)
        except CoreError as e:
            raise ProtocolError.from_core(e) from e
        body = {"object": "response.input_tokens", "input_tokens": turn.prompt_tokens}
        await reply(send, 200, orjson.dumps(body))

    async def _stream(
        self,
        receive: Receive,
        send: Send,
        connection: Connection,
        actions: list[Any],
        clock: TurnClock | None,
        sse: Callable[[list[bytes]], bytes],
    ) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        # The batch that ends the response ends the body in the same write (one syscall
        # and one packet, not two), as soon as it is there: nothing of a response streams
        # after its end (`ENDINGS`), and the stream the engine closes after it holds no
        # client up.
        ended = False

        async def emit(frames: list[bytes]) -> None:
            nonlocal ended
            if ended:
                log.warning("%d frames after the response's end dropped", len(frames))
                return
            ended = bool(frames) and event_type(frames[-1]) in ENDINGS
            await send({"type": "http.response.body", "body": sse(frames), "more_body": not ended})

        await self._run(receive, connection, actions, emit, clock, lambda: ended)
        if not ended:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _answer(
        self,
        receive: Receive,
        send: Send,
        connection: Connection,
        actions: list[Any],
        exchange: Exchange,
        body: Callable[[bytes], bytes],
    ) -> None:
        """A request that does not stream: its finished Response as `body` writes it,
        sent once its terminal event is there (as `_stream` ends its body)."""
        answered = False

        async def emit(frames: list[bytes]) -> None:
            nonlocal answered
            if not answered and frames and event_type(frames[-1]) in ENDINGS:
                answered = True
                await _reply_final(send, exchange.result, body)

        await self._run(receive, connection, actions, emit, answered=lambda: answered)
        if not answered and not connection.closed:
            await _reply_final(send, exchange.result, body)

    async def _run(
        self,
        receive: Receive,
        connection: Connection,
        actions: list[Any],
        emit: Emit,
        clock: TurnClock | None = None,
        answered: Callable[[], bool] = lambda: False,
    ) -> None:
        """Run the connection's actions until it is idle; a client that disconnects
        stops them (uvicorn's `send` to a closed connection is silent), and what the
        engine did until then is booked (`Connection.abandon`). Once `answered()` (the
        response's end is sent, which uvicorn then reports as a disconnect), the actions
        finish on their own."""
        driver = self.driver(connection, emit, clock)
        try:
            driver.dispatch(actions)
            await driver.flush()
            if not driver.working:
                return
            settled = asyncio.ensure_future(driver.settle())
            watcher = asyncio.ensure_future(disconnected(receive))
            try:
                await asyncio.wait((settled, watcher), return_when=asyncio.FIRST_COMPLETED)
                if not settled.done() and answered():
                    await settled
            finally:
                watcher.cancel()
                settled.cancel()
                await asyncio.gather(settled, watcher, return_exceptions=True)
            if driver.working:
                await driver.close()
                connection.abandon()
        finally:
            await driver.close()

    def driver(self, connection: Connection, emit: Emit, clock: TurnClock | None = None) -> Driver:
        """The driver of one exchange's connection (`driver.py`): its frames to `emit`,
        its engine work on the engine cache of the request's key, a stored response
        committed before its terminal event. `clock`: the turn's
        (`hotloop.turnclock`), for its first engine call."""
        session = self.ledger.engine.session(self.keys.cache_salt(connection.settings.principal))
        driver = Driver(
            connection,
            session,
            Outlet(emit),
            mcp=self.mcp,
            commit=self.ledger.persist,
            high_water=self.send_buffer_bytes,
            phases=self.ledger.metrics.turn_phases,
            transport="http",
        )
        driver.clock = clock
        return driver


# The messages that open an HTTP response: a plain one, a WebSocket upgrade's
# acceptance, and its refusal.
RESPONSE_STARTS = frozenset(
    ("http.response.start", "websocket.accept", "websocket.http.response.start")
)


def with_request_id(send: Send, request_id: str) -> Send:
    """`send` that stamps the response with `x-request-id`, where OpenAI's SDKs read a
    request's id (`_request_id` on the returned object, `request_id` on errors)."""
    stamp = (b"x-request-id", request_id.encode())

    async def stamped(message: Message) -> None:
        if message["type"] in RESPONSE_STARTS:
            message = {**message, "headers": [*message.get("headers", ()), stamp]}
        await send(message)

    return stamped


def _is_error(frame: bytes) -> bool:
    return frame.startswith(b'{"type":"error"')


def _allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise ProtocolError(
            "method_not_allowed",
            f"{method} is not allowed here; use {' or '.join(allowed)}.",
            status=405,
        )


def _route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path


# Where clients name their conversation: the OpenAI SDKs' and Codex's session headers.
SESSION_HEADERS = (b"session_id", b"x-session-id", b"session-id")
MAX_SESSION_KEY = 256


def session_key(scope: Scope) -> str | None:
    """The client's session header, if it sent one (routing only: it names a
    conversation for the upstream replicas, it is not a credential). A value longer
    than `MAX_SESSION_KEY` is not a session name; it is ignored."""
    for name in SESSION_HEADERS:
        value = header(scope, name)
        if value and len(value) <= MAX_SESSION_KEY:
            return value.decode("latin-1")
    return None


async def _error(send: Send, error: ProtocolError) -> None:
    body = error_body(error.code, error.message, error.param, error.status, error.retry_after)
    await reply(send, error.status, body, retry_after=error.retry_after)


async def _reply_final(
    send: Send, finished: Finished | None, body: Callable[[bytes], bytes]
) -> None:
    """The reply to a request that did not stream: its finished Response as `body`
    writes it, or the error of one that failed."""
    if finished is None:
        # The engine stopped without a terminal event: only a disconnect does that,
        # and then nobody is listening.
        return
    if finished.status == "failed":
        error = finished.error or {}
        code = finished.failure or "server_error"
        await _error(
            send,
            ProtocolError(
                code,
                error.get("message", "The response failed."),
                # Not stored, so not acknowledged: the client may retry elsewhere.
                status=503 if code == STORE_UNAVAILABLE else 500,
            ),
        )
        return
    await reply(send, 200, body(finished.response_json))


Parsed = TypeVar("Parsed")


@dataclass(frozen=True)
class _Turn:
    """A parsed request, with what its exchange counts and times."""

    request: CreateRequest
    size: int
    parse_ns: int
    clock: TurnClock
    mcp: McpTurn | None


@dataclass(frozen=True)
class _Wire:
    """How an exchange writes its reply: the SSE bytes of a batch of events, and the
    body of a finished Response (a refusal is the same error envelope in both APIs)."""

    sse: Callable[[list[bytes]], bytes]
    body: Callable[[bytes], bytes]


def _as_is(response_json: bytes) -> bytes:
    return response_json


RESPONSES = _Wire(sse_frames, _as_is)
"""The Responses API's: every event as an SSE frame, the Response object as is."""


__all__ = ["HttpApi", "sse_frame", "with_request_id"]
