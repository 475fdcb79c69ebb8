"""Metrics and usage through their public API: counters, the histogram's cumulative
buckets, labels, per-key usage, and a Prometheus text exposition a parser accepts."""

from __future__ import annotations

import asyncio
import re
import time

from hotloop.metrics import LOOP_BUSY_BUCKETS, LOOP_LAG_BUCKETS, LoopBusy, Metrics
from hotloop.usage import ANONYMOUS, Usage

# One sample line of the text format: name{labels} value
SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_]+="[^"]*",?)*\})? -?[0-9.e+-]+$')


def samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert line.startswith(("# HELP ", "# TYPE ")), line
            continue
        assert SAMPLE.match(line), line
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def test_exposition_is_well_formed_and_counts() -> None:
    usage = Usage()
    metrics = Metrics(usage)
    metrics.connections.inc()
    metrics.connections_total.inc()
    metrics.turns.labels("http", "completed").inc()
    metrics.turns.labels("http", "completed").inc()
    metrics.turns.labels("websocket", "failed").inc()
    metrics.store_rebuilds.inc()
    metrics.record_prompt(prompt_tokens=1000, cached_tokens=900)
    metrics.turn_overhead.labels("http").observe(0.00025)
    metrics.turn_overhead.labels("http").observe(0.003)
    metrics.store_pending = lambda: 4
    metrics.cache_counts = lambda: (5, 2, 3)
    usage.record("key_abc", input_tokens=10, cached_tokens=4, output_tokens=5)
    metrics.stream_cpu.add(0.0005, 0.001, 40)
    metrics.stream_cpu.add(0.00025, 0.0005, 4)

    text = metrics.render()
    assert text.endswith("\n")
    got = samples(text)
    assert got["hotloop_connections"] == 1
    assert got['hotloop_turns_total{transport="http",outcome="completed"}'] == 2
    assert got['hotloop_turns_total{transport="websocket",outcome="failed"}'] == 1
    assert got["hotloop_cache_hits_total"] == 5
    assert got["hotloop_cache_misses_total"] == 2
    assert got["hotloop_store_rebuilds_total"] == 1
    assert got['hotloop_prompt_tokens_total{source="cache"}'] == 900
    assert got['hotloop_prompt_tokens_total{source="rendered"}'] == 100
    assert got["hotloop_store_pending"] == 4
    assert got["hotloop_cache_evictions_total"] == 3
    assert got['hotloop_usage_tokens_total{key="key_abc",kind="cached"}'] == 4
    assert got["hotloop_stream_sampled_cpu_seconds_total"] == 0.00075
    assert got["hotloop_stream_sampled_between_cpu_seconds_total"] == 0.0015
    assert got["hotloop_stream_sampled_tokens_total"] == 44

    # Buckets are cumulative and end at +Inf = count.
    assert got['hotloop_turn_overhead_seconds_bucket{transport="http",le="0.0002"}'] == 0
    assert got['hotloop_turn_overhead_seconds_bucket{transport="http",le="0.0003"}'] == 1
    assert got['hotloop_turn_overhead_seconds_bucket{transport="http",le="0.005"}'] == 2
    assert got['hotloop_turn_overhead_seconds_bucket{transport="http",le="+Inf"}'] == 2
    assert got['hotloop_turn_overhead_seconds_count{transport="http"}'] == 2


def test_every_family_has_one_help_and_type() -> None:
    text = Metrics(Usage()).render()
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(names) == len(set(names))
    assert len([line for line in text.splitlines() if line.startswith("# HELP")]) == len(names)


def test_label_values_are_escaped() -> None:
    usage = Usage()
    usage.record('we"ird\\key', input_tokens=1, cached_tokens=0, output_tokens=1)
    line = next(line for line in Metrics(usage).render().splitlines() if 'kind="input"' in line)
    assert line == 'hotloop_usage_tokens_total{key="we\\"ird\\\\key",kind="input"} 1'


def test_usage_totals_per_key() -> None:
    usage = Usage()
    usage.record("key_a", input_tokens=100, cached_tokens=80, output_tokens=7)
    usage.record("key_a", input_tokens=50, cached_tokens=50, output_tokens=3)
    usage.record(None, input_tokens=1, cached_tokens=0, output_tokens=1)
    assert usage.of("key_a").to_json() == {
        "responses": 2,
        "input_tokens": 150,
        "cached_tokens": 130,
        "output_tokens": 10,
        "total_tokens": 160,
    }
    assert usage.of(None).responses == 1
    assert set(usage.keys()) == {"key_a", ANONYMOUS}
    assert usage.of("key_unused").responses == 0


def test_loop_busy_counts_cpu_held_between_ticks() -> None:
    """A callback that keeps the loop's thread busy lands in one window of at least its
    own CPU time; idle windows hold almost none."""
    metrics = Metrics()
    watch = metrics.loop_watch

    async def run() -> None:
        watch.start()
        watch.tick()  # an idle window
        spin_until = time.thread_time() + 0.15
        while time.thread_time() < spin_until:
            pass
        watch.tick()  # the window of the busy callback
        watch.stop()

    asyncio.run(run())
    histogram = metrics.loop_busy.labels()
    assert histogram.count == 2
    assert histogram.counts[0] == 1  # the idle window: under 10 ms of CPU
    assert sum(histogram.counts[LOOP_BUSY_BUCKETS.index(0.1) + 1 :]) == 1  # the spin
    assert 'hotloop_event_loop_busy_seconds_bucket{le="0.1"} 1' in metrics.render()


def test_loop_lag_counts_a_callback_that_holds_the_loop() -> None:
    """A callback that holds the loop past the tick's due time makes the tick run at
    least that much late; the lag lands in the buckets above it."""
    metrics = Metrics()
    held = 3 * LoopBusy.INTERVAL

    async def run() -> None:
        metrics.loop_watch.start()
        hold_until = time.monotonic() + held
        while time.monotonic() < hold_until:
            pass  # this coroutine's step holds the loop: the tick cannot run
        await asyncio.sleep(2 * LoopBusy.INTERVAL)  # the late tick, then at least one more
        metrics.loop_watch.stop()

    asyncio.run(run())
    histogram = metrics.loop_lag.labels()
    # At least `held - INTERVAL` (0.1 s) late: above the 0.05 s bucket.
    assert sum(histogram.counts[LOOP_LAG_BUCKETS.index(0.05) + 1 :]) >= 1
    assert 'hotloop_event_loop_lag_seconds_bucket{le="+Inf"}' in metrics.render()
