"""Many agents, one gateway: the capacity benchmark's workload and its agents
(`benches/bench_capacity.py` starts the processes and sweeps).

The workload is coding-agent sessions of the shape the field measures (docs/workloads.md;
docs/benchmarks-capacity.md, "Capacity", says where each figure comes from). Every number is
drawn from a seeded generator, so a run is reproducible; each distribution is a
log-normal cut to a range (`Shape`):

- `CONTEXTS`: an agent's context at its first request (it resumes a task in the middle):
  `agentx` (the default) is SemiAnalysis AgentX's corpus of Claude Code sessions (median
  input ~105k tokens, ~70% at most 131k), cut at 131k; `agentperf` is Artificial Analysis
  AgentPerf's (5k-131k tokens, mean ~27k).
- `TOOL_OUTPUT`: the tokens of each tool's output; with the model's own output of the
  turn before, about 700 new tokens a turn at the median (AgentX).
- `OUTPUT`: the model's tokens a turn (reasoning and the call): median 180 (AgentPerf
  ~150, AgentX ~216), a long tail (AgentPerf's p95 ~2k).
- `THINK`: seconds between a response and the agent's next request (the tool runs,
  the harness thinks): median 10 s (AgentX); a sweep runs them scaled down
  (`think_scale`), so that a few dozen agents load a gateway as hundreds would.

The text is real (`hotloop.lab.rollout`: the standard library's code, its tests, diffs),
cut to each drawn token count with the harmony tokenizer. One fake upstream serves every
agent one script (`Workload.script`): its turn k (the k-th call of a conversation) is a
reasoning and an `exec_command` call of `OUTPUT`'s size; an agent's history up to its
first request holds the same turns, with its own tool outputs, as if the fake had
answered them.

`CapacityRun` drives N agents against one system in one client mode: `websocket` (one
socket, `previous_response_id` and the new tool output each turn, `store: false`) or
`http_full` (the whole history every turn, as most harnesses send it). After every agent
has had its first (large) turn answered, a window of `window` seconds measures the turns
sent and answered in it: time to first delta, turns/s, the client's own CPU and event
loop lag (a saturated client measures itself, not the gateway).

This module owns the workload and the client side; it starts no process.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

import orjson

from hotloop._core import ChatFormat
from hotloop.lab.report import percentile
from hotloop.lab.rollout import INSTRUCTIONS, TOOLS, build_rollout
from hotloop.lab.thin_client import (
    SseConnection,
    Turn,
    WebSocketConnection,
    WireError,
    open_sse,
    open_websocket,
)

# Turns still running this long after the window closes are cancelled.
GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class Shape:
    """A log-normal of `median` and `sigma` (of the log), cut to [`low`, `high`]."""

    median: float
    sigma: float
    low: float
    high: float

    def draw(self, rng: random.Random) -> float:
        value = self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0))
        return min(self.high, max(self.low, value))

    def mean(self, samples: int = 20_000) -> float:
        """The mean of the cut distribution, by sampling (seeded)."""
        rng = random.Random(0)
        return statistics.fmean(self.draw(rng) for _ in range(samples))


CONTEXTS = {
    "agentx": Shape(90_000, 0.35, 5_000, 131_072),
    "agentperf": Shape(20_000, 0.8, 5_000, 131_072),
}
TOOL_OUTPUT = Shape(450, 1.0, 16, 8_000)
OUTPUT = Shape(180, 1.46, 16, 4_000)
THINK = Shape(10.0, 1.0, 0.5, 120.0)
CALL = "exec_command"


@dataclass(frozen=True)
class ScriptTurn:
    """The fake's turn k: what the model says before its k-th call, and the call."""

    reasoning: str
    arguments: str
    tokens: int
    """Sampled tokens of the turn (reasoning, call and the format's own)."""


class Workload:
    """The sessions of `agents` agents and the fake's script, from `seed`."""

    def __init__(self, seed: int, contexts: str = "agentx", turns: int = 600) -> None:
        self.seed = seed
        self.contexts = CONTEXTS[contexts]
        self.format = ChatFormat.harmony()
        tokenizer = self.format.tokenizer
        rollout = build_rollout(seed, tool_calls=60)
        self._pool = tokenizer.encode("\n".join(step.output for step in rollout.steps))
        thoughts = " ".join(step.reasoning for step in rollout.steps)
        self._thoughts = tokenizer.encode(thoughts)
        commands = [orjson.loads(step.call.arguments).get("cmd", "ls") for step in rollout.steps]
        rng = random.Random(f"script-{seed}")
        self.script: list[ScriptTurn] = []
        for index in range(turns):
            arguments = orjson.dumps({"cmd": commands[index % len(commands)]}).decode()
            call = self.format.completion_tokens(calls=[(CALL, arguments)])
            size = max(1, int(OUTPUT.draw(rng)) - len(call))
            start = rng.randrange(len(self._thoughts) - size) if size < len(self._thoughts) else 0
            reasoning = tokenizer.decode(self._thoughts[start : start + size])
            said = self.format.completion_tokens(reasoning=reasoning, calls=[(CALL, arguments)])
            self.script.append(ScriptTurn(reasoning, arguments, len(said)))
        self.prefix_tokens = len(tokenizer.encode(INSTRUCTIONS + orjson.dumps(TOOLS).decode()))

    def script_json(self) -> dict[str, Any]:
        """The fake vLLM's replay script (`hotloop.lab.fake_vllm --script`); past its
        last turn the fake answers with text, which ends an agent's session."""
        turns: list[dict[str, Any]] = [
            {"reasoning": t.reasoning, "calls": [[CALL, t.arguments]]} for t in self.script
        ]
        return {"turns": [*turns, {"text": "Done: every test passes."}]}

    def text(self, rng: random.Random, tokens: int) -> str:
        """`tokens` tokens of real tool output, from a place `rng` chooses."""
        pool = self._pool
        tokens = min(tokens, len(pool))
        start = rng.randrange(len(pool) - tokens + 1)
        return self.format.tokenizer.decode(pool[start : start + tokens])

    def session(self, agent: int) -> Session:
        return Session(self, agent)


class Session:
    """One agent's coding session: its task, its tool outputs, where it starts."""

    def __init__(self, workload: Workload, agent: int) -> None:
        self.workload = workload
        self.agent = agent
        rng = random.Random(f"session-{workload.seed}-{agent}")
        self.task = (
            f"Agent {agent}: the test suite fails after the last refactor; find why, fix it, "
            "and keep every test green."
        )
        self.think_rng = random.Random(f"think-{workload.seed}-{agent}")
        self._outputs: dict[int, str] = {}
        self._output_tokens: dict[int, int] = {}
        target = workload.contexts.draw(rng)
        context = workload.prefix_tokens + 40
        step = 0
        while context < target and step < len(workload.script) - 1:
            context += workload.script[step].tokens + self.output_tokens(step) + 8
            step += 1
        self.start = step
        self._context_at = {step: context}

    def output_tokens(self, step: int) -> int:
        if step not in self._output_tokens:
            rng = random.Random(f"tool-{self.workload.seed}-{self.agent}-{step}")
            self._output_tokens[step] = int(TOOL_OUTPUT.draw(rng))
        return self._output_tokens[step]

    def output(self, step: int) -> str:
        """The tool's output answering the call of `step`."""
        if step not in self._outputs:
            rng = random.Random(f"text-{self.workload.seed}-{self.agent}-{step}")
            self._outputs[step] = self.workload.text(rng, self.output_tokens(step))
        return self._outputs[step]

    def context(self, step: int) -> int:
        """The tokens of the conversation at the request of `step` (estimated from the
        parts' own token counts)."""
        known = max(s for s in self._context_at if s <= step)
        context = self._context_at[known]
        for s in range(known, step):
            context += self.workload.script[s].tokens + self.output_tokens(s) + 8
        self._context_at[step] = context
        return context

    def think(self, scale: float) -> float:
        return THINK.draw(self.think_rng) * scale

    def history(self) -> list[dict[str, Any]]:
        """The conversation before its first request: the task, then each earlier turn's
        reasoning and call (the fake's script) and the tool's output."""
        items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": self.task}]
        for step in range(self.start):
            turn = self.workload.script[step]
            call_id = f"call_{self.agent}_{step}"
            items += [
                {
                    "type": "reasoning",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": turn.reasoning}],
                },
                {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": CALL,
                    "arguments": turn.arguments,
                },
                {"type": "function_call_output", "call_id": call_id, "output": self.output(step)},
            ]
        return items

    def release(self, step: int) -> None:
        """Forget the outputs before `step` (sent already)."""
        for s in [s for s in self._outputs if s < step]:
            del self._outputs[s]


@dataclass
class Target:
    """Where the agents' clients connect: a system in one client mode."""

    system: str
    mode: str  # "websocket" | "http_full"
    base_url: str
    """`http://host:port/v1`"""
    ws_url: str
    api_key: str | None
    model: str


@dataclass
class Point:
    """One (system, mode, number of agents) measurement, the client's side."""

    system: str
    mode: str
    agents: int
    window_s: float
    turns: int
    turns_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    ttft_max_ms: float
    turn_mean_s: float
    context_mean_tokens: float
    context_max_tokens: int
    client_cpu_cores: float
    client_lag_p99_ms: float
    errors: int
    error_sample: str = ""
    server: dict[str, Any] = field(default_factory=dict)
    """What the caller measured of the processes (CPU, memory, metrics)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Window:
    opens_at: float = float("inf")
    closes_at: float = float("inf")
    ttfts: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    contexts: list[int] = field(default_factory=list)
    errors: int = 0
    error_sample: str = ""


class CapacityRun:
    """`len(sessions)` agents against `target` for one measuring window."""

    def __init__(
        self,
        target: Target,
        sessions: list[Session],
        *,
        window: float,
        think_scale: float,
        on_window: Callable[[bool], None] = lambda opening: None,
        on_turn: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.target = target
        self.sessions = sessions
        self.window = window
        self.think_scale = think_scale
        self.on_window = on_window
        """Called as the window opens (True) and closes (False), in a thread: the
        caller's readings of the processes."""
        self.on_turn = on_turn
        """Given every turn's times (`time.perf_counter`, the clock the server's phases
        use), its response id and context, when the caller keeps them (profiling)."""
        self._stats = _Window()
        self._stop = asyncio.Event()
        self._arrived = 0
        self._warm = asyncio.Event()
        self._lags: list[float] = []

    @cached_property
    def _fields(self) -> dict[str, Any]:
        return {
            "model": self.target.model,
            "instructions": INSTRUCTIONS,
            "tools": TOOLS,
            "store": False,
        }

    async def _connect(self) -> SseConnection | WebSocketConnection:
        if self.target.mode == "websocket":
            return await open_websocket(self.target.ws_url, self.target.api_key)
        return await open_sse(self.target.base_url, self.target.api_key)

    async def _agent(self, index: int) -> None:
        session = self.sessions[index]
        # Arrivals spread over one median think time (simulated arrival, not a wait).
        await asyncio.sleep(THINK.median * self.think_scale * index / len(self.sessions))
        arrived = False
        connection: SseConnection | WebSocketConnection | None = None
        try:
            connection = await self._connect()
            step = session.start
            history = session.history()
            body: dict[str, Any] = {**self._fields, "input": history}
            while not self._stop.is_set():
                if connection.closed:
                    # An idle keep-alive connection the server closed (a long think).
                    connection = await self._connect()
                turn = await self._send(connection, body)
                if turn.terminal != "response.completed":
                    raise WireError(f"{turn.terminal}: {str(turn.response)[:300]}")
                self._record(turn, session.context(step))
                if not arrived:
                    arrived = True
                    self._arrive()
                output = turn.response.get("output") or []
                calls = [item for item in output if item.get("type") == "function_call"]
                if not calls:
                    break  # past the script's end: the session is over
                await asyncio.sleep(session.think(self.think_scale))  # the tool runs
                result = {
                    "type": "function_call_output",
                    "call_id": calls[0]["call_id"],
                    "output": session.output(step),
                }
                if self.target.mode == "http_full":
                    # A stateless client replays the model's output items verbatim.
                    history += [*output, result]
                    body = {**self._fields, "input": history}
                else:
                    body = {
                        **self._fields,
                        "previous_response_id": turn.response["id"],
                        "input": [result],
                    }
                step += 1
                session.release(step)
        except (WireError, OSError) as e:
            self._error(f"{type(e).__name__}: {e}", arrived)
        finally:
            if connection is not None:
                connection.close()

    async def _send(
        self, connection: SseConnection | WebSocketConnection, body: dict[str, Any]
    ) -> Turn:
        if isinstance(connection, WebSocketConnection):
            return await connection.send(orjson.dumps({"type": "response.create", **body}))
        return await connection.post(orjson.dumps({**body, "stream": True}))

    def _arrive(self) -> None:
        self._arrived += 1
        if self._arrived == len(self.sessions):
            self._warm.set()

    def _record(self, turn: Turn, context: int) -> None:
        stats = self._stats
        inside = stats.opens_at <= turn.sent_at and turn.done_at <= stats.closes_at
        if self.on_turn is not None:
            self.on_turn(
                {
                    "response_id": turn.response.get("id"),
                    "sent_at": turn.sent_at,
                    "first_delta_at": turn.first_delta_at,
                    "done_at": turn.done_at,
                    "context": context,
                    "in_window": inside,
                }
            )
        if inside:
            stats.ttfts.append((turn.first_delta_at or turn.done_at) - turn.sent_at)
            stats.latencies.append(turn.done_at - turn.sent_at)
            stats.contexts.append(context)

    def _error(self, message: str, arrived: bool) -> None:
        self._stats.errors += 1
        if not self._stats.error_sample:
            self._stats.error_sample = message
        if not arrived:
            self._arrive()  # one broken agent must not stall the others' warm-up

    async def _watch_lag(self) -> None:
        """The client's own event-loop lag: a saturated client delays every reading."""
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            due = loop.time() + 0.01
            await asyncio.sleep(0.01)
            self._lags.append(max(0.0, time.monotonic() - due))

    async def run(self) -> Point:
        tasks = [asyncio.create_task(self._agent(i)) for i in range(len(self.sessions))]
        await self._warm.wait()
        stats = self._stats
        await asyncio.to_thread(self.on_window, True)
        lags = asyncio.create_task(self._watch_lag())
        stats.opens_at = time.perf_counter()
        stats.closes_at = stats.opens_at + self.window
        client_start = time.process_time_ns()
        await asyncio.sleep(self.window)  # the measuring window itself
        client_cpu = (time.process_time_ns() - client_start) / 1e9
        await asyncio.to_thread(self.on_window, False)
        self._stop.set()
        _, pending = await asyncio.wait([*tasks, lags], timeout=GRACE_SECONDS)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        ttfts = stats.ttfts or [float("nan")]
        return Point(
            system=self.target.system,
            mode=self.target.mode,
            agents=len(self.sessions),
            window_s=self.window,
            turns=len(stats.ttfts),
            turns_per_s=len(stats.ttfts) / self.window,
            ttft_p50_ms=1e3 * percentile(ttfts, 50),
            ttft_p99_ms=1e3 * percentile(ttfts, 99),
            ttft_max_ms=1e3 * max(ttfts),
            turn_mean_s=statistics.fmean(stats.latencies) if stats.latencies else 0.0,
            context_mean_tokens=statistics.fmean(stats.contexts) if stats.contexts else 0.0,
            context_max_tokens=max(stats.contexts, default=0),
            client_cpu_cores=client_cpu / self.window,
            client_lag_p99_ms=1e3 * percentile(self._lags or [0.0], 99),
            errors=stats.errors,
            error_sample=stats.error_sample,
        )
