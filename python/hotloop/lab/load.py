"""The concurrency driver: many agents, one WebSocket each, against one server.

Every agent replays a rollout from a different point (its first request carries the
history up to there, as an agent resuming a task would), then continues turn by turn
with only the new tool output. Agents start staggered over one tool time and think for
`tool_time` (with a fixed per-agent jitter) between turns. After a warm-up in which
every agent has finished its first turn, a measuring window of `window` seconds counts
the turns that end in it, their streamed tokens, their time to first token, and the
server's CPU time and resident memory. Everything is bounded: the window ends, agents
finish the turn they are in, stragglers are cancelled after a grace period.

This module owns the load pattern and its measurement; the server is started and
stopped by the caller (`hotloop bench load`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from websockets.exceptions import WebSocketException

from hotloop.lab.agent import BenchError, Reply, WebSocketTransport
from hotloop.lab.proc import ServerProcess
from hotloop.lab.report import percentile
from hotloop.lab.rollout import Rollout

# Turns still running this long after the window closes are cancelled.
GRACE_SECONDS = 30.0


@dataclass
class LoadPoint:
    """One load level's measurements."""

    agents: int
    workers: int
    window_s: float
    turns: int
    turns_per_s: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    server_cpu_cores: float
    client_cpu_cores: float
    rss_idle_mb: float
    rss_loaded_mb: float
    rss_per_connection_kb: float
    errors: int
    error_sample: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Window:
    opens_at: float = float("inf")
    closes_at: float = float("inf")
    ttfts: list[float] = field(default_factory=list)
    turns: int = 0
    tokens: int = 0
    errors: int = 0
    error_sample: str = ""


class LoadRun:
    """`agents` concurrent agents against `server` for one measuring window."""

    def __init__(
        self,
        server: ServerProcess,
        rollouts: list[Rollout],
        keys: tuple[str, ...],
        *,
        workers: int,
        window: float,
        tool_time: float,
        model: str,
        on_turn: Callable[[], None] = lambda: None,
    ) -> None:
        self.server = server
        self.rollouts = rollouts
        self.keys = keys  # one agent per key
        self.agents = len(keys)
        self.workers = workers
        self.window = window
        self.tool_time = tool_time
        self.model = model
        self.on_turn = on_turn
        self._stats = _Window()
        self._stop = asyncio.Event()
        self._first_turns = 0
        self._warm = asyncio.Event()

    def _first_request(self, rollout: Rollout, offset: int) -> dict[str, Any]:
        return {
            "model": self.model,
            "instructions": rollout.instructions,
            "tools": rollout.tools,
            "store": False,
            "input": rollout.history_items(offset),
        }

    async def _agent(self, index: int) -> None:
        rng = random.Random(index)
        rollout = self.rollouts[index % len(self.rollouts)]
        steps = len(rollout.steps)
        # Start somewhere in the first third: agents are at different points of a task.
        step = rng.randrange(max(1, steps // 3))
        think = self.tool_time * rng.uniform(0.5, 1.5)
        # Staggered arrival over one tool time (simulated arrival, not synchronisation).
        await asyncio.sleep(self.tool_time * index / self.agents)
        arrived = False
        try:
            transport = await WebSocketTransport.open(self.server.ws_url, self.keys[index])
        except (OSError, WebSocketException) as e:
            self._error(f"connect: {e}", arrived)
            return
        body = self._first_request(rollout, step)
        try:
            while not self._stop.is_set():
                sent = time.perf_counter()
                reply = await transport.create(body)
                if reply.terminal != "response.completed":
                    raise BenchError(f"{reply.terminal}: {str(reply.response)[:300]}")
                self._record(sent, reply.first_token_at or reply.done_at, reply)
                if not arrived:
                    arrived = True
                    self._arrive()
                output = reply.response.get("output") or []
                calls = [item for item in output if item["type"] == "function_call"]
                if not calls or step >= steps:
                    step = 0  # task done: the agent starts it again on the same socket
                    body = self._first_request(rollout, 0)
                    continue
                await asyncio.sleep(think)  # the tool runs on the client
                body = {
                    "model": self.model,
                    "instructions": rollout.instructions,
                    "tools": rollout.tools,
                    "store": False,
                    "previous_response_id": reply.response["id"],
                    "input": [rollout.tool_result(step, call_id=calls[0]["call_id"])],
                }
                step += 1
        except (BenchError, OSError, WebSocketException) as e:
            self._error(str(e), arrived)
        finally:
            await transport.close()

    def _arrive(self) -> None:
        self._first_turns += 1
        if self._first_turns == self.agents:
            self._warm.set()

    def _record(self, sent: float, first: float, reply: Reply) -> None:
        self.on_turn()
        stats = self._stats
        if stats.opens_at <= sent and reply.done_at <= stats.closes_at:
            stats.turns += 1
            stats.ttfts.append(first - sent)
            usage = reply.response.get("usage") or {}
            stats.tokens += int(usage.get("output_tokens", 0))

    def _error(self, message: str, arrived: bool) -> None:
        self._stats.errors += 1
        if not self._stats.error_sample:
            self._stats.error_sample = message
        if not arrived:
            self._arrive()  # one broken agent must not stall the others' warm-up

    async def run(self) -> LoadPoint:
        rss_idle = self.server.rss_bytes()
        tasks = [asyncio.create_task(self._agent(i)) for i in range(self.agents)]
        await self._warm.wait()
        stats = self._stats
        stats.opens_at = time.perf_counter()
        stats.closes_at = stats.opens_at + self.window
        cpu_start, client_start = self.server.cpu_ns(), time.process_time_ns()
        await asyncio.sleep(self.window)  # the measuring window itself
        cpu_end, client_end = self.server.cpu_ns(), time.process_time_ns()
        rss_loaded = self.server.rss_bytes()
        self._stop.set()
        _, pending = await asyncio.wait(tasks, timeout=GRACE_SECONDS)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return LoadPoint(
            agents=self.agents,
            workers=self.workers,
            window_s=self.window,
            turns=stats.turns,
            turns_per_s=stats.turns / self.window,
            tokens_per_s=stats.tokens / self.window,
            ttft_p50_ms=1e3 * percentile(stats.ttfts, 50),
            ttft_p99_ms=1e3 * percentile(stats.ttfts, 99),
            server_cpu_cores=(cpu_end - cpu_start) / 1e9 / self.window,
            client_cpu_cores=(client_end - client_start) / 1e9 / self.window,
            rss_idle_mb=rss_idle / 1e6,
            rss_loaded_mb=rss_loaded / 1e6,
            rss_per_connection_kb=(rss_loaded - rss_idle) / 1e3 / self.agents,
            errors=stats.errors,
            error_sample=stats.error_sample,
        )


def crossing(points: list[LoadPoint], threshold_ms: float = 50.0) -> float | None:
    """The agent count at which p99 time to first token first exceeds `threshold_ms`,
    interpolated linearly between the measured loads (None if it never does)."""
    previous: LoadPoint | None = None
    for point in sorted(points, key=lambda p: p.agents):
        if point.ttft_p99_ms > threshold_ms:
            if previous is None:
                return float(point.agents)
            span = point.ttft_p99_ms - previous.ttft_p99_ms
            share = (threshold_ms - previous.ttft_p99_ms) / span if span else 0.0
            return previous.agents + share * (point.agents - previous.agents)
        previous = point
    return None
