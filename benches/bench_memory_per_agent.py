"""What one WebSocket agent at ~100k tokens costs in memory, and where it goes
(issue 36 part 4; docs/benchmarks-capacity.md, "Memory per agent"):

    .venv/bin/python benches/bench_memory_per_agent.py [--agents 8] [--turns 3]

hotloop runs in this process (uvicorn on this event loop, uvloop's as `hotloop serve`
runs, in front of the fake vLLM, `hotloop.lab.fake_vllm`, in a subprocess); `--agents`
agents of the capacity benchmark's sessions (`hotloop.lab.capacity`, contexts of
AgentX's shape) each open a socket, send their history, then `--turns - 1` tool outputs
with `previous_response_id`, and stay connected. Measured, per agent: the process's
resident memory grown since before the first request (`rss_per_agent_mb`), the same
after glibc handed the heap's free pages back (`malloc_trim`, what
`--heap-trim-interval` does: `rss_per_agent_trimmed_mb`), the C allocator's blocks in
use and free in its heap (`malloc_in_use_per_agent_mb`, `malloc_free_per_agent_mb`:
glibc's `mallinfo2`, before the trim), the server's cached conversations
(`cached_per_agent_mb`: its cache budget's bytes, `Checkpoint.memory_bytes`), and what
the core holds for the conversation (`Conversation.memory_bytes` of each agent's history
rendered on its own: the token ids and the items' text); then, the same agents again in
front of a second server, the Python objects still alive that their turns allocated
(`tracemalloc`, which would have inflated the first pass's memory; the largest site
named). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import gc
import json
import os
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import uvicorn
import uvloop
from bench_peers import started, upstream_command
from hotloop import heap
from hotloop._core import Conversation, parse_request
from hotloop.config import ServerConfig
from hotloop.lab.capacity import Workload
from hotloop.lab.proc import free_port, rss_bytes
from hotloop.lab.rollout import INSTRUCTIONS, TOOLS
from hotloop.lab.thin_client import open_websocket
from hotloop.transport import App
from hotloop.transport.frames import FrameSendingProtocol

MODEL = "m"
ROOT = Path(__file__).resolve().parent.parent


def rss() -> int:
    gc.collect()
    return rss_bytes(os.getpid())


def malloc_trim() -> None:
    name = ctypes.util.find_library("c")
    trim = None if name is None else getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is not None:
        trim(0)


def malloc_blocks() -> tuple[int, int]:
    """The C allocator's bytes in use and free in its heap (zeros but with glibc)."""
    found = heap.malloc_blocks()
    return (0, 0) if found is None else (found.in_heap + found.own_pages, found.free_in_heap)


def core_bytes(workload: Workload, agents: int) -> tuple[float, float]:
    """Per agent: the core's bytes for its history rendered alone, and its tokens."""
    held, tokens = 0, 0
    for agent in range(agents):
        session = workload.session(agent)
        fields = {"model": MODEL, "instructions": INSTRUCTIONS, "tools": TOOLS}
        request = parse_request(orjson.dumps({**fields, "input": session.history()}))
        conversation = Conversation(workload.format, context_window=1 << 20)
        tokens += conversation.extend(request).prompt_tokens
        held += conversation.memory_bytes
    return held / agents, tokens / agents


async def agents_turns(args: argparse.Namespace, workload: Workload, ws_url: str) -> list[Any]:
    """Every agent's turns, one agent after the other; the sockets stay open."""
    fields = {"model": MODEL, "instructions": INSTRUCTIONS, "tools": TOOLS, "store": False}
    sockets = []
    for agent in range(args.agents):
        session = workload.session(agent)
        socket = await open_websocket(ws_url, None)
        sockets.append(socket)
        body: dict[str, Any] = {**fields, "input": session.history()}
        step = session.start
        for _ in range(args.turns):
            turn = await socket.send(orjson.dumps({"type": "response.create", **body}))
            if turn.terminal != "response.completed":
                raise SystemExit(f"agent {agent}: {turn.terminal} {str(turn.response)[:300]}")
            call = next(i for i in turn.response["output"] if i.get("type") == "function_call")
            output = {
                "type": "function_call_output",
                "call_id": call["call_id"],
                "output": session.output(step),
            }
            body = {**fields, "previous_response_id": turn.response["id"], "input": [output]}
            step += 1
    return sockets


async def measure(args: argparse.Namespace, upstream: str, trace: bool) -> dict[str, Any]:
    """One server, `args.agents` agents: their memory (`trace`: their Python objects)."""
    workload = Workload(args.seed, "agentx")
    port = free_port()
    config = ServerConfig(
        engine="upstream",
        upstream_dialect="vllm",
        upstream_replicas=(upstream,),
        upstream_served_model=MODEL,
        model=MODEL,
        upstream_context_window=1 << 20,
        port=port,
        heap_trim_interval=0.0,  # trimmed below, once, to see what it gives back
    )
    app = App.from_config(config)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            ws=FrameSendingProtocol,
            loop="none",
            log_level="warning",
            ws_max_size=2 * config.max_frame_bytes,
        )
    )
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)  # polling the server's start, not synchronisation
    agents = args.agents
    found: dict[str, Any] = {}
    ws_url = f"ws://127.0.0.1:{port}/v1/responses"
    if trace:
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        sockets = await agents_turns(args, workload, ws_url)
        alive = tracemalloc.take_snapshot().compare_to(before, "lineno")
        tracemalloc.stop()
        found["python_alive_per_agent_mb"] = sum(s.size_diff for s in alive) / agents / 1e6
        frame = alive[0].traceback[0]
        found["python_largest_site"] = f"{Path(frame.filename).relative_to(ROOT)}:{frame.lineno}"
        found["python_largest_site_per_agent_mb"] = alive[0].size_diff / agents / 1e6
    else:
        base, (in_use, free) = rss(), malloc_blocks()
        sockets = await agents_turns(args, workload, ws_url)
        found["rss_per_agent_mb"] = (rss() - base) / agents / 1e6
        in_use_now, free_now = malloc_blocks()
        found["malloc_in_use_per_agent_mb"] = (in_use_now - in_use) / agents / 1e6
        found["malloc_free_per_agent_mb"] = (free_now - free) / agents / 1e6
        found["cached_per_agent_mb"] = app.budget.used_bytes / agents / 1e6
        malloc_trim()
        found["rss_per_agent_trimmed_mb"] = (rss() - base) / agents / 1e6
    for socket in sockets:
        socket.close()
    server.should_exit = True
    await serving
    return found


async def measured(args: argparse.Namespace, upstream: str) -> dict[str, Any]:
    result: dict[str, Any] = {"agents": args.agents, "turns": args.turns}
    result.update(await measure(args, upstream, trace=False))
    result.update(await measure(args, upstream, trace=True))
    core, tokens = core_bytes(Workload(args.seed, "agentx"), args.agents)
    result.update(
        tokens_per_agent=tokens,
        core_conversation_per_agent_mb=core / 1e6,
        core_bytes_per_token=core / tokens,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    workload = Workload(args.seed, "agentx")
    with tempfile.TemporaryDirectory(prefix="hotloop-memory-") as scratch:
        script = Path(scratch) / "script.json"
        script.write_text(json.dumps(workload.script_json()))
        port = free_port()
        command = upstream_command(port, script, 100000.0, render=False)
        with started("upstream", command, port):
            result = uvloop.run(measured(args, f"http://127.0.0.1:{port}"))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
