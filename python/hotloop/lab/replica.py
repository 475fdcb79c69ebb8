"""A simulated inference replica: vLLM's token-id completions answered by the sim engine.

`python -m hotloop.lab.replica --port 9001` serves `POST /v1/completions` (a token-id
`prompt`, streamed chunks with `token_ids`, as `hotloop.engines.upstream.VllmDialect`
expects), `GET /v1/models` and `GET /health`, and answers like `hotloop serve --engine
sim`: a scripted model in the harmony format whose time to first token grows with the
prompt tokens its engine-wide prefix cache does not hold. What it is for is
`GET /prompts`: one record per completion request, in arrival order, with a hash of the
prompt ids, their count, how many of them extended what this replica had already seen
(its prefix-cache hit) and the request's `x-session-id`. The fault tests compare prompt
hashes with an undisturbed run (a conversation rebuilt on another node must send the
same ids) and the failover benchmark counts cache hits per routing mode.

It is a test and benchmark fixture, served on loopback; it never runs a model.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import time
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from hotloop._core import ChatFormat, Prompt
from hotloop.engines.base import Sampling
from hotloop.engines.sim import SimEngine, SimScript, SimSpeed

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def prompt_hash(ids: list[int]) -> str:
    """A short fingerprint of a prompt's ids (the same in every process)."""
    return hashlib.blake2b(array("i", ids).tobytes(), digest_size=12).hexdigest()


@dataclass(frozen=True)
class PromptRecord:
    """One completion request as the replica saw it."""

    hash: str
    tokens: int
    cached: int
    """Prompt tokens that extended a sequence this replica had processed before."""
    session: str | None
    """The request's `x-session-id` (hotloop's conversation key)."""
    at: float
    """Wall-clock arrival time, comparable across replicas on one host."""


class SimReplica:
    """The ASGI app (see the module docstring)."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.prompts: list[PromptRecord] = []

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path == "/health":
            await _json(send, 200, {"status": "ok"})
        elif path == "/v1/models":
            await _json(send, 200, {"object": "list", "data": [{"id": self.engine.model}]})
        elif path == "/prompts":
            await _json(send, 200, [asdict(p) for p in self.prompts])
        elif path == "/v1/completions" and method == "POST":
            await self._complete(scope, receive, send)
        else:
            await _json(send, 404, {"error": {"message": f"no route {method} {path}"}})

    async def _complete(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        request = orjson.loads(await request_body(receive))
        ids: list[int] = request["prompt"]
        session = self.engine.session()
        prompt = Prompt.from_tokens(ids)
        # A fresh session per request: the engine-wide cache of recent sequences is the
        # prefix cache, as in vLLM.
        sampling = Sampling(max_output_tokens=int(request["max_tokens"]))
        stream = session.generate(prompt, sampling)
        header = dict(scope["headers"]).get(b"x-session-id")
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        sent = 0
        async for batch in stream:
            if sent == 0:
                self.prompts.append(
                    PromptRecord(
                        hash=prompt_hash(ids),
                        tokens=len(ids),
                        cached=len(ids) - session.prefill_tokens,
                        session=None if header is None else header.decode(),
                        at=time.time(),
                    )
                )
            sent += len(batch)
            choice = {"index": 0, "token_ids": batch, "finish_reason": None}
            await send({"type": "http.response.body", "body": _event(choice), "more_body": True})
        done = {"index": 0, "token_ids": [], "finish_reason": "stop"}
        await send({"type": "http.response.body", "body": _event(done), "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


async def request_body(receive: Receive) -> bytes:
    """The whole body of an ASGI HTTP request (its chunks joined once: a prompt of 100k
    ids is megabytes)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _event(choice: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps({"object": "text_completion", "choices": [choice]}) + b"\n\n"


async def _json(send: Send, status: int, payload: Any) -> None:
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": orjson.dumps(payload)})


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hotloop.lab.replica", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="sim")
    parser.add_argument("--text", default="Done.", help="the final answer")
    parser.add_argument("--tool", default=None, help="function to call before answering")
    parser.add_argument("--tool-calls", type=int, default=0)
    parser.add_argument("--tool-arguments", default="{}")
    parser.add_argument("--tokens-per-second", type=float, default=2000.0)
    parser.add_argument("--ttft", type=float, default=0.005)
    parser.add_argument("--prefill-tokens-per-second", type=float, default=50000.0)
    return parser


def main() -> None:
    args = argument_parser().parse_args()
    engine = SimEngine(
        ChatFormat.harmony(),
        model=args.model,
        speed=SimSpeed(
            tokens_per_second=args.tokens_per_second,
            ttft=args.ttft,
            prefill_tokens_per_second=args.prefill_tokens_per_second,
        ),
        script=SimScript(
            text=args.text,
            tool=args.tool,
            tool_calls=args.tool_calls,
            tool_arguments=args.tool_arguments,
        ),
    )
    serve(SimReplica(engine), args.port)


def serve(app: Any, port: int) -> None:
    """Serve a fixture's ASGI app on loopback `port` until the process is stopped."""
    import uvicorn

    asyncio.run(
        uvicorn.Server(
            uvicorn.Config(
                app,
                host="127.0.0.1",
                port=port,
                lifespan="off",
                loop="uvloop",
                http="httptools",
                log_level="info",
                access_log=False,
            )
        ).serve()
    )


if __name__ == "__main__":
    main()
