"""The embedded llama engine with the real SmolLM2 model: KV reuse across turns measured
by llama.cpp's own counters, cancellation, sessions sharing the model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from engine_conversation import IM_END, first_turn, next_turn, small_llama
from hotloop._core import Prompt
from hotloop.engines.base import EngineError, Sampling
from hotloop.engines.llama import LlamaEngine, LlamaSession

pytestmark = pytest.mark.model

GREEDY = Sampling(max_output_tokens=24, temperature=0.0, stop_tokens=(IM_END,))
ENDLESS = Sampling(max_output_tokens=1500, temperature=0.0)  # no stop token


@pytest.fixture
async def engine() -> AsyncIterator[LlamaEngine]:
    async with small_llama() as started:
        yield started


async def collect(session: LlamaSession, ids: list[int], sampling: Sampling) -> list[int]:
    out: list[int] = []
    async for batch in session.generate(Prompt.from_tokens(ids), sampling):
        out.extend(batch)
    return out


async def test_turn_two_evaluates_only_the_new_tokens(engine: LlamaEngine) -> None:
    session = engine.session()
    p1 = first_turn("What is the capital of France?")
    reply1 = await collect(session, p1, GREEDY)
    assert reply1

    p2 = next_turn(p1, reply1, "And of Italy?")
    before, _ = engine.perf()
    reply2 = await collect(session, p2, GREEDY)
    after, _ = engine.perf()
    assert reply2

    # The KV holds turn 1's prompt and every sampled id but the last (sampled, never
    # fed back): that last id and the new user turn are all turn 2 evaluates.
    new_tokens = len(p2) - (len(p1) + len(reply1) - 1)
    assert after - before == new_tokens
    turn = session.last_turn
    assert turn is not None
    assert turn.evaluated_tokens == new_tokens
    assert turn.reused_tokens == len(p2) - new_tokens

    # Another connection with the same history starts from a copy of that KV.
    other = engine.session()
    await collect(other, p2, GREEDY)
    assert other.last_turn is not None
    assert other.last_turn.reused_tokens == len(p2) - 1
    assert other.last_turn.evaluated_tokens == 1
    await other.close()
    await session.close()
    # Closed connections leave their sequences behind as donors for the next one.
    later = engine.session()
    await collect(later, p2, GREEDY)
    assert later.last_turn is not None
    assert later.last_turn.reused_tokens == len(p2) - 1
    await later.close()


async def test_a_prewarm_fills_the_kv_and_the_next_turn_reuses_it(engine: LlamaEngine) -> None:
    """`max_output_tokens` 0 (a prewarm): the prompt is evaluated, nothing sampled,
    and the turn that follows evaluates only what it adds."""
    session = engine.session()
    p1 = first_turn("Summarize the history of the Roman Empire in one line.")
    assert await collect(session, p1, Sampling(max_output_tokens=0)) == []
    warm = session.last_turn
    assert warm is not None
    assert (warm.evaluated_tokens, warm.sampled_tokens) == (len(p1), 0)
    assert await collect(session, p1, GREEDY)
    turn = session.last_turn
    assert turn is not None
    # All of it but the last id, evaluated again for the logits to sample from.
    assert (turn.reused_tokens, turn.evaluated_tokens) == (len(p1) - 1, 1)
    await session.close()


async def test_closing_the_stream_stops_within_one_token(engine: LlamaEngine) -> None:
    session = engine.session()
    stream = session.generate(Prompt.from_tokens(first_turn("Count to one thousand.")), ENDLESS)
    first = await anext(stream)
    assert first
    await stream.aclose()
    await session.settled()
    turn = session.last_turn
    assert turn is not None and turn.sampled_at_cancel is not None
    assert turn.sampled_tokens - turn.sampled_at_cancel <= 1
    assert turn.sampled_tokens < ENDLESS.max_output_tokens
    await session.close()


async def test_cancelling_the_consumer_task_stops_generation(engine: LlamaEngine) -> None:
    session = engine.session()
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in session.generate(
            Prompt.from_tokens(first_turn("Tell a long story.")), ENDLESS
        ):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await session.settled()
    turn = session.last_turn
    assert turn is not None and turn.sampled_at_cancel is not None
    assert turn.sampled_tokens - turn.sampled_at_cancel <= 1
    await session.close()


async def test_two_sessions_interleave_and_keep_their_own_kv(engine: LlamaEngine) -> None:
    a, b = engine.session(), engine.session()
    order: list[str] = []
    sampling = Sampling(max_output_tokens=40, temperature=0.0)

    async def run(name: str, session: LlamaSession, ids: list[int]) -> list[int]:
        out: list[int] = []
        async for batch in session.generate(Prompt.from_tokens(ids), sampling):
            order.append(name)
            out.extend(batch)
        return out

    pa = first_turn("Name three fruits.")
    pb = first_turn("Name three colours.")
    ra, rb = await asyncio.gather(run("a", a, pa), run("b", b, pb))
    assert len(ra) == len(rb) == 40
    # Token-level interleaving: each session streamed while the other was still running.
    assert order.index("b") < len(order) - 1 - order[::-1].index("a")
    assert order.index("a") < len(order) - 1 - order[::-1].index("b")

    # Each session's sequence survived the other's turn: turn 2 reuses it.
    pa2 = next_turn(pa, ra, "Which is sweetest?")
    await collect(a, pa2, GREEDY)
    assert a.last_turn is not None
    assert a.last_turn.reused_tokens == len(pa) + len(ra) - 1
    pb2 = next_turn(pb, rb, "Which is brightest?")
    await collect(b, pb2, GREEDY)
    assert b.last_turn is not None
    assert b.last_turn.reused_tokens == len(pb) + len(rb) - 1
    await a.close()
    await b.close()


async def test_concurrent_lanes_of_one_session_share_their_common_prefix(
    engine: LlamaEngine,
) -> None:
    session = engine.session()
    base = first_turn("Name a fruit.")
    reply = await collect(session, base, GREEDY)
    lane_a = next_turn(base, reply, "Name a vegetable.")
    lane_b = next_turn(base, reply, "Name a colour.")
    shared = len(base) + len(reply) - 1  # what the session's sequence holds
    long = Sampling(max_output_tokens=30, temperature=0.0)

    stream_a = session.generate(Prompt.from_tokens(lane_a), long)
    assert await anext(stream_a)  # lane a is generating on the session's sequence
    stats_a = session.last_turn
    out_b = await collect(session, lane_b, long)  # lane b forks while a runs
    stats_b = session.last_turn
    rest_a = [t async for batch in stream_a for t in batch]
    assert out_b and rest_a
    assert stats_a is not None and stats_b is not None
    assert stats_a.reused_tokens == shared
    # The fork copied the common prefix from lane a's sequence instead of evaluating it.
    common = next(i for i, (x, y) in enumerate(zip(lane_a, lane_b, strict=False)) if x != y)
    assert stats_b.reused_tokens == common
    assert stats_b.evaluated_tokens == len(lane_b) - common
    await session.close()


async def test_more_sessions_than_sequences_evicts_the_least_recent(engine: LlamaEngine) -> None:
    sessions = [engine.session() for _ in range(3)]  # the engine has two sequences
    prompts = [first_turn(f"Say the number {i}.") for i in range(3)]
    replies = [await collect(s, p, GREEDY) for s, p in zip(sessions, prompts, strict=True)]
    # Session 0 was idle longest when session 2 needed a sequence: its history is gone,
    # and its next turn reuses only what it shares with session 2's (the system turn).
    again = next_turn(prompts[0], replies[0], "Again.")
    await collect(sessions[0], again, GREEDY)
    assert sessions[0].last_turn is not None
    common = next(i for i, (x, y) in enumerate(zip(prompts[0], prompts[2], strict=True)) if x != y)
    assert sessions[0].last_turn.reused_tokens == common
    # Session 2 kept its sequence.
    again2 = next_turn(prompts[2], replies[2], "Again.")
    await collect(sessions[2], again2, GREEDY)
    assert sessions[2].last_turn is not None
    assert sessions[2].last_turn.reused_tokens == len(prompts[2]) + len(replies[2]) - 1
    for s in sessions:
        await s.close()


async def test_a_prompt_longer_than_the_context_is_refused(engine: LlamaEngine) -> None:
    session = engine.session()
    with pytest.raises(EngineError) as info:
        await collect(session, [IM_END] * (engine.context_window + 1), GREEDY)
    assert info.value.code == "context_length_exceeded"
    await session.close()


async def test_the_engine_answers_in_its_chat_format(engine: LlamaEngine) -> None:
    chat_format = engine.chat_format
    assert chat_format.name == "chatml"
    assert IM_END in chat_format.stop_tokens
    session = engine.session()
    sampling = Sampling(
        max_output_tokens=48, temperature=0.0, stop_tokens=tuple(chat_format.stop_tokens)
    )
    reply = await collect(session, first_turn("What is 2+2?"), sampling)
    assert reply[-1] in chat_format.stop_tokens
    assert "4" in chat_format.tokenizer.decode(reply)
    await session.close()


async def test_a_sequence_is_copied_only_to_sessions_of_its_salt(engine: LlamaEngine) -> None:
    """A tenant's KV is a donor for its own sessions only: another salt's session with
    the same prompt evaluates all of it (by llama.cpp's own counter), an unsalted one
    too, while a later session of the first salt starts from the copy."""
    prompt = first_turn(" ".join(f"Rule {n}: be brief." for n in range(40)))
    await collect(engine.session("tenant-a"), prompt, GREEDY)
    for salt in ("tenant-b", None):
        stranger = engine.session(salt)
        before, _ = engine.perf()
        await collect(stranger, prompt, GREEDY)
        after, _ = engine.perf()
        assert stranger.last_turn is not None
        assert stranger.last_turn.reused_tokens == 0
        assert after - before == len(prompt)
        # Closed, its sequence is the first evicted (the engine holds two).
        await stranger.close()
    again = engine.session("tenant-a")
    await collect(again, prompt, GREEDY)
    assert again.last_turn is not None
    assert again.last_turn.reused_tokens == len(prompt) - 1
