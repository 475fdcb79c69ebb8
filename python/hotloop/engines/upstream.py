"""The upstream engine: a remote inference server that takes token ids.

Owns the wire dialects (vLLM `POST /v1/completions`, SGLang `POST /generate`, llama.cpp
server `POST /completion`), replica choice and health, and the mapping of upstream
failures to `EngineError` codes; the keep-alive HTTP/1.1 client and the decoding of the
streams are `hotloop.engines.http1` and `hotloop._core.ResponseReader`. It must not see
text or items: prompts go out as the exact ids of the rendered-token cache, sampled ids
come back.

Routing (`UpstreamConfig.routing`), so that every turn of a conversation lands on the
replica whose prefix cache holds its history:
- `rendezvous` (the default): highest-random-weight hashing of the conversation's key
  (the client's session header, or the root response id of its chain; see
  `hotloop.protocol.Generate.route_key`) over the healthy replicas. Every hotloop node
  configured with the same replica URLs sends a conversation to the same replica, with
  no state shared between nodes; when a replica leaves, only its own conversations move
  (to their second choice), and they come back when it recovers.
- `pinned`: each session (one client connection, one HTTP request) is pinned when it
  first generates to the healthy replica with the fewest pinned sessions. Balanced for
  one node; a conversation that continues on another node (or over HTTP) lands anywhere.
- `router` (`UpstreamConfig.router`): every request goes to one cluster router (llm-d,
  vLLM's router, SGLang's router), which picks the replica itself by scoring
  prefix-cache hits on the token ids; the conversation key rides along in `x-session-id`.
A generation without a key (an engine driven directly) routes as `pinned`. The key is
sent as `x-session-id` in every mode. A replica that fails (connection refused,
timeout, 5xx) is marked unhealthy for `cooldown` seconds and skipped; a request that
fails before its first token is retried on the next replica in the same order on every
node; after the first token a failure ends the response, since the client has already
seen output.

Tenants (`EngineSession` cache salts): a salted session's requests carry its salt in the
field the dialect's server partitions its prefix cache by (`Dialect.salt_field`: vLLM's
`cache_salt`, SGLang's `extra_key`), so a prompt hits only what its own tenant sent.
llama.cpp server has no such field: its prefix cache stays shared, and a salted
session reports no engine cache hit (the figure could be another tenant's).

Error codes (stable): `upstream_unavailable` (no replica answered),
`upstream_timeout` (no data within the read timeout), `upstream_rejected` (4xx: the
request itself is wrong, not retried), `upstream_error` (5xx or an error event in the
stream), `upstream_protocol` (a response we cannot parse).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from hotloop._core import RequestBodies
from hotloop.chat_template import TemplateChoice, load_tokenizer
from hotloop.engines.base import (
    API_SAMPLING,
    ENGINE_CACHED,
    PACED,
    TEXT_ONLY,
    EngineError,
    Sampling,
)
from hotloop.engines.http1 import Client, HeaderError, Link, LinkError, Origin
from hotloop.turnclock import TURN_CLOCK

if TYPE_CHECKING:
    from hotloop._core import ChatFormat, Prompt, ResponseReader


class Dialect(Protocol):
    """How one inference server spells a token-id completion request and its stream."""

    name: str
    path: str
    models_path: str | None
    """Where the server lists the model names it accepts, if requests must name one."""
    prompt_field: str
    """The body's field holding the prompt's ids (written by the core, `request_body`)."""
    salt_field: str | None
    """The body's field that partitions the server's prefix cache (a session's cache
    salt goes there); None: the server has none, its cache is shared by all."""

    def body(self, model: str, sampling: Sampling) -> dict[str, Any]:
        """The request's other fields."""
        ...


def request_body(
    dialect: Dialect, bodies: RequestBodies, prompt: Prompt, rest: bytes
) -> memoryview:
    """The JSON body: the prompt's ids under the dialect's field, written whole by the
    core from the ids it holds, then the other fields (`rest`: a JSON object's bytes,
    never empty: every dialect streams). No conversation keeps its body between turns:
    a body takes about 7 bytes per id, more than the ids the cache holds
    (`rust/src/upstream/body.rs`). A view of the process's one body buffer, which the
    next request rewrites unless this view is still held: let go of it once sent."""
    head = b'{"' + dialect.prompt_field.encode() + b'":'
    return bodies.write(prompt, head, b"," + rest[1:])


def _set_sampling(sampling: Sampling) -> dict[str, float]:
    """The sampling settings the request set, under the names vLLM, SGLang and llama.cpp
    all read; an unset one is left out, so the server's default applies."""
    fields = {"temperature": sampling.temperature, "top_p": sampling.top_p}
    return {name: value for name, value in fields.items() if value is not None}


class VllmDialect:
    """vLLM's OpenAI-compatible completions with a token-id prompt.

    `return_token_ids` makes each streamed choice carry `token_ids` (the delta since the
    previous chunk); `skip_special_tokens: false` keeps special ids in the output, since
    our parser needs them; `include_usage` asks for the usage chunk after the finishing
    one, which carries the prompt ids vLLM served from its prefix cache when it runs
    with `--enable-prompt-tokens-details`.
    """

    name = "vllm"
    path = "/v1/completions"
    models_path: str | None = "/v1/models"
    prompt_field = "prompt"
    # Hashed into the first block's key (so into every block's): a prompt hits only
    # blocks computed under the same salt (vLLM 0.32 `v1/core/kv_cache_utils.py`).
    salt_field: str | None = "cache_salt"

    def body(self, model: str, sampling: Sampling) -> dict[str, Any]:
        return {
            "model": model,
            # vLLM refuses `max_tokens` 0: a prewarm asks for one id, which
            # `UpstreamSession.generate` discards.
            "max_tokens": max(1, sampling.max_output_tokens),
            "stream": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": list(sampling.stop_tokens),
            "stream_options": {"include_usage": True},
            **_set_sampling(sampling),
        }


class SglangDialect:
    """SGLang's native `/generate` with `input_ids`.

    SGLang streams `output_ids` cumulatively by default and as deltas with
    `--incremental-streaming-output`; `meta_info.completion_tokens` (always cumulative)
    tells the two apart, so either server setting works.
    """

    name = "sglang"
    path = "/generate"
    models_path: str | None = None
    prompt_field = "input_ids"
    # Its radix cache keys every node by it (from SGLang 0.5.3; 0.5.23 also takes
    # `cache_salt`, to the same effect); earlier versions ignore the field.
    salt_field: str | None = "extra_key"

    def body(self, model: str, sampling: Sampling) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_new_tokens": sampling.max_output_tokens,
            "stop_token_ids": list(sampling.stop_tokens),
            "skip_special_tokens": False,
            **_set_sampling(sampling),
        }
        return {"sampling_params": params, "stream": True}


class LlamaCppDialect:
    """llama.cpp server's native `/completion` with a token-array prompt.

    `cache_prompt` keeps the slot's KV for the next turn (the server's own prefix
    reuse); each streamed event carries the sampled id in `tokens`, the last one has
    `stop: true` and the server's `timings`.
    """

    name = "llamacpp"
    path = "/completion"
    models_path: str | None = None
    prompt_field = "prompt"
    # A slot reuses whatever prompt it holds, and `--cache-ram` restores any request's.
    salt_field: str | None = None

    def body(self, model: str, sampling: Sampling) -> dict[str, Any]:
        return {
            "n_predict": sampling.max_output_tokens,
            "stream": True,
            "return_tokens": True,
            "cache_prompt": True,
            **_set_sampling(sampling),
        }


DIALECTS: dict[str, Dialect] = {
    d.name: d for d in (VllmDialect(), SglangDialect(), LlamaCppDialect())
}


SESSION_HEADER = "x-session-id"
"""The conversation key on requests to the upstream, for routers that keep a
conversation on the replica holding its prefix."""

ROUTINGS = ("rendezvous", "pinned")


@dataclass
class Replica:
    url: str
    sessions: int = 0
    served_model: str | None = None
    """The model name the replica reported (vLLM), resolved at its first session."""
    unhealthy_until: float = 0.0
    failures: int = 0
    origin: Origin = field(init=False, repr=False, compare=False)
    _seed: hashlib.blake2b = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.origin = Origin.from_url(self.url)
        # Hashing the key after the URL: a copy of this state skips rehashing the URL.
        self._seed = hashlib.blake2b(self.url.encode() + b"\0", digest_size=8)

    def healthy(self, now: float) -> bool:
        return now >= self.unhealthy_until

    def weight(self, key: bytes) -> int:
        """This replica's rendezvous weight for a conversation key: a hash of URL and
        key, the same in every process (unlike Python's salted `hash`)."""
        h = self._seed.copy()
        h.update(key)
        return int.from_bytes(h.digest(), "big")


def rendezvous(key: str, replicas: Sequence[Replica]) -> Replica:
    """The replica with the highest weight for `key` (the first when weights tie)."""
    data = key.encode()
    return max(replicas, key=lambda r: r.weight(data))


@dataclass(frozen=True)
class UpstreamConfig:
    """`replicas` are base URLs (`http://10.0.0.5:8000`); `served_model` is the name the
    upstream knows the model by (vLLM checks it; None: ask the replica's `/v1/models`),
    `model` the name our clients use."""

    dialect: str
    replicas: tuple[str, ...]
    model: str
    context_window: int
    chat_format: str = "harmony"
    """`harmony` (gpt-oss, o200k_harmony) or `chatml` (Qwen, SmolLM: needs `tokenizer`)."""
    tokenizer: str | None = None
    """For `chatml`: a `.gguf` or `tokenizer.json` path, or an OpenAI encoding name."""
    default_system: str | None = None
    template: TemplateChoice | None = None
    """The model's own chat template over `tokenizer` (instead of `chat_format`)."""
    served_model: str | None = None
    api_key: str | None = None
    connect_timeout: float = 5.0
    read_timeout: float = 120.0
    response_timeout: float = 1800.0
    """The longest one response may take, whatever the replica sends meanwhile (0: none)."""
    max_line_bytes: int = 16 * 1024 * 1024
    """The longest server-sent event line; a longer one fails the response."""
    cooldown: float = 10.0
    max_connections: int = 256
    headers: dict[str, str] = field(default_factory=dict)
    routing: str = "rendezvous"
    """`rendezvous` or `pinned` (see the module docstring)."""
    router: str | None = None
    """A cluster router's base URL: every request goes there (`replicas` unused)."""


class UpstreamEngine:
    """A model served by remote replicas speaking one dialect."""

    def __init__(self, config: UpstreamConfig, chat_format: ChatFormat | None = None) -> None:
        if config.dialect not in DIALECTS:
            known = ", ".join(sorted(DIALECTS))
            raise ValueError(f"unknown upstream dialect {config.dialect!r} (known: {known})")
        if config.routing not in ROUTINGS:
            known = ", ".join(ROUTINGS)
            raise ValueError(f"unknown upstream routing {config.routing!r} (known: {known})")
        urls = (config.router,) if config.router else config.replicas
        if not urls:
            raise ValueError("an upstream engine needs at least one replica URL or a router")
        self.config = config
        self.dialect = DIALECTS[config.dialect]
        self.replicas = [Replica(url.rstrip("/")) for url in urls]
        self._chat_format = chat_format
        self._client: Client | None = None
        self.request_bodies = RequestBodies()

    @property
    def model(self) -> str:
        return self.config.model

    @property
    def chat_format(self) -> ChatFormat:
        if self._chat_format is None:
            self._chat_format = chat_format_from(self.config)
        return self._chat_format

    @property
    def context_window(self) -> int:
        return self.config.context_window

    @property
    def modalities(self) -> tuple[str, ...]:
        # Replicas are fed token ids: there is no channel for pixels.
        return TEXT_ONLY

    @property
    def sampling_defaults(self) -> tuple[float, float]:
        # Unset settings are left to the replica, whose defaults are not known here.
        return API_SAMPLING

    async def start(self) -> None:
        # At server start, off the event loop, not in the first connection: building the
        # harmony vocabulary or a chatml tokenizer would stall that connection's first turn.
        await asyncio.to_thread(lambda: self.chat_format)
        headers = dict(self.config.headers)
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        self._client = Client(
            headers=headers,
            connect_timeout=self.config.connect_timeout,
            read_timeout=self.config.read_timeout,
            max_connections=self.config.max_connections,
            response_timeout=self.config.response_timeout,
            max_line=self.config.max_line_bytes,
        )

    def session(self, cache_salt: str | None = None) -> UpstreamSession:
        return UpstreamSession(self, cache_salt)

    async def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def client(self) -> Client:
        if self._client is None:
            raise EngineError("upstream_unavailable", "the upstream engine is not started")
        return self._client

    def _pool(self, exclude: Sequence[Replica]) -> list[Replica]:
        """The replicas a request may go to: the healthy ones not excluded; empty if
        all are excluded."""
        now = time.monotonic()
        candidates = [r for r in self.replicas if r not in exclude]
        healthy = [r for r in candidates if r.healthy(now)]
        # With every candidate in cooldown, try the one that failed longest ago rather
        # than refusing: an outage shorter than the cooldown should not fail requests.
        return healthy or sorted(candidates, key=lambda r: r.unhealthy_until)[:1]

    def pin(self, exclude: Sequence[Replica] = ()) -> Replica | None:
        """The replica for a new session: healthy, fewest sessions; None if all excluded."""
        pool = self._pool(exclude)
        if not pool:
            return None
        replica = min(pool, key=lambda r: r.sessions)
        replica.sessions += 1
        return replica

    def route(self, key: str, exclude: Sequence[Replica] = ()) -> Replica | None:
        """The replica for conversation `key`: the rendezvous choice among the healthy
        ones, the same on every node; None if all are excluded."""
        pool = self._pool(exclude)
        return rendezvous(key, pool) if pool else None

    def unpin(self, replica: Replica) -> None:
        replica.sessions -= 1

    def mark_failed(self, replica: Replica) -> None:
        replica.failures += 1
        replica.unhealthy_until = time.monotonic() + self.config.cooldown

    def mark_ok(self, replica: Replica) -> None:
        replica.unhealthy_until = 0.0


def chat_format_from(config: UpstreamConfig) -> ChatFormat:
    """The chat format the upstream's model was trained on, from the configuration."""
    from hotloop._core import ChatFormat

    if config.template is not None:
        if config.tokenizer is None:
            raise ValueError("a chat template needs the model's vocabulary (--upstream-tokenizer)")
        return config.template.format(config.tokenizer)
    if config.chat_format == "harmony":
        return ChatFormat.harmony()
    if config.chat_format != "chatml":
        raise ValueError(f"unknown chat format {config.chat_format!r} (harmony or chatml)")
    if config.tokenizer is None:
        raise ValueError("the chatml format needs a tokenizer (.gguf, tokenizer.json or name)")
    return ChatFormat.chatml(load_tokenizer(config.tokenizer), default_system=config.default_system)


class _RetryElsewhere(Exception):
    """A failure before the first token that another replica may not have. `stale`: the
    replica closed a pooled keep-alive connection as we reused it, before answering; the
    replica is fine and the request is worth one more try there."""

    def __init__(self, error: EngineError, *, stale: bool = False) -> None:
        super().__init__(error.message)
        self.error = error
        self.stale = stale


class UpstreamSession:
    """One connection's view of the replicas: its pin (`pinned` routing, or a
    generation without a conversation key), and its tenant's cache salt."""

    def __init__(self, engine: UpstreamEngine, cache_salt: str | None = None) -> None:
        self.engine = engine
        self.cache_salt = cache_salt
        self.replica: Replica | None = None
        self.last_timings: dict[str, Any] | None = None
        """The upstream's own timings of the last turn (llama.cpp server only)."""

    async def generate(
        self, prompt: Prompt, sampling: Sampling, route_key: str | None = None
    ) -> AsyncIterator[list[int]]:
        ENGINE_CACHED.set(None)
        replica, link, first = await self._open(prompt, sampling, route_key)
        if PACED.get():
            link.hold_reads()
        client = self.engine.client
        reader = link.reader
        assert reader is not None
        budget = sampling.max_output_tokens
        # A prewarm (budget 0) reads the stream to its end, so the prompt stays in the
        # upstream's cache and its figures arrive, and hands over no id.
        prefill = budget == 0
        try:
            if first is not None:
                # Every batch after the first: `next` hands over the ids of every read
                # since the last call, decoded in Rust as they arrived (one call per
                # socket read), with no per-line or per-event Python. Reading on after
                # the finishing event, to the end of the body, lets the keep-alive
                # connection go back to the pool instead of closing.
                batch: list[int] | None = first
                while True:
                    if batch is not None:
                        last = reader.done
                        if last:
                            await self._read_trailer(replica, link, reader)
                        if prefill:
                            batch = []
                        if len(batch) > budget:
                            # A replica that ignores `max_tokens`: the response ends at
                            # the budget (incomplete, max_output_tokens), and leaving the
                            # body unread closes the connection, which cancels the
                            # request there.
                            if budget:
                                yield batch[:budget]
                            return
                        budget -= len(batch)
                        if not prefill:
                            yield batch
                        if last:
                            break
                    elif self._over(replica, reader, started=True):
                        break
                    batch = await link.next()
            if not reader.done:
                raise EngineError(
                    "upstream_error",
                    f"the engine went away mid-response ({replica.url} closed the stream "
                    "before finishing)",
                    before_first_token=first is None,
                )
            self.engine.mark_ok(replica)
            # A stream whose finishing event came without ids (llama.cpp server's last
            # event) ends here, not through `_read_trailer`.
            ENGINE_CACHED.set(self._cached(reader))
            if reader.timings is not None:
                self.last_timings = orjson.loads(reader.timings)
        except LinkError as e:
            raise self._link_failure(replica, e, started=True) from e
        finally:
            # Abandoned mid-body (cancelled, closed by the consumer, failed), the
            # connection is closed: that is how the upstream learns to stop generating.
            client.done(replica.origin, link)

    async def _read_trailer(self, replica: Replica, link: Link, reader: ResponseReader) -> None:
        """After the finishing event, before its ids go out: the events that follow it
        (vLLM's usage chunk, `[DONE]`), read to the body's end, so the engine's figures
        are known when the consumer ends the response on those ids. The server sends
        them at once; a connection lost now loses only the figures, not the response."""
        try:
            while not self._over(replica, reader, started=True):
                await link.next()
        except LinkError:
            return
        ENGINE_CACHED.set(self._cached(reader))

    def _cached(self, reader: ResponseReader) -> int | None:
        """The prompt ids the replica said it served from its cache, if they can only
        be this tenant's: a salted session on a server without salts (llama.cpp) is
        told nothing, the hit may be another tenant's prompt."""
        if self.cache_salt is not None and self.engine.dialect.salt_field is None:
            return None
        return reader.cached_tokens

    async def _open(
        self, prompt: Prompt, sampling: Sampling, route_key: str | None
    ) -> tuple[Replica, Link, list[int] | None]:
        """Send the request and wait for the first ids, retrying on other replicas
        (see the module docstring) while no token has been seen. Returns the replica,
        the connection reading the rest, and the first batch (None: the response ended
        without one)."""
        tried: list[Replica] = []
        stale_retried = False
        last_error = EngineError("upstream_unavailable", "no upstream replica is configured")
        # Identity: the stream is decoded from the raw bytes of each read, never inflated.
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if route_key is not None:
            headers[SESSION_HEADER] = route_key
        rendezvous = self.engine.config.routing == "rendezvous"
        while True:
            if route_key is not None and rendezvous:
                replica = self.engine.route(route_key, tried)
            else:
                if self.replica is None or self.replica in tried:
                    self._repin(tried)
                replica = self.replica
            if replica is None:
                raise last_error
            try:
                link, first = await self._first(replica, prompt, sampling, headers)
                return replica, link, first
            except _RetryElsewhere as retry:
                last_error = retry.error
                if retry.stale and not stale_retried:
                    stale_retried = True  # the same replica again, on a new connection
                    continue
                tried.append(replica)
                self.engine.mark_failed(replica)

    def _repin(self, exclude: Sequence[Replica]) -> None:
        if self.replica is not None:
            self.engine.unpin(self.replica)
        self.replica = self.engine.pin(exclude)

    async def _first(
        self, replica: Replica, prompt: Prompt, sampling: Sampling, headers: dict[str, str]
    ) -> tuple[Link, list[int] | None]:
        """One attempt on one replica, up to its first ids; a failure that another
        replica may not have is `_RetryElsewhere`."""
        engine = self.engine
        dialect = engine.dialect
        client = engine.client
        link: Link | None = None
        try:
            model = await self._served_model(replica)
            fields = dialect.body(model, sampling)
            if self.cache_salt is not None and dialect.salt_field is not None:
                fields[dialect.salt_field] = self.cache_salt
            rest = orjson.dumps(fields)
            body = request_body(dialect, engine.request_bodies, prompt, rest)
            link = await client.send(
                replica.origin, "POST", dialect.path, headers, body, stream=dialect.name
            )
            del body  # sent: the next request may reuse the buffer
            clock = TURN_CLOCK.get()
            if clock is not None:
                clock.written()
                link.clock = clock
            reader = link.reader
            assert reader is not None
            while True:
                batch = await link.next()
                if batch is not None or self._over(replica, reader, started=False):
                    return link, batch
        except LinkError as e:
            if link is not None:
                client.done(replica.origin, link)
            raise self._link_failure(replica, e, started=False) from e
        except HeaderError as e:  # the session header: a client's, never a valid one
            raise EngineError("upstream_rejected", str(e)) from e
        except BaseException:
            if link is not None:
                client.done(replica.origin, link)
            raise

    def _over(self, replica: Replica, reader: ResponseReader, *, started: bool) -> bool:
        """What the response's new state means: raises its failure, else tells whether
        the stream is over (the body's end, or `[DONE]`)."""
        failure = reader.failure
        if failure is not None:
            code, message, retryable = failure
            if code == "upstream_protocol":
                # A stream we cannot read (an endless line, a malformed event): the
                # replica is skipped for its cooldown, by every conversation.
                self.engine.mark_failed(replica)
            error = EngineError(code, message, before_first_token=not started)
            if retryable and not started:
                raise _RetryElsewhere(error)
            raise error
        status = reader.status
        if status is not None and status >= 400:
            if reader.complete:
                raise self._status_error(replica, status, reader.body)
            return False
        return reader.complete or reader.ended

    def _link_failure(self, replica: Replica, e: LinkError, *, started: bool) -> Exception:
        code = "upstream_timeout" if e.timeout else "upstream_unavailable"
        message = f"{replica.url}: {e.message}"
        if started and not e.timeout:
            # The client sees this as the response's failure: say what happened to it.
            message = f"the engine went away mid-response ({message})"
        error = EngineError(code, message, before_first_token=not started)
        return error if started else _RetryElsewhere(error, stale=e.stale)

    async def _served_model(self, replica: Replica) -> str:
        """The name to put in requests: configured, or asked of the replica once."""
        config = self.engine.config
        models_path = self.engine.dialect.models_path
        if config.served_model is not None or models_path is None:
            return config.served_model or config.model
        if replica.served_model is None:
            status, content = await self.engine.client.fetch(replica.origin, models_path, {})
            if status >= 400:
                raise self._status_error(replica, status, content)
            try:
                replica.served_model = str(orjson.loads(content)["data"][0]["id"])
            except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as e:
                raise EngineError(
                    "upstream_protocol", f"{replica.url}{models_path} lists no model"
                ) from e
        return replica.served_model

    def _status_error(self, replica: Replica, status: int, content: bytes) -> Exception:
        detail = _error_message(content)
        if status < 500:
            return EngineError(
                "upstream_rejected", f"{replica.url} refused the request ({status}): {detail}"
            )
        return _RetryElsewhere(
            EngineError("upstream_error", f"{replica.url} failed ({status}): {detail}")
        )

    async def close(self) -> None:
        if self.replica is not None:
            self.engine.unpin(self.replica)
            self.replica = None


def _error_message(content: bytes) -> str:
    try:
        payload = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content[:200].decode("utf-8", "replace")
    err = payload.get("error", payload) if isinstance(payload, dict) else payload
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err)
