"""The sim engine replays a recorded rollout call for call, over WebSocket-style sessions
(one per connection) and HTTP-style ones (one per request), and charges only new tokens,
in harmony, in SmolLM2's ChatML (where a step's reasoning is said as text) and through
Qwen3's own chat template."""

import json
from pathlib import Path

import orjson
import pytest
from hotloop._core import Conversation, parse_request
from hotloop.engines.base import Sampling
from hotloop.engines.sim import SIM_FORMATS, SimEngine, SimScript, SimSpeed
from hotloop.lab.rollout import Rollout, build_rollout

FORMAT = SIM_FORMATS["harmony"]()
SAMPLING = Sampling(max_output_tokens=100_000)


def _engine(rollout: Rollout, tmp_path: Path, sim_format: str = "harmony") -> SimEngine:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(rollout.sim_script(sim_format)))
    speed = SimSpeed(tokens_per_second=1e6, ttft=0.0, prefill_tokens_per_second=1e9)
    chat_format = SIM_FORMATS[sim_format]()
    return SimEngine(chat_format, speed=speed, script=SimScript.load(str(path)))


async def _replay(sim: SimEngine, rollout: Rollout, per_request: bool) -> list[int]:
    """Drive a conversation through the engine; returns each turn's uncached tokens."""
    conversation = Conversation(sim.chat_format, context_window=1 << 21)
    prefix = {"instructions": rollout.instructions, "tools": rollout.tools}
    conversation.extend(parse_request(orjson.dumps({"input": rollout.task, **prefix})))
    session = sim.session()
    uncached = []
    for index in range(len(rollout.steps) + 1):
        if per_request:
            session = sim.session()
        before = session.prefill_tokens
        ids: list[int] = []
        async for batch in session.generate(conversation.prompt(), SAMPLING):
            ids.extend(batch)
        uncached.append(session.prefill_tokens - before)
        parser = conversation.parser()
        parser.feed(ids)
        _, outcome, _ = parser.finish()
        assert outcome == "stopped"
        conversation.commit_output(parser)
        assert ids == sim.turns[index][0]
        if index < len(rollout.steps):
            (call_id,) = conversation.open_call_ids
            answer = [rollout.tool_result(index, call_id=call_id)]
            conversation.extend(parse_request(orjson.dumps({"input": answer, **prefix})))
    return uncached


@pytest.mark.parametrize("sim_format", list(SIM_FORMATS))
async def test_replays_every_turn_over_one_session(tmp_path: Path, sim_format: str) -> None:
    rollout = build_rollout(4, tool_calls=6)
    sim = _engine(rollout, tmp_path, sim_format)
    uncached = await _replay(sim, rollout, per_request=False)
    # After the first turn only the tool output and its headers are new to the engine:
    # the previous prompt and the model's own output are in its cache. A chat template
    # (vLLM's exact prompt, not verbatim) renders the model's last turn as it renders
    # history, which differs from what was sampled (Qwen3: an empty <think> block, a
    # newline before <tool_call>): the engine reads that one turn again, never more.
    tokenizer = sim.chat_format.tokenizer
    outputs = [len(tokenizer.encode(s.output)) for s in rollout.steps]
    rerendered = sim.chat_format.name.startswith("template:")
    sampled = [len(turn[0]) if rerendered else 0 for turn in sim.turns]
    for new, size, turn in zip(uncached[1:], outputs, sampled, strict=False):
        assert 0 < new - size < 30 + turn


@pytest.mark.parametrize("sim_format", list(SIM_FORMATS))
async def test_replays_every_turn_with_a_session_per_request(
    tmp_path: Path, sim_format: str
) -> None:
    rollout = build_rollout(4, tool_calls=6)
    sim = _engine(rollout, tmp_path, sim_format)
    per_session = await _replay(sim, rollout, per_request=False)
    per_request = await _replay(_engine(rollout, tmp_path, sim_format), rollout, per_request=True)
    # The engine-wide recent sequences give a fresh session the same cache hits.
    assert per_request == per_session


def test_answer_is_the_last_turn(tmp_path: Path) -> None:
    rollout = build_rollout(4, tool_calls=5)
    sim = _engine(rollout, tmp_path)
    assert sim.turns[-1][0] == FORMAT.completion_tokens(text=rollout.answer)
    assert len(sim.turns) == len(rollout.steps) + 1
