"""Agents that outlive the nodes they talk to, and what they saw.

`Agent` runs one coding-agent conversation of `turns` `store=true` responses over
WebSocket mode through a load balancer: a user message, then the output of every
function call the model makes, until its final answer. Whenever its connection drops or
stalls (a node killed, hung or drained), or a response fails, it reconnects and sends
the same turn again from its last acknowledged response id, to whichever node the
balancer picks. It records only what a client can observe: every response it saw
complete (acknowledged), failures, retries, which node served each turn, and for every
retried turn when its first delta arrived.

`run_scenario` runs agents through a `hotloop.lab.cluster.Cluster` while it injects one kind
of fault at random moments (SIGKILL a node, hang it with SIGSTOP, drain it through
HAProxy's runtime API and SIGTERM; each node then rejoins), then reads every
acknowledged id back through the balancer and groups the prompts the simulated replicas
received (`hotloop.lab.replica`) by conversation, so a run with faults can be compared
with an undisturbed one. The fault tests assert on the `Outcome`;
`benches/bench_failover.py` reports it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from hotloop.lab.cluster import Cluster
from hotloop.lab.rollout import TOOLS

INSTRUCTIONS = "You are a coding agent. Fix the failing test, then say what you changed."
DELTAS = ("response.output_text.delta", "response.function_call_arguments.delta")
STALL_TIMEOUT = 2.0
"""Seconds an agent waits for the next event before it calls the node hung."""


@dataclass
class AgentResult:
    """What one agent observed (times are `time.monotonic()`)."""

    name: str
    session: str | None
    acknowledged: list[str] = field(default_factory=list)
    """Every response id it saw complete, in order."""
    keys: list[str] = field(default_factory=list)
    """The conversation's routing keys: its session header, or the ids of its
    first-turn attempts (one of which became the root of its chain)."""
    turns_done: int = 0
    final_text: str | None = None
    failed: list[str] = field(default_factory=list)
    """`response.failed` and `error` events, as `code: message`."""
    interruptions: list[float] = field(default_factory=list)
    """When a connection dropped or stalled in the middle of a turn."""
    resumed: list[tuple[float, float]] = field(default_factory=list)
    """For each retried turn: (when the retry was sent, its first delta)."""
    nodes: list[str] = field(default_factory=list)
    """The node (`x-hotloop-node`) that completed each turn."""
    lost_parent: bool = False
    """The balancer's nodes did not know the last acknowledged id."""


class _Interrupted(Exception):
    """The connection dropped or stalled before the turn completed."""


class Agent:
    """One conversation through the balancer at `url` (see the module docstring)."""

    def __init__(
        self,
        url: str,
        name: str,
        *,
        turns: int = 20,
        session: str | None = None,
        stall_timeout: float = STALL_TIMEOUT,
        max_attempts: int = 60,
        hops: Sequence[str] = (),
        tool_time: float = 0.0,
        output_bytes: int = 0,
    ) -> None:
        """`hops`: node URLs to rotate through, one new connection per turn, instead of
        `url` (every turn a node change, for measuring what one costs). `tool_time`:
        seconds the agent's tool runs before each function call's output is sent.
        `output_bytes`: each output is padded to about this size (a test log)."""
        self.hops = [_ws_url(hop) for hop in hops]
        self.ws_url = self.hops[0] if self.hops else _ws_url(url)
        self.turns = turns
        self.stall_timeout = stall_timeout
        self.tool_time = tool_time
        self.output_bytes = output_bytes
        self.max_attempts = max_attempts
        self.result = AgentResult(name, session)
        if session is not None:
            self.result.keys.append(session)
        self._ws: ClientConnection | None = None
        self._node = "?"

    async def run(self) -> AgentResult:
        result = self.result
        items: list[dict[str, Any]] = [
            {"role": "user", "content": f"{result.name}: the test suite fails, fix it."}
        ]
        try:
            while result.turns_done < self.turns and not result.lost_parent:
                response = await self._turn(items)
                if response is None:
                    break
                items = self._next_items(response)
                if items and self.tool_time:
                    # The agent runs its tool: the connection is idle meanwhile.
                    await asyncio.sleep(self.tool_time)
        finally:
            await self._disconnect()
        return result

    def _next_items(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        result = self.result
        calls = [item for item in response["output"] if item["type"] == "function_call"]
        texts = [
            part["text"]
            for item in response["output"]
            if item["type"] == "message"
            for part in item["content"]
        ]
        if texts:
            result.final_text = "".join(texts)
        output = f"{result.name} turn {result.turns_done}: 3 passed, 1 failed\n"
        line = f"test_case_{result.turns_done} ... ok\n"
        output += line * max(0, (self.output_bytes - len(output)) // len(line))
        return [
            {"type": "function_call_output", "call_id": call["call_id"], "output": output}
            for call in calls
        ]

    async def _turn(self, items: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Send one turn until it completes; None when the agent gives up."""
        result = self.result
        request = {
            "type": "response.create",
            "model": "sim",
            "input": items,
            "store": True,
            "tools": TOOLS,
            "instructions": INSTRUCTIONS,
        }
        if result.acknowledged:
            request["previous_response_id"] = result.acknowledged[-1]
        frame = orjson.dumps(request).decode()
        retry = False
        for attempt in range(self.max_attempts):
            if attempt:
                # A client's backoff between reconnects, not synchronisation.
                await asyncio.sleep(min(0.05 * attempt, 0.5))
            try:
                response = await self._attempt(frame, retry)
            except _Interrupted:
                result.interruptions.append(time.monotonic())
                await self._disconnect()
                retry = True
                continue
            if response is None:
                if result.lost_parent:
                    return None
                retry = True  # failed: sent again, on a new connection
                await self._disconnect()
                continue
            result.acknowledged.append(response["id"])
            result.nodes.append(self._node)
            result.turns_done += 1
            if self.hops:
                await self._disconnect()
                self.ws_url = self.hops[result.turns_done % len(self.hops)]
            return response
        return None

    async def _attempt(self, frame: str, retry: bool) -> dict[str, Any] | None:
        ws = await self._connect()
        sent = time.monotonic()
        try:
            await ws.send(frame)
            first_delta = True
            while True:
                try:
                    text = await asyncio.wait_for(ws.recv(), self.stall_timeout)
                except asyncio.TimeoutError as e:
                    raise _Interrupted from e
                event = orjson.loads(text)
                kind = event["type"]
                if kind == "response.created" and not self.result.acknowledged:
                    self.result.keys.append(event["response"]["id"])
                elif kind in DELTAS and first_delta:
                    first_delta = False
                    if retry:
                        self.result.resumed.append((sent, time.monotonic()))
                elif kind == "response.completed":
                    response: dict[str, Any] = event["response"]
                    return response
                elif kind == "response.failed":
                    error = event["response"].get("error") or {}
                    self.result.failed.append(f"{error.get('code')}: {error.get('message')}")
                    return None
                elif kind == "error":
                    error = event["error"]
                    self.result.failed.append(f"{error.get('code')}: {error.get('message')}")
                    if error.get("code") == "previous_response_not_found":
                        self.result.lost_parent = True
                    return None
        except (ConnectionClosed, OSError) as e:
            raise _Interrupted from e

    async def _connect(self) -> ClientConnection:
        if self._ws is not None:
            return self._ws
        headers = {} if self.result.session is None else {"session_id": self.result.session}
        try:
            ws = await asyncio.wait_for(
                connect(self.ws_url, additional_headers=headers, max_size=None),
                self.stall_timeout,
            )
        except (asyncio.TimeoutError, OSError, InvalidHandshake, InvalidStatus) as e:
            raise _Interrupted from e
        self._ws = ws
        assert ws.response is not None
        self._node = ws.response.headers.get("x-hotloop-node", "?")
        return ws

    async def _disconnect(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            # Do not wait for a closing handshake a hung node will never answer.
            ws.transport.abort()
            await ws.close()


def _ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/responses"


async def run_agents(url: str, names: Sequence[str], tag: str, **options: Any) -> list[AgentResult]:
    """Run one agent per name concurrently. Every other one sends a session header
    (`TAG-NAME`), so both routing keys, session and root id, are exercised; the others
    are named by their chain's root. Agents of the same name send the same items in
    every run, so their prompts can be compared across runs."""
    agents = [
        Agent(url, name, session=f"{tag}-{name}" if i % 2 == 0 else None, **options)
        for i, name in enumerate(names)
    ]
    return list(await asyncio.gather(*(agent.run() for agent in agents)))


async def check_acknowledged(url: str, results: Sequence[AgentResult]) -> list[str]:
    """The acknowledged ids that cannot be read back through the balancer (the lost)."""
    lost = []
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as http:
        for result in results:
            for response_id in result.acknowledged:
                reply = await http.get(f"/v1/responses/{response_id}")
                if reply.status_code != 200:
                    lost.append(response_id)
    return lost


async def replica_prompts(replica_urls: Sequence[str]) -> list[dict[str, Any]]:
    """Every prompt record of the simulated replicas, in arrival order."""
    records: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=30.0) as http:
        for url in replica_urls:
            reply = await http.get(f"{url}/prompts")
            reply.raise_for_status()
            records += [{**record, "replica": url} for record in reply.json()]
    return sorted(records, key=lambda r: r["at"])


def prompt_sequences(
    records: Sequence[dict[str, Any]], results: Sequence[AgentResult], owner: dict[str, str]
) -> dict[str, list[str]]:
    """Per agent, the distinct prompt hashes its conversation sent to the replicas, in
    order of first appearance (a retried turn sends the same prompt again, which is
    counted once; a retried turn rendered differently adds a hash). `records` are the
    run's, `owner` names the agent of each routing key: the run's own, and those of
    earlier runs on the cluster, since an agent that resends the items an agent of its
    name sent before continues that one's rendered state on a node that still holds it,
    and its routing key with it (docs/protocol.md, "Whole history")."""
    sequences: dict[str, list[str]] = {result.name: [] for result in results}
    for record in records:
        name = owner.get(record["session"])
        if name is not None and record["hash"] not in sequences[name]:
            sequences[name].append(record["hash"])
    return sequences


FAULTS = ("none", "kill", "hang", "drain", "store")


class StoreServer(Protocol):
    """The shared store's database server, for the `store` fault (an outage)."""

    def stop(self) -> None: ...

    def start(self) -> None: ...


@dataclass
class Outcome:
    """One scenario: what the agents saw and what was checked afterwards."""

    fault: str
    results: list[AgentResult]
    lost: list[str]
    """Acknowledged ids that could not be read back."""
    sequences: dict[str, list[str]]
    """Per agent name, its conversation's distinct prompt hashes, in order."""
    faults_at: list[float] = field(default_factory=list)
    detection: list[float] = field(default_factory=list)
    """Seconds HAProxy's health checks took to take a hung node out."""

    @property
    def failed(self) -> list[str]:
        return [failure for result in self.results for failure in result.failed]

    @property
    def failover(self) -> list[float]:
        """Seconds from each fault to the first delta of a turn retried after it."""
        times = []
        for result in self.results:
            for sent, first_delta in result.resumed:
                before = [at for at in self.faults_at if at <= sent]
                if before:
                    times.append(first_delta - before[-1])
        return times


async def run_scenario(
    cluster: Cluster,
    fault: str,
    *,
    tag: str,
    agents: int = 6,
    faults: int = 3,
    seed: int = 0,
    store: StoreServer | None = None,
    **options: Any,
) -> Outcome:
    """`agents` conversations through `cluster` while `faults` faults of one kind hit
    random nodes at random moments (see the module docstring); the `store` fault stops
    the `store` server for a while instead, `faults` times."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r} (known: {', '.join(FAULTS)})")
    names = [f"agent{i}" for i in range(agents)]
    started = time.time()
    run = asyncio.ensure_future(run_agents(cluster.url, names, tag, **options))
    outcome = Outcome(fault, [], [], {})
    if fault == "store":
        if store is None:
            raise ValueError("the store fault needs the store's server")
        await _outages(store, run, faults, random.Random(seed), outcome)
    elif fault != "none":
        # Hung for longer than an agent waits for an event.
        hang_for = options.get("stall_timeout", STALL_TIMEOUT) + 1.0
        await _inject(cluster, fault, run, faults, random.Random(seed), outcome, hang_for)
    outcome.results = await run
    outcome.lost = await check_acknowledged(cluster.url, outcome.results)
    records = [r for r in await replica_prompts(cluster.replica_urls) if r["at"] >= started]
    cluster.route_keys.update((key, r.name) for r in outcome.results for key in r.keys)
    outcome.sequences = prompt_sequences(records, outcome.results, cluster.route_keys)
    return outcome


async def _outages(
    store: StoreServer,
    run: asyncio.Future[list[AgentResult]],
    count: int,
    rng: random.Random,
    outcome: Outcome,
) -> None:
    """Stop the store's server at random moments for 6-7 s each: longer than a node
    waits for a database connection (5 s), so commits fail instead of waiting it out."""
    for _ in range(count):
        await asyncio.wait([run], timeout=rng.uniform(0.2, 0.7))
        if run.done():
            return
        outcome.faults_at.append(time.monotonic())
        await asyncio.to_thread(store.stop)
        await asyncio.wait([run], timeout=rng.uniform(6.0, 7.0))
        await asyncio.to_thread(store.start)


async def _inject(
    cluster: Cluster,
    fault: str,
    run: asyncio.Future[list[AgentResult]],
    count: int,
    rng: random.Random,
    outcome: Outcome,
    hang_for: float,
) -> None:
    """`count` faults at random moments while the agents run, each on a node that is
    not already down; one node always stays up. A faulted node rejoins on its own
    while the next fault may already hit another one."""
    cycles: list[asyncio.Task[None]] = []
    down: set[str] = set()
    for _ in range(count):
        # A random moment while the agents run (fault timing, not synchronisation).
        await asyncio.wait([run], timeout=rng.uniform(0.2, 0.7))
        candidates = sorted(set(cluster.nodes) - down)
        if run.done() or len(candidates) < 2:
            break
        name = rng.choice(candidates)
        down.add(name)
        outcome.faults_at.append(time.monotonic())
        cycles.append(
            asyncio.create_task(
                _fault_cycle(cluster, fault, name, run, rng.uniform(0.2, 0.8), outcome, hang_for)
            )
        )
        cycles[-1].add_done_callback(partial(_rejoined, down, name))
    await asyncio.gather(*cycles)


def _rejoined(down: set[str], name: str, cycle: asyncio.Task[None]) -> None:
    down.discard(name)


async def _fault_cycle(
    cluster: Cluster,
    fault: str,
    name: str,
    run: asyncio.Future[list[AgentResult]],
    downtime: float,
    outcome: Outcome,
    hang_for: float,
) -> None:
    """One fault on `name`, then its return to service."""
    haproxy = cluster.haproxy
    node = cluster.nodes[name]
    if fault == "kill":
        node.kill()
        await asyncio.wait([run], timeout=downtime)
    elif fault == "hang":
        node.pause()
        outcome.detection.append(await asyncio.to_thread(haproxy.wait_operational, name, False))
        # Hung for longer than the clients wait for an event, so they give up on it.
        await asyncio.wait([run], timeout=hang_for)
        node.resume()
    else:
        haproxy.set_state(name, "drain")
        await asyncio.to_thread(node.stop)
    if not node.running:
        # The node rejoins on its port.
        await asyncio.to_thread(node.start)
    if fault == "drain":
        haproxy.set_state(name, "ready")
    # HAProxy routes to it again once its health checks pass.
    await asyncio.to_thread(haproxy.wait_operational, name, True)
