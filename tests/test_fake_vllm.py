"""The benchmark's fake vLLM reports prefix-cache hits by vLLM's rule (tests/test_vllm.py
checks the rule on the real one): a continuation is served every full block of the
previous prompt and reply but the reply's last id. It also counts one marker id (its
turn counter) in each prompt, over the new ids only when the prompt continues what it
holds."""

from __future__ import annotations

from hotloop.lab.fake_vllm import PrefixCache, id_text

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
