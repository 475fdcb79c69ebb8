"""The arithmetic behind the figures of docs/benchmarks.md: the ideal, percentiles,
the 50 ms crossing."""

import pytest
from hotloop.lab.agent import AgentRun, Reply, TurnRecord, _observe
from hotloop.lab.load import LoadPoint, crossing
from hotloop.lab.report import (
    SimParameters,
    ideal_time,
    new_tokens,
    percentile,
    summarise,
    usage_of,
)


def _turn(index: int, input_tokens: int, output_tokens: int, ttft: float = 0.03) -> TurnRecord:
    return TurnRecord(
        index=index,
        ttft=ttft,
        latency=0.1,
        server_cpu_ns=1_000_000,
        input_tokens=input_tokens,
        cached_tokens=0,
        output_tokens=output_tokens,
        request_bytes=100,
        events=10,
        replayed=True,
    )


def test_new_tokens_are_what_extends_the_previous_prompt_and_output() -> None:
    turns = [_turn(0, 1000, 50), _turn(1, 1550, 40), _turn(2, 1590, 10)]
    assert new_tokens(turns) == [1000, 500, 0]


def test_ideal_is_inference_plus_tool_time() -> None:
    sim = SimParameters(tokens_per_second=100.0, ttft=0.02, prefill_tokens_per_second=10_000.0)
    turns = [_turn(0, 1000, 51), _turn(1, 2051, 11)]
    run = AgentRun("websocket", turns, wall=2.0, tool_time=0.5, client_cpu_ns=0, server_cpu_ns=0)
    # turn 0: 0.02 + 1000/10000 + 50/100; turn 1: 0.02 + 1000/10000 + 10/100; one tool run.
    assert ideal_time(run, sim) == pytest.approx(0.62 + 0.22 + 0.5)
    summary = summarise(run, sim)
    assert summary["ratio_to_ideal"] == pytest.approx(2.0 / 1.34)
    assert summary["server_cpu_per_turn_ms_median"] == pytest.approx(1.0)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values[:50], 99) == 50.0
    assert percentile([], 99) == 0.0


def _point(agents: int, p99: float) -> LoadPoint:
    return LoadPoint(
        agents=agents,
        workers=1,
        window_s=10.0,
        turns=100,
        turns_per_s=10.0,
        tokens_per_s=1000.0,
        ttft_p50_ms=p99 / 2,
        ttft_p99_ms=p99,
        server_cpu_cores=0.5,
        client_cpu_cores=0.5,
        rss_idle_mb=100.0,
        rss_loaded_mb=200.0,
        rss_per_connection_kb=100.0,
        errors=0,
    )


def test_crossing_interpolates_between_loads() -> None:
    points = [_point(100, 90.0), _point(10, 20.0), _point(50, 40.0)]
    assert crossing(points) == pytest.approx(50 + 0.2 * 50)
    assert crossing([_point(10, 60.0)]) == 10.0
    assert crossing([_point(10, 20.0)]) is None


def test_a_reply_times_its_first_and_last_token_not_its_terminal_event() -> None:
    reply = Reply()
    for kind in ("response.created", "response.output_text.delta", "response.output_text.delta"):
        assert not _observe(reply, {"type": kind})
    last = reply.last_token_at
    assert reply.first_token_at is not None and last is not None
    assert reply.first_token_at <= last
    assert _observe(reply, {"type": "response.completed", "response": {"id": "resp_a"}})
    assert reply.last_token_at == last
    assert reply.done_at >= last


def test_a_long_running_response_has_the_prefill_of_its_chains_turns_subtracted() -> None:
    """A long-running response reports usage once, at its end: its turns carry none, so
    the prefill of each turn's new tokens was not subtracted and its "added" time to
    first token was the whole prefill (125 ms of 130 at the median in f935583's run).
    The chain's turns, the same conversation, stand for its usage."""
    sim = SimParameters(tokens_per_second=100.0, ttft=0.02, prefill_tokens_per_second=10_000.0)
    chain = [_turn(0, 1000, 51, ttft=0.125), _turn(1, 2051, 11, ttft=0.126)]
    unreported = [_turn(0, 0, 0, ttft=0.125), _turn(1, 0, 0, ttft=0.126)]
    runs = {
        mode: AgentRun(mode, turns, wall=2.0, tool_time=0.5, client_cpu_ns=0, server_cpu_ns=0)
        for mode, turns in (("websocket", chain), ("long_running", unreported))
    }
    recorded = {mode: {"turns": [vars(t) for t in run.turns]} for mode, run in runs.items()}
    usage = usage_of(recorded, "long_running")
    assert usage == chain and usage_of(recorded, "websocket") is None
    long_running = summarise(runs["long_running"], sim, usage)
    assert long_running["added_ttft_p50_ms"] == pytest.approx(5.5)  # 5 and 6 ms
    assert long_running == {
        **summarise(runs["websocket"], sim),
        "mode": "long_running",
        "final_context_tokens": 0,
        "new_prompt_tokens_per_turn": 0.0,
    }
