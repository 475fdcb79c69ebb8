"""The benchmark's fake vLLM reports prefix-cache hits by vLLM's rule (tests/test_vllm.py
checks the rule on the real one): a continuation is served every full block of the
previous prompt and reply but the reply's last id. It also counts one marker id (its
turn counter) in each prompt, over the new ids only when the prompt continues what it
holds. Its conversations (`x-session-id`) each keep their own."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from hotloop._core import ChatFormat
from hotloop.engines.sim import SimScript, SimTurn
from hotloop.lab.fake_vllm import FakeVllm, PrefixCache, id_text

MARKER = 7


def test_a_continuation_hits_every_full_block_of_what_came_before() -> None:
    cache = PrefixCache(block_size=32, marker=MARKER)
    prompt = list(range(100))
    reply = [1000 + i for i in range(30)]

    def hit(ids: list[int]) -> int:
        cached, marks = cache.lookup(id_text(ids), len(ids))
        assert marks == ids.count(MARKER)
        return cached

    assert hit(prompt) == 0
    held = prompt + reply[:-1]
    cache.add(id_text(held), len(held), held.count(MARKER))
    following = [*prompt, *reply, *range(2000, 2050)]
    assert hit(following) == (len(prompt) + len(reply) - 1) // 32 * 32
    # A prompt held whole still computes its last id: a whole last block is not a hit.
    assert hit(prompt[:96]) == 64
    # Ids that differ in their last digits share nothing after them.
    assert hit([*prompt[:40], 412, *prompt[41:]]) == 32
    # Another conversation shares no block.
    assert hit([5, *prompt]) == 0


def test_markers_are_counted_in_the_held_text_and_in_the_new_ids() -> None:
    cache = PrefixCache(block_size=4, marker=MARKER)
    held = [1, MARKER, 2, MARKER, 3]
    cache.add(id_text(held), len(held), 2)
    # A continuation: the held count plus the new ids' (77 is not the marker).
    assert cache.lookup(id_text([*held, 77, MARKER, 4]), 8) == (4, 3)
    # A prompt that leaves the held text is counted whole.
    assert cache.lookup(id_text([1, MARKER, 9, MARKER, 70, MARKER]), 6) == (0, 3)


def test_interleaved_conversations_each_continue_their_own_cache() -> None:
    """Two conversations (`x-session-id`) taking turns: each turn's prompt continues its
    own conversation's last prompt and reply, and the usage says so."""
    format_ = ChatFormat.harmony()
    script = SimScript(turns=(SimTurn(reasoning="Look.", calls=(("f", "{}"),)),))
    app = FakeVllm(script, rate=1e6, render=False)
    reply = format_.completion_tokens(reasoning="Look.", calls=[("f", "{}")])

    async def cached(session: bytes, prompt: list[int]) -> int:
        body = orjson.dumps(
            {"prompt": prompt, "stream": True, "stream_options": {"include_usage": True}}
        )
        scope = {
            "type": "http",
            "path": "/v1/completions",
            "method": "POST",
            "headers": [(b"x-session-id", session)],
        }
        sent: list[bytes] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message.get("body", b""))

        await app(scope, receive, send)
        usage = next(line for line in b"".join(sent).split(b"\n\n") if b'"usage"' in line)
        details: int = orjson.loads(usage[6:])["usage"]["prompt_tokens_details"]["cached_tokens"]
        return details

    async def run() -> list[int]:
        first, second = list(range(100, 200)), list(range(300, 400))
        hits = [await cached(b"a", first), await cached(b"b", second)]
        # Each continues what its own conversation left (the reply but its last id).
        hits.append(await cached(b"a", [*first, *reply, *range(500, 540)]))
        hits.append(await cached(b"b", [*second, *reply, *range(600, 640)]))
        return hits

    held = (100 + len(reply) - 1) // 32 * 32
    assert asyncio.run(run()) == [0, 0, held, held]
