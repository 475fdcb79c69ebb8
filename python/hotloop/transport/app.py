"""The hotloop ASGI application: routing, the WebSocket upgrade and the lifespan.

`App` is a raw ASGI callable (no framework on the hot path). It serves WebSocket mode
on `GET /v1/responses` and hands every HTTP request to the HTTP routes it was given
(`transport/http.py`). `App.from_config` builds the whole server, as `hotloop serve`
runs it (the HTTP routes, the ledger: store, usage, metrics, shutdown drain); the
constructor only assembles parts, and without `http=` serves WebSocket mode alone. It
can run on its own (`hotloop serve`, uvicorn) or be mounted inside an existing
Starlette/FastAPI application; when mounted, the host's lifespan must call `start()`
and `close()` (Starlette does not forward lifespan events to mounted apps).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from hotloop import logs
from hotloop._core import CreateRequest, Limits, Policy
from hotloop.auth import ApiKeys, AuthError
from hotloop.config import ServerConfig
from hotloop.engines import load_engine
from hotloop.engines.base import Engine, EngineError
from hotloop.events import error_body
from hotloop.heap import HeapTrim, fix_mmap_threshold, settle_heap
from hotloop.ledger import Ledger
from hotloop.mcp_client import McpClient, McpSettings
from hotloop.protocol import (
    CacheBudget,
    Connection,
    ConnectionCache,
    ConnectionLimits,
    Observer,
    Parsed,
    QueueMemory,
)
from hotloop.protocol.compaction import Compactor
from hotloop.protocol.injection import MULTI_AGENT_BETA
from hotloop.store import StoreError
from hotloop.transport.admission import RETRY_AFTER_SECONDS
from hotloop.transport.asgi import (
    CONNECTION_DRAIN,
    RECEIVE_UTF8,
    SEND_FRAMES,
    WRITE_FRAMES,
    ASGIApp,
    Receive,
    Scope,
    Send,
    header,
)
from hotloop.transport.background import BackgroundLimits, BackgroundWork
from hotloop.transport.http import HttpApi, session_key, with_request_id
from hotloop.transport.websocket import Socket, deny

log = logging.getLogger("hotloop")

RESPONSES_PATHS = ("/v1/responses", "/responses")


def connection_limits(config: ServerConfig, engine: Engine) -> ConnectionLimits:
    """The bounds every connection and HTTP request of the server gets; `input_image`
    parts are accepted only when the engine takes images."""
    return ConnectionLimits(
        max_frame_bytes=config.max_frame_bytes,
        max_queued_bytes=config.max_queued_bytes,
        request=Limits(images="image" in engine.modalities),
    )


def route_path(scope: Scope) -> str:
    """The path below the mount point (Starlette keeps the full path in `path` and
    the mount prefix in `root_path`)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    return path


class App:
    """The server as one ASGI application (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        config: ServerConfig | None = None,
        *,
        http: ASGIApp | None = None,
        observer: Observer | None = None,
        ledger: Ledger | None = None,
        policy: Policy | None = None,
        keys: ApiKeys | None = None,
        queue_memory: QueueMemory | None = None,
        compactor: Compactor | None = None,
        mcp: McpClient | None = None,
    ) -> None:
        self.engine = engine
        self.config = config or ServerConfig()
        self._heap = HeapTrim(
            self.config.heap_trim_interval,
            None if ledger is None else ledger.metrics.heap_trims.labels(),
        )
        """Hands what large requests freed back to the operating system (`hotloop.heap`)."""
        # Shared with the HTTP routes when `from_config` hands both the same one.
        self.mcp = mcp or McpClient(McpSettings.of(self.config))
        # Without one (an app built by hand), items sealed here open only in this process.
        self.compactor = compactor or Compactor.ephemeral()
        # The same check as the HTTP routes (`from_config` hands both one `ApiKeys`).
        self.keys = keys or ApiKeys(
            self.config.api_keys,
            self.config.tenant_label_secret,
            cache_scope=self.config.engine_cache_scope,
            cache_secret=self.compactor.cache_secret,
        )
        self.budget = (
            CacheBudget(self.config.cache_memory_bytes) if ledger is None else ledger.budget
        )
        self.connections = 0
        self._connections_of: dict[str | None, int] = {}
        """Open WebSockets and HTTP requests in progress per API key id (the per-key
        connection cap)."""
        self._http = http
        self._observer = observer
        # Store, usage, metrics and the shutdown drain (`hotloop.shutdown.find_drain`
        # finds `drain` here).
        self.ledger = ledger
        self.drain = None if ledger is None else ledger.drain
        self._policy = policy
        self._limits = connection_limits(self.config, engine)
        # `hotloop serve` names its node on every response (uvicorn's default headers);
        # a refused upgrade is answered by the app, which names it here.
        self._denial_headers = (
            [(b"x-hotloop-node", self.config.node_id.encode())] if self.config.node_id else []
        )
        # Shared with the HTTP routes when `from_config` hands both the same one.
        self.queue_memory = queue_memory or QueueMemory(
            self.config.max_queued_bytes_total, self.config.max_queued_bytes_per_key
        )

    @classmethod
    def from_config(cls, config: ServerConfig, engine: Engine | None = None) -> App:
        """The whole server, as `hotloop serve` runs it: WebSocket mode, every HTTP route
        (Responses, Chat Completions, conversations, models, usage, health, metrics) and
        the ledger (the store at `config.store` or in `config.data_dir`, usage, metrics,
        shutdown drain), around `engine` (by default the one `config.engine` names)."""
        if engine is None:
            engine = load_engine(config)
        compactor = compactor_for(config)
        keys = ApiKeys(
            config.api_keys,
            config.tenant_label_secret,
            cache_scope=config.engine_cache_scope,
            cache_secret=compactor.cache_secret,
        )
        ledger = Ledger(
            engine,
            keys=keys,
            cache_memory_bytes=config.cache_memory_bytes,
            max_cached_bytes=config.max_cached_bytes,
            whole_history=config.whole_history,
            # An empty data directory means no durable store: store=true is then a no-op.
            data_dir=config.store or config.data_dir or None,
            commit_window=config.store_commit_window,
            busy_timeout=config.store_busy_timeout,
            durability=config.store_durability,
            cache=config.store_cache,
            quota_bytes=config.store_quota_bytes,
            quota_rows=config.store_quota_rows,
            compactor=compactor,
        )
        ledger.metrics.node = config.node
        queue_memory = QueueMemory(
            config.max_queued_bytes_total,
            config.max_queued_bytes_per_key,
            ledger.metrics.refusals.labels("queue_memory_exceeded").inc,
        )
        ledger.metrics.queued_bytes = lambda: queue_memory.used_bytes
        # One per process: its bounds hold across both transports.
        mcp = McpClient(McpSettings.of(config))
        http = HttpApi(
            ledger,
            model=config.model or engine.model,
            keys=keys,
            limits=connection_limits(config, engine),
            queue_memory=queue_memory,
            compactor=compactor,
            reads_per_key=config.max_reads_per_key,
            background=BackgroundWork(
                BackgroundLimits(
                    config.max_background_per_key,
                    config.max_background,
                    config.background_event_bytes,
                    config.background_lease,
                ),
                config.node,
            ),
            default_model=config.default_model,
            mcp=mcp,
            max_compressed_frames=config.max_compressed_frames,
            send_buffer_bytes=config.send_buffer_bytes,
        )
        return cls(
            ledger.engine,
            config,
            http=http,
            ledger=ledger,
            keys=keys,
            queue_memory=queue_memory,
            compactor=compactor,
            mcp=mcp,
        )

    @property
    def model(self) -> str:
        return self.config.model or self.engine.model

    async def start(self) -> None:
        await self.engine.start()
        if self.ledger is not None:
            await self.ledger.start()
            if isinstance(self._http, HttpApi):
                await self._http.background.start(self.ledger.store)
        if self.config.gc_young:
            settle_heap(self.config.gc_young)
        if self.config.heap_mmap_threshold:
            fix_mmap_threshold(self.config.heap_mmap_threshold)
        self._heap.start()

    async def close(self) -> None:
        await self._heap.stop()
        if isinstance(self._http, HttpApi):
            await self._http.close()
        if self.ledger is not None:
            await self.ledger.close()
        await self.engine.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "websocket":
            ids = logs.bound(
                request_id=logs.request_id(header(scope, b"x-request-id")),
                connection_id=logs.new_id("conn"),
            )
            with ids:
                await self._websocket(scope, receive, send)
        elif kind == "http":
            with logs.bound(request_id=logs.request_id(header(scope, b"x-request-id"))):
                await self._serve_http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _serve_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._http is None:
            await _reply_error(
                with_request_id(send, logs.bound_request_id()),
                404,
                "not_found",
                "This App serves WebSocket mode only (built without HTTP routes): "
                "App.from_config(config) builds the whole server.",
            )
            return
        try:
            credential = self.keys.authenticate(header(scope, b"authorization"))
        except AuthError:
            credential = None  # the routes that need a key answer 401 themselves
        owner = None if credential is None else credential.id
        if self._over_key_cap(owner):
            cap = self.config.max_connections_per_key
            await _reply_error(
                with_request_id(send, logs.bound_request_id()),
                429,
                "too_many_connections",
                f"This API key already has {cap} open connections (WebSockets and HTTP "
                "requests in progress); close one or retry later.",
                RETRY_AFTER_SECONDS,
            )
            return
        with self._held(owner):
            await self._http(scope, receive, send)

    def _over_key_cap(self, owner: str | None) -> bool:
        """The key already holds `--max-connections-per-key` connections (counted)."""
        cap = self.config.max_connections_per_key
        if owner is None or not cap or self._connections_of.get(owner, 0) < cap:
            return False
        if self.ledger is not None:
            self.ledger.metrics.refusals.labels("too_many_connections").inc()
        return True

    @contextmanager
    def _held(self, owner: str | None) -> Iterator[None]:
        """One of the key's places, for as long as the block runs."""
        self._connections_of[owner] = self._connections_of.get(owner, 0) + 1
        try:
            yield
        finally:
            self._connections_of[owner] -= 1
            if not self._connections_of[owner]:
                del self._connections_of[owner]

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except (StoreError, EngineError) as e:
                    # A damaged or unusable store, a model the engine cannot load: the
                    # message names it and what to do; a traceback would only bury it.
                    log.error("cannot start: %s", e.message)
                    await send({"type": "lifespan.startup.failed", "message": e.message})
                    return
                except Exception as e:
                    log.exception("engine failed to start")
                    await send({"type": "lifespan.startup.failed", "message": repr(e)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _deny(
        self,
        scope: Scope,
        send: Send,
        status: int,
        code: str,
        message: str,
        retry_after: int | None = None,
    ) -> None:
        await deny(scope, send, status, code, message, retry_after, self._denial_headers)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        await receive()  # websocket.connect
        # The upgrade's own id, on its acceptance or refusal (not a wrapper around `send`:
        # that would cost every streamed frame); each response on the socket then gets
        # one of its own (`Connection`).
        upgrade = with_request_id(send, logs.bound_request_id())
        config = self.config
        if route_path(scope) not in RESPONSES_PATHS:
            await self._deny(
                scope,
                upgrade,
                404,
                "not_found",
                "WebSocket mode is served on /v1/responses.",
            )
            return
        if not config.websocket:
            await self._deny(
                scope,
                upgrade,
                426,
                "websocket_disabled",
                "WebSocket mode is off: use HTTP.",
            )
            return
        try:
            credential = self.keys.authenticate(header(scope, b"authorization"))
        except AuthError as e:
            await self._deny(scope, upgrade, 401, e.code, e.message)
            return
        key, owner = (None, None) if credential is None else credential[:2]
        if self._over_key_cap(owner):
            cap = config.max_connections_per_key
            await self._deny(
                scope,
                upgrade,
                429,
                "too_many_connections",
                f"This API key already has {cap} open WebSocket connections; close one "
                "or retry later.",
                RETRY_AFTER_SECONDS,
            )
            return
        await upgrade({"type": "websocket.accept"})
        cache = ConnectionCache(config.max_cached_bytes, self.budget, owner)
        observer = self._observer
        books = None
        warm = None
        history = None
        if self.ledger is not None:
            books = self.ledger.observer(key)
            observer = books
            warm = _warming(self.ledger, cache, books.owner)
            # The key's content-addressed states outlive the socket: a client that
            # resends its whole history on another one (Codex after a failure) finds them.
            history = self.ledger.history_cache(books.owner)
        connection = Connection(
            chat_format=self.engine.chat_format,
            context_window=self.engine.context_window,
            model=config.default_model or self.model,
            model_required=config.default_model is None,
            cache=cache,
            limits=self._limits,
            policy=self._policy,
            observer=observer,
            principal=key,
            session_key=session_key(scope),
            queue_memory=self.queue_memory,
            durable=self.ledger is not None and self.ledger.durable,
            storage_refusal=None if self.ledger is None else self.ledger.storage_refusal,
            compactor=self.compactor.bound(owner),
            sampling_defaults=self.engine.sampling_defaults,
            inject=config.inject or multi_agent(scope),
            inject_idle_timeout=config.inject_idle_timeout,
            history=history,
        )
        frames = scope.get("extensions", {}).get(SEND_FRAMES)
        socket = Socket(
            connection,
            self.engine.session(self.keys.cache_salt(key)),
            send,
            high_water=config.send_buffer_bytes,
            lifetime=config.connection_lifetime,
            send_frames=frames is not None,
            write_frames=None if frames is None else frames.get(WRITE_FRAMES),
            stream_cpu=None if self.ledger is None else self.ledger.metrics.stream_cpu,
            phases=None if self.ledger is None else self.ledger.metrics.turn_phases,
            commit=None if self.ledger is None else self.ledger.persist,
            warm=warm,
            coalesce=config.stream_coalesce_ms / 1000,
            mcp=self.mcp,
        )
        scope[CONNECTION_DRAIN] = socket.drain
        scope[RECEIVE_UTF8] = True
        self.connections += 1
        if self.ledger is not None:
            self.ledger.metrics.connections_total.inc()
            self.ledger.metrics.connections.inc()
        try:
            with self._held(owner):
                await socket.run(receive)
        finally:
            self.connections -= 1
            if self.ledger is not None:
                self.ledger.metrics.connections.dec()


def compactor_for(config: ServerConfig) -> Compactor:
    """The key that seals compaction items: the operator's secret, else the one kept in
    the data directory (so restarts and workers agree), else this process's own."""
    tokens = config.compaction_summary_tokens
    if config.compaction_key:
        return Compactor.from_secret(config.compaction_key, tokens)
    if config.data_dir:
        return Compactor.in_directory(config.data_dir, tokens)
    return Compactor.ephemeral(tokens)


def multi_agent(scope: Scope) -> bool:
    """The upgrade asked for the long-running response (`OpenAI-Beta` lists
    `responses_multi_agent=v1` among its comma-separated values)."""
    beta = header(scope, b"openai-beta") or b""
    return MULTI_AGENT_BETA in (value.strip() for value in beta.split(b","))


def _warming(
    ledger: Ledger, cache: ConnectionCache, owner: str | None
) -> Callable[[Parsed], Awaitable[None]]:
    """Rebuilds a request's `previous_response_id` (the top-level field, as the core
    parsed it) from the store when the connection cache misses it (`Ledger.warm`, as
    HTTP does before its request), or its `conversation`'s state
    (`Ledger.warm_conversation`): the read is awaited in the store's thread instead
    of blocking the event loop, before the `Connection` sees the request."""

    async def warm(parsed: Parsed) -> None:
        await ledger.warm(cache, parsed.previous_response_id, owner)
        if isinstance(parsed.event, CreateRequest):
            await ledger.warm_conversation(cache, parsed.event, owner)

    return warm


async def _reply_error(
    send: Send, status: int, code: str, message: str, retry_after: int | None = None
) -> None:
    body = error_body(code, message, None, status, retry_after)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
