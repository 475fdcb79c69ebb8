"""A fake vLLM for the side-by-side gateway benchmark (`hotloop bench peers`).

    python -m hotloop.lab.fake_vllm --port 9001 --script rollout.json --rate 1000 [--render]

One process serves the three endpoints the gateways send to, each answering a replayed
agent rollout turn for turn (the turn is the number of the rollout's calls the request
already holds), paced at `--rate` tokens/s with the sim engine's clock (one event per
token, several per wake above the loop's 1 ms timer):

- `POST /v1/completions` with a token-id `prompt` (hotloop's upstream engine): the
  turn's harmony ids, one `token_ids` event each; vLLM tokenizes nothing here, and the
  turn is found by counting `<|call|>` ids (the cache keeps the model's ids verbatim).
  With `stream_options.include_usage` a usage chunk follows the finishing one, with
  the prompt ids its prefix cache held (`PrefixCache`, one per conversation, as
  hotloop names it in `x-session-id`), as vLLM run with
  `--enable-prompt-tokens-details` reports them. The prompt's ids are never parsed
  into Python ints (its JSON text is compared and counted as bytes): 100k of them cost
  the fake's one event loop milliseconds a request, which every other conversation's
  tokens waited for, and a capacity benchmark must not measure its fake.
- `POST /v1/responses`, stateless (agentic-api, smg): the whole history in `input`,
  answered with a reasoning item and a function call, streamed as Responses events;
- `POST /v1/chat/completions`: the same turn as chat chunks (`reasoning_content`, one
  tool call), and a usage chunk with `stream_options.include_usage` (the turn counted
  in the bytes, `"role":"tool"`, when the upstream is free).

With `--render`, a responses or chat request's whole input is rendered and tokenized
before the first token as vLLM's gpt-oss path does (openai-harmony,
`hotloop.lab.peer.harmony_renderer`); without it the upstream is free. A token-id
prompt is never rendered: vLLM takes it as it is.

It is a benchmark fixture served on loopback; it never runs a model.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from hotloop._core import ChatFormat
from hotloop.engines.sim import TIMER_RESOLUTION, SimScript, SimTurn
from hotloop.lab.replica import Receive, Send, request_body, serve

MAX_CONVERSATIONS = 4096
"""Prefix caches kept (`FakeVllm.caches`): more than any benchmark runs at once."""

Event = tuple[int, bytes]
"""An SSE event, and the sampled tokens it stands for (paced; 0: sent with the next)."""


@dataclass(frozen=True)
class Turn:
    """One replayed model turn, cut into the pieces the model samples."""

    reasoning: list[str]
    call: tuple[str, str] | None
    arguments: list[str]
    text: list[str]
    headers: tuple[int, int]
    """The format's tokens around the reasoning and around the call or text (channel
    headers, ends, the stop token): sampled too, so paced like the pieces."""


def pieces(format_: ChatFormat, text: str | None) -> list[str]:
    """`text` as the model samples it: one string per token."""
    if not text:
        return []
    tokenizer = format_.tokenizer
    return [tokenizer.decode([token]) for token in tokenizer.encode(text)]


class PrefixCache:
    """vLLM's automatic prefix caching, as far as its usage shows it, for one
    conversation (the fake keeps one per `x-session-id`): what the last request left
    (its prompt and its output but the last sampled id, which is never fed back) is
    held; a prompt's hit is the full blocks of its common prefix with that, short of
    its own last id (vLLM always computes that one).

    Ids are held as the request's JSON text, each followed by a comma (`id_text`), and
    compared as bytes: Python ints cost 40-60 ms a comparison at 200k ids under load,
    the bytes well under one. The held text's id count and its count of one `marker` id
    (the fake's turn counter) are kept with it, so a prompt that continues all that is
    held is counted over its new ids only: counting the whole prompt's text again cost
    1.2 ms a request at 67k ids (timed by hand), harness work that no upstream does."""

    def __init__(self, block_size: int = 32, marker: int = -1) -> None:
        self.block_size = block_size
        self.marker = b",%d," % marker
        self.held = b""
        self.held_ids = 0
        self.held_marks = 0

    def lookup(self, prompt: bytes, length: int) -> tuple[int, int]:
        """The prompt ids served from the cache and the marker ids in the prompt
        (`prompt`: its `length` ids' text)."""
        common = _common_prefix(self.held, prompt)
        if common == len(self.held):
            shared, marks, counted = self.held_ids, self.held_marks, common
        else:
            shared = self.held.count(b",", 0, common)
            marks, counted = 0, 0
        marks += (b"," + prompt[counted:]).count(self.marker)
        return min(shared, length - 1) // self.block_size * self.block_size, marks

    def add(self, held: bytes, ids: int, marks: int) -> None:
        """Hold `held`, the text of `ids` ids of which `marks` are the marker."""
        self.held, self.held_ids, self.held_marks = held, ids, marks


def id_text(ids: list[int]) -> bytes:
    """Ids as `PrefixCache` holds them."""
    return b"".join(b"%d," % i for i in ids)


def _prompt_text(body: bytes) -> tuple[bytes, dict[str, Any]]:
    """A completion request's `prompt` ids as `PrefixCache` holds them, cut from its
    JSON text without a Python int each, and the request's other fields."""
    start = body.index(b"[", body.index(b'"prompt"'))
    end = body.index(b"]", start)
    ids = body[start + 1 : end].replace(b" ", b"")
    fields = orjson.loads(body[: start + 1] + body[end:])
    return (ids + b"," if ids else b""), fields


def _common_prefix(a: bytes, b: bytes) -> int:
    """The length of the prefix `a` and `b` share, compared in C without copying the
    common case (a continuation starts with all that is held); otherwise halving."""
    if b.startswith(a):
        return len(a)
    if a.startswith(b):
        return len(b)
    low, high = 0, min(len(a), len(b))  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if b.startswith(a[low:middle], low):
            low = middle
        else:
            high = middle
    return low


class FakeVllm:
    """The ASGI app (see the module docstring)."""

    def __init__(self, script: SimScript, rate: float, *, render: bool) -> None:
        format_ = ChatFormat.harmony()
        # No prefill time: what the upstream spends is its CPU, measured from outside.
        self.rate = rate
        # A call ends with `<|call|>`, which hotloop's cache keeps in the history.
        self.call_id = format_.completion_tokens(calls=[("f", "{}")])[-1]
        self.sampled = [
            format_.completion_tokens(reasoning=t.reasoning, text=t.text, calls=t.calls)
            for t in script.turns
        ]
        self.turns = [
            Turn(
                reasoning=pieces(format_, turn.reasoning),
                call=turn.calls[0] if turn.calls else None,
                arguments=pieces(format_, turn.calls[0][1]) if turn.calls else [],
                text=pieces(format_, turn.text),
                headers=_headers(format_, turn),
            )
            for turn in script.turns
        ]
        self.ids = itertools.count(1)
        self.caches: OrderedDict[bytes, PrefixCache] = OrderedDict()
        """One per conversation (`x-session-id`), the least recently used dropped."""
        self.render: Callable[..., list[int]] | None = None
        if render:
            from hotloop.lab.peer import harmony_renderer

            self.render = harmony_renderer()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/v1/responses" and scope["method"] == "POST":
            body = await request_body(receive)
            if self.render is None:
                # Free: the turn is counted in the bytes, and only the model is read (the
                # whole history parsed into dicts cost the fake's loop milliseconds).
                calls = body.count(b'"type":"function_call_output"')
                await self._stream(send, self._responses_events(_model(body), calls))
                return
            request = orjson.loads(body)
            items = request["input"]
            if isinstance(items, str):
                items = [{"type": "message", "role": "user", "content": items}]
            calls = sum(1 for item in items if item.get("type") == "function_call_output")
            self._render(request.get("instructions"), request.get("tools") or [], items)
            await self._stream(send, self._responses_events(request.get("model", "sim"), calls))
        elif path == "/v1/chat/completions" and scope["method"] == "POST":
            body = await request_body(receive)
            # `include_usage` read in the bytes: serde_json and orjson write no spaces.
            usage = b'"include_usage":true' in body
            if self.render is None:
                # Free: the turn counted in the bytes, as for /v1/responses.
                calls = body.count(b'"role":"tool"')
                await self._stream(send, self._chat_events(_model(body), calls, usage))
                return
            request = orjson.loads(body)
            messages = request["messages"]
            calls = sum(1 for message in messages if message.get("role") == "tool")
            self._render(None, _chat_tools(request), _chat_items(messages))
            events = self._chat_events(request.get("model", "sim"), calls, usage)
            await self._stream(send, events)
        elif path == "/v1/completions" and scope["method"] == "POST":
            text, request = _prompt_text(await request_body(receive))
            usage = bool((request.get("stream_options") or {}).get("include_usage"))
            session = dict(scope["headers"]).get(b"x-session-id", b"")
            events = self._completion_events(self._cache(session), text, usage)
            await self._stream(send, events)
        elif path == "/health":  # the gateways wait for it before they listen
            await _json(send, 200, {"status": "ok"})
        elif path == "/v1/models":
            await _json(send, 200, {"object": "list", "data": [{"id": "sim"}]})
        else:
            await _json(send, 404, {"error": {"message": f"no route {path}"}})

    def _render(self, instructions: str | None, tools: list[Any], items: list[Any]) -> None:
        """vLLM's per-request prompt work: render and tokenize the whole conversation."""
        if self.render is not None:
            self.render(instructions, tools, items, None)

    def _turn(self, calls: int) -> Turn:
        return self.turns[min(calls, len(self.turns) - 1)]

    async def _stream(self, send: Send, events: Iterator[Event]) -> None:
        """SSE, paced as the sim engine paces ids: sampled token i is due `i / rate`
        after the first; an event without tokens goes with the next write."""
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        loop = asyncio.get_running_loop()
        start = loop.time()
        pending: list[bytes] = []
        sampled = 0
        for tokens, event in events:
            sampled += tokens
            due = start + (sampled - 1) / self.rate
            if tokens and loop.time() < due:
                # The clock simulates decoding; tokens due at the same wake go together.
                body = b"".join(pending)
                pending.clear()
                if body:
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                await asyncio.sleep(max(due - loop.time(), TIMER_RESOLUTION))
            pending.append(event)
        await send({"type": "http.response.body", "body": b"".join(pending)})

    def _cache(self, session: bytes) -> PrefixCache:
        cache = self.caches.get(session)
        if cache is None:
            cache = self.caches[session] = PrefixCache(marker=self.call_id)
            if len(self.caches) > MAX_CONVERSATIONS:
                self.caches.popitem(last=False)
        else:
            self.caches.move_to_end(session)
        return cache

    def _completion_events(self, cache: PrefixCache, text: bytes, usage: bool) -> Iterator[Event]:
        """vLLM's token-id completion stream for a prompt of ids `text` (`id_text`):
        one event per sampled id, then the usage chunk if asked."""
        # The script's turn: the calls in the prompt.
        length = text.count(b",")
        cached, calls = cache.lookup(text, length)
        sampled = self.sampled[min(calls, len(self.sampled) - 1)]
        kept = sampled[:-1]
        marks = calls + kept.count(self.call_id)
        cache.add(text + id_text(kept), length + len(kept), marks)
        for token in sampled:
            choice = {"index": 0, "token_ids": [token], "finish_reason": None}
            yield 1, _data({"object": "text_completion", "choices": [choice]})
        done = {"index": 0, "token_ids": [], "finish_reason": "stop"}
        yield 0, _data({"object": "text_completion", "choices": [done]})
        if usage:
            counts = {
                "prompt_tokens": length,
                "completion_tokens": len(sampled),
                "total_tokens": length + len(sampled),
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            yield 0, _data({"object": "text_completion", "choices": [], "usage": counts})
        yield 0, b"data: [DONE]\n\n"

    def _responses_events(self, model: str, calls: int) -> Iterator[Event]:
        """vLLM's Responses stream for one turn: reasoning, then a call or a message."""
        turn = self._turn(calls)
        n = next(self.ids)
        response: dict[str, Any] = {
            "id": f"resp_fake{n}",
            "object": "response",
            "created_at": 0,
            "model": model,
            "status": "in_progress",
            "output": [],
            "usage": None,
        }
        sequence = itertools.count()
        output: list[dict[str, Any]] = []

        def event(kind: str, tokens: int = 0, **fields: Any) -> Event:
            data = orjson.dumps({"type": kind, "sequence_number": next(sequence), **fields})
            return tokens, b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

        def item_events(
            item: dict[str, Any], headers: int, delta: str, said: list[str], **where: Any
        ) -> Iterator[Event]:
            """One output item: added (its header tokens), a delta per token, done."""
            index = len(output)
            yield event("response.output_item.added", headers, output_index=index, item=item)
            for piece in said:
                yield event(delta, 1, item_id=item["id"], output_index=index, delta=piece, **where)
            output.append(self._done(item, "".join(said)))
            yield event("response.output_item.done", output_index=index, item=output[-1])

        yield event("response.created", response=response)
        if turn.reasoning:
            reasoning = {"id": f"rs_fake{n}", "type": "reasoning", "summary": [], "content": []}
            delta = "response.reasoning_text.delta"
            yield from item_events(
                reasoning, turn.headers[0], delta, turn.reasoning, content_index=0
            )
        if turn.call is not None:
            call = {
                "id": f"fc_fake{n}",
                "type": "function_call",
                "call_id": f"call_fake{n}",
                "name": turn.call[0],
                "arguments": "",
                "status": "in_progress",
            }
            delta = "response.function_call_arguments.delta"
            yield from item_events(call, turn.headers[1], delta, turn.arguments)
        else:
            message = {
                "id": f"msg_fake{n}",
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            delta = "response.output_text.delta"
            yield from item_events(message, turn.headers[1], delta, turn.text, content_index=0)
        generated = len(turn.reasoning) + len(turn.arguments) + len(turn.text)
        usage = {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": len(turn.reasoning)},
            "total_tokens": generated,
        }
        done = {**response, "status": "completed", "output": output, "usage": usage}
        yield event("response.completed", response=done)

    @staticmethod
    def _done(item: dict[str, Any], said: str) -> dict[str, Any]:
        """An output item complete with what was said in it."""
        if item["type"] == "reasoning":
            return {**item, "content": [{"type": "reasoning_text", "text": said}]}
        if item["type"] == "function_call":
            return {**item, "arguments": said, "status": "completed"}
        content = [{"type": "output_text", "text": said, "annotations": []}]
        return {**item, "status": "completed", "content": content}

    def _chat_events(self, model: str, calls: int, usage: bool) -> Iterator[Event]:
        """vLLM's chat stream for one turn: `reasoning_content`, then one tool call,
        then (`usage`: `stream_options.include_usage`) a usage chunk without choices."""
        turn = self._turn(calls)
        n = next(self.ids)
        head = {"id": f"chatcmpl-fake{n}", "object": "chat.completion.chunk", "created": 0}
        head["model"] = model

        def chunk(delta: dict[str, Any], finish: str | None = None, tokens: int = 1) -> Event:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return tokens, _data({**head, "choices": [choice]})

        yield chunk({"role": "assistant", "content": ""}, tokens=turn.headers[0])
        for piece in turn.reasoning:
            yield chunk({"reasoning_content": piece})
        if turn.call is not None:
            call = {"index": 0, "id": f"call_fake{n}", "type": "function"}
            named = {**call, "function": {"name": turn.call[0]}}
            yield chunk({"tool_calls": [named]}, tokens=turn.headers[1])
            for piece in turn.arguments:
                yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        for piece in turn.text:
            yield chunk({"content": piece})
        if turn.call is None:
            yield chunk({}, "stop", tokens=turn.headers[1])
        else:
            yield chunk({}, "tool_calls", tokens=0)
        if usage:
            generated = len(turn.reasoning) + len(turn.arguments) + len(turn.text)
            counts = {"prompt_tokens": 0, "completion_tokens": generated}
            counts["total_tokens"] = generated
            yield 0, _data({**head, "choices": [], "usage": counts})
        yield 0, b"data: [DONE]\n\n"


def _model(body: bytes) -> str:
    """A JSON request's top-level `model`, read without parsing the rest: the first
    `"model":"..."` of a body whose clients write it before `input` (orjson, serde_json
    and the OpenAI SDKs do, without spaces)."""
    start = body.find(b'"model":"')
    if start < 0:
        return "sim"
    start += len(b'"model":"')
    return body[start : body.index(b'"', start)].decode()


def _data(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def _json(send: Send, status: int, payload: Any) -> None:
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": orjson.dumps(payload)})


def _headers(format_: ChatFormat, turn: SimTurn) -> tuple[int, int]:
    """The sampled tokens of a turn that are not its text: see `Turn.headers`."""
    reasoning = format_.completion_tokens(reasoning=turn.reasoning) if turn.reasoning else []
    answer = format_.completion_tokens(text=turn.text, calls=turn.calls[:1])
    said = pieces(format_, turn.calls[0][1] if turn.calls else turn.text)
    return (
        len(reasoning) - len(pieces(format_, turn.reasoning)),
        len(answer) - len(said),
    )


def _chat_tools(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [t.get("function", t) | {"type": "function"} for t in request.get("tools") or []]


def _chat_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as the Responses items the harmony renderer maps."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "tool":
            output = message.get("content") or ""
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": output,
                }
            )
            continue
        if message.get("reasoning_content"):
            items.append({"type": "reasoning", "content": [{"text": message["reasoning_content"]}]})
        if message.get("content"):
            items.append({"type": "message", "role": role, "content": message["content"]})
        for call in message.get("tool_calls") or []:
            function = call["function"]
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": function["name"],
                    "arguments": function["arguments"],
                }
            )
    return items


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hotloop.lab.fake_vllm", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", required=True, help="the sim replay script (JSON)")
    parser.add_argument("--rate", type=float, default=1000.0, help="tokens per second")
    parser.add_argument("--render", action="store_true", help="render the input as vLLM does")
    return parser


def main() -> None:
    args = argument_parser().parse_args()
    serve(FakeVllm(SimScript.load(args.script), args.rate, render=args.render), args.port)


if __name__ == "__main__":
    main()
