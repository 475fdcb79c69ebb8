"""The benchmark's fake vLLM reports prefix-cache hits by vLLM's rule (tests/test_vllm.py
checks the rule on the real one): a continuation is served every full block of the
previous prompt and reply but the reply's last id."""

from __future__ import annotations

from hotloop.bench.fake_vllm import PrefixCache, id_text


def test_a_continuation_hits_every_full_block_of_what_came_before() -> None:
    cache = PrefixCache(block_size=32)
    prompt = list(range(100))
    reply = [1000 + i for i in range(30)]

    def hit(ids: list[int]) -> int:
        return cache.hit(id_text(ids), len(ids))

    assert hit(prompt) == 0
    cache.add(id_text(prompt + reply[:-1]))
    following = [*prompt, *reply, *range(2000, 2050)]
    assert hit(following) == (len(prompt) + len(reply) - 1) // 32 * 32
    # A prompt held whole still computes its last id: a whole last block is not a hit.
    assert hit(prompt[:96]) == 64
    # Ids that differ in their last digits share nothing after them.
    assert hit([*prompt[:40], 412, *prompt[41:]]) == 32
    # Another conversation shares no block.
    assert hit([5, *prompt]) == 0
