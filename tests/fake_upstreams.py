"""In-test inference servers that speak vLLM's and SGLang's documented streaming shapes.

Each is a plain ASGI app served by uvicorn on a loopback socket bound before the server
starts (so clients can connect at once, no readiness wait). The "model" answers every
prompt with the same scripted ids; the apps record the requests they got, and can be
told to fail, stall, or drop the stream after some tokens.
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


@dataclass
class FakeUpstream:
    kind: str  # "vllm" | "sglang"
    script: Script = field(default_factory=Script)
    requests: list[dict[str, Any]] = field(default_factory=list)
    session_ids: list[str | None] = field(default_factory=list)
    """The `x-session-id` header of each request in `requests`."""
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    model_lookups: int = 0
    endless_sent: int = 0
    """The bytes of `Script.endless` sent so far."""
    url: str = ""

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["path"] == "/health":
            await _respond(send, 200, b"{}")
            return
        if scope["path"] == "/v1/models" and self.kind == "vllm":
            self.model_lookups += 1
            models = {"object": "list", "data": [{"id": "served-by-fake", "object": "model"}]}
            await _respond(send, 200, orjson.dumps(models))
            return
        expected = "/v1/completions" if self.kind == "vllm" else "/generate"
        if scope["method"] != "POST" or scope["path"] != expected:
            await _respond(send, 404, b'{"detail":"Not Found"}')
            return
        request = orjson.loads(await request_body(receive))
        self.requests.append(request)
        session = dict(scope["headers"]).get(b"x-session-id")
        self.session_ids.append(None if session is None else session.decode())
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
        chunks = self._vllm(request) if self.kind == "vllm" else self._sglang(request)
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
            if self.script.cached_tokens is not None:
                details = {"cached_tokens": self.script.cached_tokens}
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
                    "cached_tokens": 0,
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
                        "cached_tokens": self.script.cached_tokens or 0,
                    },
                }
            )
        return chunks


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
