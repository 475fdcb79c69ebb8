"""In-test inference servers that speak vLLM's, SGLang's and llama.cpp server's
documented streaming shapes.

Each is a plain ASGI app served by uvicorn on a loopback socket bound before the server
starts (so clients can connect at once, no readiness wait). The "model" answers every
prompt with the same scripted ids; the apps record the requests they got, and can be
told to fail, stall, or drop the stream after some tokens. Their prefix cache is
scripted (`Script.cached_tokens`), or kept as the servers keep theirs
(`Script.prefix_cache`): partitioned by the request's salt where the server takes one.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn
from hotloop.lab.replica import request_body

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class Script:
    reply: list[int] = field(default_factory=lambda: [101, 102, 103, 104, 105, 7])
    status: int = 200
    """Answer every request with this HTTP status (an error body) when not 200."""
    drop_after: int | None = None
    """End the stream after this many ids, without a finish event."""
    hold_after: int | None = None
    """Send this many ids, then nothing more until the client goes away (or `endless`)."""
    endless: bytes | None = None
    """After `hold_after` ids, these bytes again and again (`endless_every` seconds
    apart) until the client goes away or `endless_limit` bytes went, after
    `endless_start` once: an endless line, keep-alive comments, ids past max_tokens."""
    endless_start: bytes = b""
    endless_every: float = 0.0
    endless_limit: int = 1 << 40
    incremental: bool = False
    """SGLang's --incremental-streaming-output (deltas instead of cumulative ids)."""
    cached_tokens: int | None = None
    """vLLM: the prompt ids its usage chunk (sent when the request asks for usage) says
    were cached; None: a usage chunk without details, as vLLM started without
    `--enable-prompt-tokens-details` sends."""
    prefix_cache: bool = False
    """Report the prompt ids the server's own prefix cache would hold instead of
    `cached_tokens` (`FakeUpstream.cached`)."""


SALT_FIELDS = {"vllm": "cache_salt", "sglang": "extra_key"}
"""The request field each server partitions its prefix cache by (llama.cpp has none)."""
BLOCKS = {"vllm": 32, "sglang": 1, "llamacpp": 1}
"""The ids a cache hit is counted in: vLLM reuses full KV blocks only (32 ids, as
`hotloop.lab.vllm_server` runs it), SGLang's radix tree and a llama.cpp slot any
prefix."""


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _salt_refusal(salt: object) -> str | None:
    """vLLM's check of `cache_salt` (`validate_cache_salt`): why it refuses it, if so."""
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        return "Parameter 'cache_salt' must be a non-empty string if provided."
    if len(salt) > 128 or any(char in "@/\\\0" for char in salt):
        return "Parameter 'cache_salt' is too long or holds a forbidden character."
    return None


@dataclass
class FakeUpstream:
    kind: str  # "vllm" | "sglang" | "llamacpp"
    script: Script = field(default_factory=Script)
    requests: list[dict[str, Any]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    """The bytes of each request in `requests`, as sent."""
    session_ids: list[str | None] = field(default_factory=list)
    """The `x-session-id` header of each request in `requests`."""
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    model_lookups: int = 0
    endless_sent: int = 0
    """The bytes of `Script.endless` sent so far."""
    url: str = ""
    held: dict[Any, list[list[int]]] = field(default_factory=dict)
    """`Script.prefix_cache`: every prompt (and its reply but the last id, never fed
    back) served, by the salt it came with."""

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["path"] == "/health":
            await _respond(send, 200, b"{}")
            return
        if scope["path"] == "/v1/models" and self.kind == "vllm":
            self.model_lookups += 1
            models = {"object": "list", "data": [{"id": "served-by-fake", "object": "model"}]}
            await _respond(send, 200, orjson.dumps(models))
            return
        expected = PATHS[self.kind]
        if scope["method"] != "POST" or scope["path"] != expected:
            await _respond(send, 404, b'{"detail":"Not Found"}')
            return
        body = await request_body(receive)
        request = orjson.loads(body)
        self.requests.append(request)
        self.bodies.append(body)
        session = dict(scope["headers"]).get(b"x-session-id")
        self.session_ids.append(None if session is None else session.decode())
        refusal = _salt_refusal(request.get("cache_salt")) if self.kind == "vllm" else None
        if refusal is not None:
            error = {"error": {"message": refusal, "type": "BadRequestError", "code": 400}}
            await _respond(send, 400, orjson.dumps(error))
            return
        if self.script.status != 200:
            # vLLM's ErrorResponse shape; SGLang answers errors the same way.
            error = {
                "error": {
                    "message": "scripted failure",
                    "type": "BadRequestError",
                    "code": self.script.status,
                }
            }
            await _respond(send, self.script.status, orjson.dumps(error))
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        chunks = STREAMS[self.kind](self, request)
        for i, chunk in enumerate(chunks):
            if i == self.script.hold_after:
                if self.script.endless is not None:
                    await self._endless(send, receive)
                await self._until_disconnect(receive)
                return
            if i == self.script.drop_after:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            event = b"data: " + orjson.dumps(chunk) + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    async def _endless(self, send: Send, receive: Receive) -> None:
        script = self.script
        assert script.endless is not None
        gone = asyncio.ensure_future(self._until_disconnect(receive))
        await send({"type": "http.response.body", "body": script.endless_start, "more_body": True})
        while not gone.done() and self.endless_sent < script.endless_limit:
            await send({"type": "http.response.body", "body": script.endless, "more_body": True})
            self.endless_sent += len(script.endless)
            # The replica's own pace (a keep-alive comment every so often), or a yield.
            await asyncio.sleep(script.endless_every)
        await gone

    async def _until_disconnect(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.disconnected.set()

    def _ids(self, request_max: int) -> tuple[list[int], str]:
        reply = self.script.reply[:request_max]
        finish = "stop" if len(reply) == len(self.script.reply) else "length"
        return reply, finish

    def cached(self, request: dict[str, Any], prompt: list[int], reply: list[int]) -> int | None:
        """The prompt ids the usage says were cached: scripted, or (`prefix_cache`) the
        full blocks of the longest prefix the prompt shares with what an earlier
        request of the same salt left, short of its last id (which every server
        computes again); the request's prompt and reply are then held."""
        if not self.script.prefix_cache:
            return self.script.cached_tokens
        salt = SALT_FIELDS.get(self.kind)
        held = self.held.setdefault(request.get(salt) if salt else None, [])
        common = max((_common_prefix(seq, prompt) for seq in held), default=0)
        held.append(prompt + reply[:-1])
        block = BLOCKS[self.kind]
        return min(common, len(prompt) - 1) // block * block

    def _vllm(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        reply, finish = self._ids(request["max_tokens"])
        chunks: list[dict[str, Any]] = []
        for i, token in enumerate(reply):
            last = i == len(reply) - 1
            choice = {
                "index": 0,
                "text": f"<{token}>",
                "logprobs": None,
                "finish_reason": finish if last else None,
                "stop_reason": token if last and finish == "stop" else None,
                "token_ids": [token],
            }
            if i == 0:
                choice["prompt_token_ids"] = request["prompt"]
            chunk = {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 0,
                "model": request["model"],
                "choices": [choice],
            }
            chunks.append(chunk)
        if (request.get("stream_options") or {}).get("include_usage"):
            details = None
            cached = self.cached(request, request["prompt"], reply)
            if cached is not None:
                details = {"cached_tokens": cached}
            usage = {
                "prompt_tokens": len(request["prompt"]),
                "completion_tokens": len(reply),
                "total_tokens": len(request["prompt"]) + len(reply),
                "prompt_tokens_details": details,
            }
            chunks.append(
                {"id": "cmpl-1", "object": "text_completion", "choices": [], "usage": usage}
            )
        return chunks

    def _sglang(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        reply, finish = self._ids(request["sampling_params"]["max_new_tokens"])
        cached = self.cached(request, request["input_ids"], reply) or 0
        chunks: list[dict[str, Any]] = []
        for i, token in enumerate(reply):
            last = i == len(reply) - 1
            reason: dict[str, Any] | None = None
            if last:
                reason = (
                    {"type": "stop", "matched": token}
                    if finish == "stop"
                    else {"type": "length", "length": len(reply)}
                )
            ids = [token] if self.script.incremental else reply[: i + 1]
            chunk = {
                "text": "".join(f"<{t}>" for t in ids),
                "output_ids": ids,
                "meta_info": {
                    "id": "r1",
                    "finish_reason": reason,
                    "prompt_tokens": len(request["input_ids"]),
                    "completion_tokens": i + 1,
                    "cached_tokens": cached,
                },
            }
            chunks.append(chunk)
        if not reply:
            # `max_new_tokens` 0 (a prefill): one finishing event without ids.
            chunks.append(
                {
                    "text": "",
                    "output_ids": [],
                    "meta_info": {
                        "id": "r1",
                        "finish_reason": {"type": "length", "length": 0},
                        "prompt_tokens": len(request["input_ids"]),
                        "completion_tokens": 0,
                        "cached_tokens": cached,
                    },
                }
            )
        return chunks

    def _llamacpp(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        reply, finish = self._ids(request["n_predict"])
        chunks: list[dict[str, Any]] = [
            {"content": f"<{token}>", "tokens": [token], "stop": False} for token in reply
        ]
        timings = {"prompt_n": len(request["prompt"]), "predicted_n": len(reply)}
        cached = self.cached(request, request["prompt"], reply)
        if cached is not None:
            timings["cache_n"] = cached
        stop_type = "eos" if finish == "stop" else "limit"
        last = {"content": "", "tokens": [], "stop": True, "stop_type": stop_type}
        return [*chunks, {**last, "timings": timings}]


PATHS = {"vllm": "/v1/completions", "sglang": "/generate", "llamacpp": "/completion"}
STREAMS = {
    "vllm": FakeUpstream._vllm,
    "sglang": FakeUpstream._sglang,
    "llamacpp": FakeUpstream._llamacpp,
}


async def _respond(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def serving(*apps: FakeUpstream) -> AsyncIterator[list[FakeUpstream]]:
    servers: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []
    for app in apps:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        app.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        servers.append((server, asyncio.create_task(server.serve(sockets=[sock]))))
    try:
        yield list(apps)
    finally:
        for server, task in servers:
            server.should_exit = True
            await task


def closed_port_url() -> str:
    """A loopback URL nothing listens on: connections are refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
