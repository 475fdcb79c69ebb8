"""The simulated engine: deterministic script through the real chat format and output
parser, its per-session prefix-cache model, and its pacing (checked by content and by
the model's own arithmetic, never by wall time)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hotloop._core import ChatFormat, Conversation, Prompt, Tokenizer, parse_request
from hotloop.config import ServerConfig
from hotloop.engines.base import Sampling
from hotloop.engines.sim import (
    SimEngine,
    SimScript,
    SimSession,
    SimSpeed,
    count_occurrences,
    from_config,
    shared_prefix,
)
from hotloop.native_deps import smollm2_gguf_path

FORMAT = ChatFormat.harmony()
SCRIPT = SimScript(
    text="Finished.", tool="exec_command", tool_calls=2, tool_arguments='{"cmd":"ls"}'
)
SAMPLING = Sampling(max_output_tokens=10_000)


def engine(script: SimScript = SCRIPT) -> SimEngine:
    speed = SimSpeed(tokens_per_second=1e6, ttft=0.0, prefill_tokens_per_second=1e9)
    return SimEngine(FORMAT, speed=speed, script=script)


def request(body: str) -> Conversation:
    conversation = Conversation(FORMAT, context_window=1 << 20)
    conversation.extend(parse_request(body))
    return conversation


def test_count_occurrences_is_token_aligned() -> None:
    assert count_occurrences([1, 2, 3, 1, 2, 3, 1, 2], [1, 2, 3]) == 2
    assert count_occurrences([1, 2], [1, 2, 3]) == 0
    # 256 encodes as bytes 00 01 00 00: a byte-level match that is not token-aligned.
    assert count_occurrences([256, 1], [1 << 16]) == 0
    assert count_occurrences([5], []) == 0


async def test_script_calls_then_answers_through_the_real_parser() -> None:
    sim = engine()
    session = sim.session()
    conversation = request('{"model":"sim","input":"go"}')
    outputs = []
    for _ in range(3):
        parser = conversation.parser()
        ids: list[int] = []
        async for batch in session.generate(conversation.prompt(), SAMPLING):
            ids.extend(batch)
            parser.feed(batch)
        _, outcome, _ = parser.finish()
        assert outcome == "stopped" and parser.stopped
        conversation.commit_output(parser)
        outputs.append(ids)
        calls = conversation.open_call_ids
        if calls:
            output = {"type": "function_call_output", "call_id": calls[0], "output": "x"}
            conversation.extend(parse_request(orjson.dumps({"input": [output]})))
    assert outputs == [sim.call_ids, sim.call_ids, sim.answer_ids]


async def generate_turn(session: SimSession, conversation: Conversation) -> list[int]:
    """One generation through the parser, committed; returns the sampled ids."""
    parser = conversation.parser()
    ids: list[int] = []
    async for batch in session.generate(conversation.prompt(), SAMPLING):
        ids.extend(batch)
        parser.feed(batch)
    parser.finish()
    conversation.commit_output(parser)
    return ids


def expected_uncached(prompt: Prompt, earlier: Prompt, sampled: list[int]) -> int:
    """Tokens of `prompt` beyond `earlier` + the ids sampled after it (as far as the
    history still holds them verbatim)."""
    tail = prompt.tokens_from(len(earlier))
    return len(prompt) - len(earlier) - shared_prefix(tail, sampled)


async def test_prefix_cache_model_charges_only_new_tokens() -> None:
    sim = engine(SimScript(text="ok"))
    session = sim.session()
    conversation = request('{"model":"sim","input":"first question"}')
    first = conversation.prompt()
    _, uncached = session.choose(first)
    assert uncached == len(first)
    sampled = await generate_turn(session, conversation)
    conversation.extend(parse_request('{"input":"second"}'))
    second = conversation.prompt()
    _, uncached = session.choose(second)
    # Only the new input (and headers) must be prefilled: the old prompt and the
    # model's own output are in the simulated cache.
    assert uncached == expected_uncached(second, first, sampled)
    assert 0 < uncached < len(second) - len(first)
    other = request('{"model":"sim","input":"an unrelated conversation"}').prompt()
    _, uncached = session.choose(other)
    assert uncached == len(other) - other.common_prefix_len(second)
    assert sim.speed.first_token_delay(1000) > sim.speed.first_token_delay(10)


async def test_max_output_tokens_truncates() -> None:
    sim = engine(SimScript(text="many words " * 50))
    out: list[int] = []
    session = sim.session()
    async for batch in session.generate(request('{"input":"x"}').prompt(), Sampling(7)):
        out.extend(batch)
    assert out == sim.answer_ids[:7]


async def test_echo_answers_with_the_prompt_it_was_given() -> None:
    sim = engine(SimScript(echo=True))
    prompt = request('{"instructions":"Be brief.","input":"What is 2+2?"}').prompt()
    out = [i async for batch in sim.session().generate(prompt, SAMPLING) for i in batch]
    assert out == FORMAT.completion_tokens(text=FORMAT.tokenizer.decode(prompt.tokens()))
    assert "Be brief." in sim.decode(prompt) and "What is 2+2?" in sim.decode(prompt)


def test_from_config_reads_the_sim_options() -> None:
    config = ServerConfig(
        engine="sim",
        model="gpt-sim",
        sim_tokens_per_second=4000.0,
        sim_tool="f",
        sim_tool_calls=3,
        sim_tool_arguments='{"a":1}',
    )
    sim = from_config(config)
    assert sim.model == "gpt-sim" and sim.speed.tokens_per_second == 4000.0
    assert sim.script == SimScript(text="Done.", tool="f", tool_calls=3, tool_arguments='{"a":1}')
    assert sim.call_ids == sim.chat_format.completion_tokens(calls=[("f", '{"a":1}')])


def test_sim_format_smollm2_is_chatml_over_the_gguf_vocabulary() -> None:
    config = ServerConfig.from_env({"HOTLOOP_SIM_FORMAT": "smollm2"}, engine="sim")
    sim = from_config(config)
    fmt = sim.chat_format
    assert fmt.name == "chatml"
    assert fmt.tokenizer.name == Tokenizer.from_gguf(str(smollm2_gguf_path())).name
    # The sim is the format and vocabulary, not SmolLM2's 8k context.
    assert sim.context_window == from_config(ServerConfig(engine="sim")).context_window
    # Its answer parses back through the format's own parser.
    events, outcome = read_back(fmt, sim.answer_ids)
    assert outcome == "stopped"
    assert ("message_done", 0, "Done.") in events


def read_back(fmt: ChatFormat, ids: list[int]) -> tuple[list[Any], str]:
    """The sim's ids through a new conversation's parser: (events, outcome)."""
    conversation = Conversation(fmt, context_window=1 << 20)
    conversation.extend(parse_request('{"model":"sim","input":"go"}'))
    parser = conversation.parser()
    events = parser.feed(ids)
    tail, outcome, _ = parser.finish()
    return [*events, *tail], outcome


def test_sim_format_qwen3_speaks_qwen3s_template_and_tool_calls() -> None:
    config = ServerConfig(engine="sim", sim_format="qwen3", sim_tool="f", sim_tool_calls=1)
    sim = from_config(config)
    fmt = sim.chat_format
    assert (fmt.name, fmt.tool_parser) == ("template:qwen3", "hermes")
    assert fmt.tokenizer.vocab_size > 151_000  # Qwen3's vocabulary, not a stand-in
    events, outcome = read_back(fmt, sim.call_ids)
    assert outcome == "stopped"
    done = [e for e in events if e[0] == "call_done"]
    assert [(e[2], e[4]) for e in done] == [("f", "{}")]
    assert "<tool_call>" in fmt.tokenizer.decode(sim.call_ids)


def test_unknown_sim_format_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown sim format 'llama3'"):
        from_config(ServerConfig(engine="sim", sim_format="llama3"))


async def test_prefix_cache_holds_interleaved_conversations() -> None:
    sim = engine(SimScript(text="ok"))
    session = sim.session()
    lanes = [request('{"input":"lane a"}'), request('{"input":"lane b, other text"}')]
    prompts = [lane.prompt() for lane in lanes]
    sampled = [await generate_turn(session, lane) for lane in lanes]
    first = lanes[0]
    first.extend(parse_request('{"input":"more for a"}'))
    _, uncached = session.choose(first.prompt())
    # Lane b ran in between; lane a's sequence is still in the simulated cache.
    assert uncached == expected_uncached(first.prompt(), prompts[0], sampled[0])
    assert uncached < len(first.prompt()) - len(prompts[0])


async def test_a_salt_is_served_only_its_own_tenants_prefixes() -> None:
    """The engine-wide cache a fresh session (one HTTP request) falls back to holds each
    salt's sequences apart: a tenant sending another's instructions prefills them all,
    as if nobody had sent them, while a new session of the first tenant finds them."""
    sim = engine(SimScript(text="ok"))
    instructions = " ".join(f"rule {n}: check item {n} twice." for n in range(150))
    prompt = request(orjson.dumps({"instructions": instructions, "input": "go"}).decode())
    ids = prompt.prompt()
    await generate_turn(sim.session("tenant-a"), prompt)
    _, uncached = sim.session("tenant-b").choose(ids)
    assert uncached == len(ids)
    _, uncached = sim.session(None).choose(ids)
    assert uncached == len(ids)
    _, uncached = sim.session("tenant-a").choose(ids)
    assert uncached == 0
