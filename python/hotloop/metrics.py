"""Process metrics in the Prometheus text format (`GET /metrics`).

Owns the instruments the server updates (plain counters, gauges and one histogram; an
update is an attribute add on the event loop, no lock, no allocation) and their
rendering. It does not decide what is counted where: the protocol and transport
layers call the instruments; usage per API key is rendered from `Usage`.

Instruments (all names prefixed `hotloop_`):
- connections (gauge, open WebSockets) and connections_total
- turns_total{transport,outcome}
- cache_hits_total / cache_misses_total / cache_evictions_total: every cache (the
  sockets' and the HTTP ones), read from the shared budget when scraped
- store_rebuilds_total: misses answered by rebuilding a stored chain
- conversation_items_rendered_total: conversation items rendered from the store to
  start a turn on a conversation (those after the newest still-valid cached turn)
- prompt_tokens_total{source}: `cache` (served from the rendered-token cache) vs
  `rendered` (parsed, rendered and tokenized this turn)
- turn_overhead_seconds{transport}: server time from receiving a request to the first
  engine call
- store_writes_total, store_commits_total, store_pending, store_healthy
- store_errors_total{stage}: `commit` (a transaction failed: its responses failed with
  `store_unavailable`), `record` (a record that cannot be stored, quarantined), `booking`
  (usage or metrics of one finished response could not be booked)
- store_rerenders_total: stored outputs replayed from their text because the serving
  format's fingerprint differs from the one they were stored with
- stream_sampled_cpu_seconds_total / stream_sampled_tokens_total: the server's own CPU
  per streamed token, sampled (`StreamCpu`)
- refusals_total{code}: header_timeout, body_timeout, server_overloaded, too_many_connections,
  queue_memory_exceeded, background_limit; queued_request_bytes (gauge)
- event_loop_busy_seconds: the loop thread's CPU between ticks (`LoopBusy`)
- event_loop_lag_seconds: how late the same tick runs (`LoopBusy`): what any ready
  callback (a frame read, a token handed over) waits for the loop
- gc_pause_seconds{generation}: each collection of the garbage collector, which holds
  every thread that needs the GIL (`GcPauses`)
- heap_trim_seconds: each hand-back of the heap's free pages (`hotloop.heap.HeapTrim`)
- turn_phase_seconds{transport,phase}: where each turn's time to its first delta goes
  (`TurnPhases`, phases of `hotloop.turnclock`)
- usage_tokens_total{key,kind} from `Usage`
- node_info{node}: always 1, names the node (`hotloop serve --node-id`)
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hotloop.turnclock import TurnClock
    from hotloop.usage import Usage

# One line per turn at DEBUG: its phases, for a benchmark to join with its clients' times.
phases_log = logging.getLogger("hotloop.phases")

Labels = tuple[str, ...]

# 50 us .. 1 s: the per-turn budget is 0.3 ms, a stateless full-history turn can take
# hundreds of milliseconds.
OVERHEAD_BUCKETS = (
    0.00005,
    0.0001,
    0.0002,
    0.0003,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
)


LOOP_BUSY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# uvloop's timers have a resolution of 1 ms: finer buckets would measure the clock.
LOOP_LAG_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class Counter:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Gauge:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = value


class Histogram:
    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1


class Family:
    """One metric name with its labelled children, created on first use."""

    def __init__(
        self,
        name: str,
        kind: str,
        help_text: str,
        labels: Labels = (),
        make: Callable[[], Counter | Gauge | Histogram] = Counter,
    ) -> None:
        self.name = name
        self.kind = kind
        self.help = help_text
        self.label_names = labels
        self._make = make
        self.children: dict[Labels, Counter | Gauge | Histogram] = {}

    def _child(self, values: Labels) -> Counter | Gauge | Histogram:
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = self._make()
        return child

    def render(self) -> Iterator[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        for values, child in self.children.items():
            labels = ",".join(
                f'{k}="{_escape(v)}"' for k, v in zip(self.label_names, values, strict=True)
            )
            if isinstance(child, Histogram):
                yield from _histogram_lines(self.name, labels, child)
            else:
                yield (
                    f"{self.name}{{{labels}}} {_number(child.value)}"
                    if labels
                    else (f"{self.name} {_number(child.value)}")
                )


class CounterFamily(Family):
    def __init__(self, name: str, help_text: str, labels: Labels = ()) -> None:
        super().__init__(name, "counter", help_text, labels, Counter)

    def labels(self, *values: str) -> Counter:
        child = self._child(values)
        assert isinstance(child, Counter)
        return child


class HistogramFamily(Family):
    def __init__(self, name: str, help_text: str, labels: Labels, bounds: Sequence[float]) -> None:
        super().__init__(name, "histogram", help_text, labels, lambda: Histogram(bounds))

    def labels(self, *values: str) -> Histogram:
        child = self._child(values)
        assert isinstance(child, Histogram)
        return child


class StreamCpu:
    """The server's own CPU per streamed token over WebSocket, sampled: on every
    `EVERY`th engine batch of a response the socket reads its thread's CPU clock before
    handing the batch to the connection and after its frames are written (output
    parser, events, frames, the write syscall), and adds the difference and the
    batch's tokens here. Their ratio is the per-token cost the design's budget is about.

    It also adds the thread's CPU between the previous batch's frames written and this
    batch's arrival (`between_seconds`): the engine's hand-over, the event loop waking
    for the batch, and an in-process engine's own code (the sim's pacing). That share
    is the engine's; with other connections streaming it also holds their work. A
    sample taken while the client is behind can include other tasks' work too.

    Sampling keeps the clock reads (system calls) off most batches."""

    EVERY = 8

    def __init__(self) -> None:
        self.cpu_seconds = 0.0
        self.between_seconds = 0.0
        self.tokens = 0

    def add(self, cpu_seconds: float, between_seconds: float, tokens: int) -> None:
        self.cpu_seconds += cpu_seconds
        self.between_seconds += between_seconds
        self.tokens += tokens


class LoopBusy:
    """How long the event loop's thread runs without a break, and how late the loop
    runs what is ready. A tick every `INTERVAL` seconds reads the thread's CPU clock and
    records the CPU spent since the previous tick. While nothing holds the loop a window
    holds at most about `INTERVAL` of CPU; more is one callback (a parse, a render) that
    kept every other connection waiting. It counts CPU, not wall time, so a loaded
    machine does not make a stall of it.

    Each tick also records into `lag` how late it ran after its due time: wall time,
    what any callback that became ready meanwhile (a frame to read, a token to hand
    over) waited while another held the loop (a large write, a collection of the
    garbage collector), and on a loaded machine the wait for a core too. Due times are
    the loop's own clock (`loop.time()`, the one its timers use). One timer serves both:
    a second one, ticking faster, cost an idle server about 1% of a core."""

    INTERVAL = 0.05

    def __init__(self, histogram: Histogram, lag: Histogram | None = None) -> None:
        self.histogram = histogram
        self.lag = lag
        self._last = 0.0
        self._due = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Start ticking on the running loop (once)."""
        if self._timer is not None:
            return
        self._last = time.thread_time()
        self._schedule(asyncio.get_running_loop())

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        self._due = loop.time() + self.INTERVAL
        self._timer = loop.call_at(self._due, self.tick)

    def tick(self) -> None:
        now = time.thread_time()
        self.histogram.observe(now - self._last)
        self._last = now
        if self.lag is not None:
            # time.monotonic() is the clock asyncio's and uvloop's `time()` read.
            self.lag.observe(max(0.0, time.monotonic() - self._due))
        if self._timer is not None:
            self._timer.cancel()  # when called outside its timer: one chain of ticks only
            self._schedule(asyncio.get_running_loop())

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


GC_PAUSE_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5)


class GcPauses:
    """Every collection of the garbage collector, timed through `gc.callbacks` into a
    histogram per generation (wall time between its start and stop callbacks: the
    collection holds the GIL, so every connection waits that long)."""

    def __init__(self, family: HistogramFamily) -> None:
        self.family = family
        self._by_generation = [family.labels(str(g)) for g in range(3)]
        self._started = 0

    def start(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter_ns()
        if phase == "start":
            self._started = now
        elif self._started:
            self._by_generation[info["generation"]].observe((now - self._started) / 1e9)
            self._started = 0


class TurnPhases:
    """Each turn's phases up to its first delta (`hotloop.turnclock`), by transport: a
    histogram per phase, and at DEBUG one line per turn on `hotloop.phases`."""

    def __init__(self, family: HistogramFamily) -> None:
        self.family = family

    def record(self, transport: str, response_id: str, clock: TurnClock) -> None:
        """The turn's first delta was just written."""
        phases = clock.phases(time.perf_counter_ns())
        for name, seconds in phases.items():
            self.family.labels(transport, name).observe(seconds)
        if phases_log.isEnabledFor(logging.DEBUG):
            phases_log.debug(
                "response %s first delta: %s",
                response_id,
                " ".join(f"{name}={seconds * 1e3:.3f}ms" for name, seconds in phases.items()),
                extra={"response_id": response_id, "event": "response.phases"},
            )


class Metrics:
    """The process's instruments. One instance per process, shared by every transport."""

    def __init__(self, usage: Usage | None = None) -> None:
        self.usage = usage
        self.connections = Gauge()
        self.connections_total = Counter()
        self.turns = CounterFamily(
            "hotloop_turns_total",
            "Responses finished, by transport and outcome.",
            ("transport", "outcome"),
        )
        self.prompt_tokens = CounterFamily(
            "hotloop_prompt_tokens_total",
            "Prompt tokens by source: served from the cache or rendered this turn.",
            ("source",),
        )
        self.prompt_rewrites = CounterFamily(
            "hotloop_prompt_rewrites_total",
            "Turns whose prompt re-rendered earlier history, by chat format: the "
            "instructions or tools changed, or the model's chat template rendered earlier "
            "messages differently (Qwen3 dropping reasoning, a template moving the system "
            "prompt).",
            ("format",),
        )
        self.turn_overhead = HistogramFamily(
            "hotloop_turn_overhead_seconds",
            "Server time from receiving a request to the first engine call.",
            ("transport",),
            OVERHEAD_BUCKETS,
        )
        self.store_writes = Counter()
        self.store_commits = Counter()
        self.store_errors = CounterFamily(
            "hotloop_store_errors_total",
            "Finished responses whose storing or booking failed, by stage (commit: the"
            " transaction failed; record: quarantined; booking: usage not booked).",
            ("stage",),
        )
        for stage in ("commit", "record", "booking"):
            self.store_errors.labels(stage)  # rendered as 0 before the first failure
        self.store_pending: Callable[[], int] = lambda: 0
        self.store_healthy: Callable[[], bool] = lambda: True
        self.store_rerenders = Counter()
        # The caches count their own lookups and evictions (hits, misses, evictions);
        # read when scraped.
        self.cache_counts: Callable[[], tuple[int, int, int]] = lambda: (0, 0, 0)
        self.store_rebuilds = Counter()
        self.conversation_items_rendered = Counter()
        self.stream_cpu = StreamCpu()
        self.node: str | None = None
        """The node these metrics come from (`hotloop serve --node-id`)."""
        self.refusals = CounterFamily(
            "hotloop_refusals_total",
            "Connections and requests refused to bound what one client can take, by code.",
            ("code",),
        )
        self.queued_bytes: Callable[[], int] = lambda: 0
        """Request bytes held before their turn starts (`QueueMemory`), read when scraped."""
        self.loop_busy = HistogramFamily(
            "hotloop_event_loop_busy_seconds",
            "Event-loop thread CPU between ticks 50 ms apart; above 0.05 s, one callback "
            "held the loop (and every connection) that long.",
            (),
            LOOP_BUSY_BUCKETS,
        )
        self.loop_lag = HistogramFamily(
            "hotloop_event_loop_lag_seconds",
            "How late the event loop ran a timer due every 50 ms: what any ready callback "
            "(a frame to read, a token to hand over) waited for the loop.",
            (),
            LOOP_LAG_BUCKETS,
        )
        self.loop_watch = LoopBusy(self.loop_busy.labels(), self.loop_lag.labels())
        self.gc_pauses = GcPauses(
            HistogramFamily(
                "hotloop_gc_pause_seconds",
                "Each collection of the garbage collector (all threads wait), by generation.",
                ("generation",),
                GC_PAUSE_BUCKETS,
            )
        )
        self.heap_trims = HistogramFamily(
            "hotloop_heap_trim_seconds",
            "Each hand-back of the heap's free pages to the OS (--heap-trim-interval), "
            "in a worker thread; the allocator's locks are held meanwhile.",
            (),
            GC_PAUSE_BUCKETS,
        )
        self.turn_phases = TurnPhases(
            HistogramFamily(
                "hotloop_turn_phase_seconds",
                "Where each turn's time to its first delta went, by transport and phase "
                "(queued, prepare, upstream_write, upstream, handover, delta_out).",
                ("transport", "phase"),
                OVERHEAD_BUCKETS,
            )
        )

    def record_prompt(self, *, prompt_tokens: int, cached_tokens: int) -> None:
        """Account one turn's prompt: what came from the cache, what was rendered."""
        self.prompt_tokens.labels("cache").inc(cached_tokens)
        self.prompt_tokens.labels("rendered").inc(prompt_tokens - cached_tokens)

    def render(self) -> str:
        lines: list[str] = []
        if self.node is not None:
            lines += [
                "# HELP hotloop_node_info The node serving these metrics (--node-id).",
                "# TYPE hotloop_node_info gauge",
                f'hotloop_node_info{{node="{_escape(self.node)}"}} 1',
            ]
        lines += _scalar(
            "hotloop_connections", "gauge", "Open WebSocket connections.", self.connections.value
        )
        lines += _scalar(
            "hotloop_connections_total",
            "counter",
            "WebSocket connections accepted.",
            self.connections_total.value,
        )
        for family in (
            self.turns,
            self.prompt_tokens,
            self.prompt_rewrites,
            self.turn_overhead,
            self.store_errors,
            self.refusals,
            self.loop_busy,
            self.loop_lag,
            self.gc_pauses.family,
            self.heap_trims,
            self.turn_phases.family,
        ):
            lines.extend(family.render())
        lines += _scalar(
            "hotloop_queued_request_bytes",
            "gauge",
            "Request bytes received and not yet started, all connections.",
            self.queued_bytes(),
        )
        lines += _scalar(
            "hotloop_store_writes_total",
            "counter",
            "Stored responses committed.",
            self.store_writes.value,
        )
        lines += _scalar(
            "hotloop_store_commits_total",
            "counter",
            "Store transactions committed (each holds one or more responses).",
            self.store_commits.value,
        )
        lines += _scalar(
            "hotloop_store_pending",
            "gauge",
            "Stored responses queued, not yet committed.",
            self.store_pending(),
        )
        lines += _scalar(
            "hotloop_store_healthy",
            "gauge",
            "1 while the store commits, 0 after a failed commit until a write succeeds.",
            1 if self.store_healthy() else 0,
        )
        lines += _scalar(
            "hotloop_store_rerenders_total",
            "counter",
            "Stored outputs re-rendered from text: stored under another format fingerprint.",
            self.store_rerenders.value,
        )
        hits, misses, evictions = self.cache_counts()
        for name, help_text, value in (
            ("hits", "previous_response_id found in a rendered-token cache.", hits),
            ("misses", "previous_response_id not in the rendered-token cache.", misses),
            ("evictions", "Cached states dropped to stay within memory limits.", evictions),
        ):
            lines += _scalar(f"hotloop_cache_{name}_total", "counter", help_text, value)
        lines += _scalar(
            "hotloop_store_rebuilds_total",
            "counter",
            "Cache misses answered by rebuilding a stored chain.",
            self.store_rebuilds.value,
        )
        lines += _scalar(
            "hotloop_conversation_items_rendered_total",
            "counter",
            "Conversation items rendered from the store to start a turn on a conversation.",
            self.conversation_items_rendered.value,
        )
        lines += _scalar(
            "hotloop_stream_sampled_cpu_seconds_total",
            "counter",
            "Thread CPU of the sampled streaming batches (engine ids to frames written).",
            self.stream_cpu.cpu_seconds,
        )
        lines += _scalar(
            "hotloop_stream_sampled_between_cpu_seconds_total",
            "counter",
            "Thread CPU before each sampled batch since the previous batch's frames were"
            " written (the engine's hand-over).",
            self.stream_cpu.between_seconds,
        )
        lines += _scalar(
            "hotloop_stream_sampled_tokens_total",
            "counter",
            "Tokens of the sampled streaming batches.",
            self.stream_cpu.tokens,
        )
        if self.usage is not None:
            lines.extend(_usage_lines(self.usage))
        return "\n".join(lines) + "\n"


def _usage_lines(usage: Usage) -> Iterator[str]:
    name = "hotloop_usage_tokens_total"
    yield f"# HELP {name} Tokens used per API key id: input, cached (part of input), output."
    yield f"# TYPE {name} counter"
    for key, totals in usage.keys().items():
        for kind, value in (
            ("input", totals.input_tokens),
            ("cached", totals.cached_tokens),
            ("output", totals.output_tokens),
        ):
            yield f'{name}{{key="{_escape(key)}",kind="{kind}"}} {value}'


def _scalar(name: str, kind: str, help_text: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {_number(value)}"]


def _histogram_lines(name: str, labels: str, h: Histogram) -> Iterator[str]:
    sep = "," if labels else ""
    cumulative = 0
    for bound, count in zip(h.bounds, h.counts, strict=False):
        cumulative += count
        yield f'{name}_bucket{{{labels}{sep}le="{bound}"}} {cumulative}'
    yield f'{name}_bucket{{{labels}{sep}le="+Inf"}} {h.count}'
    suffix = f"{{{labels}}}" if labels else ""
    yield f"{name}_sum{suffix} {h.sum!r}"
    yield f"{name}_count{suffix} {h.count}"


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


__all__ = ["OVERHEAD_BUCKETS", "Counter", "Gauge", "Histogram", "Metrics", "TurnPhases"]
