"""The same agent conversation two ways on one real vLLM (CPU build, SmolLM2 bf16):
through hotloop's WebSocket mode (token ids, `--engine upstream --upstream-dialect
vllm`), and through vLLM's own stateless `POST /v1/responses` with the whole history
every turn. Time to first token per turn, total time, and the part of the first-token
time spent before the engine started.

    .venv/bin/python benches/bench_vllm.py [--turns 20] [--tokens 24]

Each turn sends a user message of about 150 tokens (a tool-output-like paragraph and a
question) and samples `--tokens` greedy tokens, so 20 turns reach about 4k tokens. The
two paths alternate per turn on the same vLLM (different conversation prefixes, so each
path only hits its own cache entries). "Before the engine" is the client's time to first
token minus vLLM's own (`vllm:time_to_first_token_seconds`, from the request's arrival
at its engine to the first token); for hotloop also its own
`hotloop_turn_overhead_seconds` (request to engine call). Needs `hotloop setup vllm`
(run on first use). agentic-api, the third path of issue 24, is not measured here yet.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from hotloop.bench.proc import ServerProcess
from hotloop.engines.vllm_server import SERVED_MODEL, VllmServer, metric
from hotloop.native_deps import ensure_vllm, ensure_vllm_model
from websockets.sync.client import connect

GUARD = 600.0
PARAGRAPH = (
    "Build log: compiling module {i} of the service; 3 warnings about unused imports in "
    "handlers, 1 deprecation notice for the old configuration loader, tests passed 41 of "
    "42 with one flaky network test retried twice, artifacts uploaded to the staging "
    "bucket, container image tagged release-candidate-{i}, checksum verified, deployment "
    "manifest updated with the new image and two environment variables, rollout waiting "
    "for approval from the on-call engineer before production traffic is shifted. "
)


def instructions(path: str) -> str:
    return f"Conversation {path}. You are a build assistant. Answer in one sentence."


def question(i: int) -> str:
    paragraph = PARAGRAPH.format(i=i)
    # About 150 tokens: with the replies, 20 turns end near 3.7k of the 4k window.
    return f"{paragraph}{paragraph[: len(paragraph) // 2]} Summarise step {i} in one sentence."


@dataclass
class Path_:
    name: str
    ttft: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    engine_ttft: list[float] = field(default_factory=list)
    own_overhead: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)

    def before_engine(self) -> list[float]:
        return [c - e for c, e in zip(self.ttft, self.engine_ttft, strict=True)]


def engine_ttft(vllm: VllmServer, before: float) -> float:
    return metric(vllm.url, "vllm:time_to_first_token_seconds_sum") - before


def hotloop_turns(
    vllm: VllmServer, node: ServerProcess, turns: int, tokens: int, out: Path_
) -> None:
    previous: str | None = None
    with connect(node.ws_url, max_size=None) as socket:
        for i in range(turns):
            frame: dict[str, Any] = {
                "type": "response.create",
                "model": SERVED_MODEL,
                "input": question(i),
                "instructions": instructions("hotloop"),
                "max_output_tokens": tokens,
                "temperature": 0,
            }
            if previous is not None:
                frame["previous_response_id"] = previous
            vllm_before = metric(vllm.url, "vllm:time_to_first_token_seconds_sum")
            own_before = metric(node.base_url, "hotloop_turn_overhead_seconds_sum")
            start = time.perf_counter()
            socket.send(orjson.dumps(frame).decode())
            first = 0.0
            while True:
                event = orjson.loads(socket.recv(GUARD))
                if not first and event["type"] == "response.output_text.delta":
                    first = time.perf_counter()
                if event["type"] in ("response.completed", "response.incomplete"):
                    break
                assert event["type"] not in ("response.failed", "error"), event
            end = time.perf_counter()
            response = event["response"]
            previous = response["id"]
            out.ttft.append(first - start)
            out.total.append(end - start)
            out.engine_ttft.append(engine_ttft(vllm, vllm_before))
            out.own_overhead.append(
                metric(node.base_url, "hotloop_turn_overhead_seconds_sum") - own_before
            )
            out.prompt_tokens.append(response["usage"]["input_tokens"])


def vllm_turns(vllm: VllmServer, turns: int, tokens: int, out: Path_) -> None:
    history: list[dict[str, Any]] = []
    with httpx.Client(base_url=vllm.url, timeout=GUARD) as client:
        for i in range(turns):
            history.append({"type": "message", "role": "user", "content": question(i)})
            body = {
                "model": SERVED_MODEL,
                "instructions": instructions("vllm"),
                "input": history,
                "max_output_tokens": tokens,
                "temperature": 0,
                "stream": True,
                "store": False,
            }
            vllm_before = metric(vllm.url, "vllm:time_to_first_token_seconds_sum")
            start = time.perf_counter()
            first = 0.0
            text: list[str] = []
            final: dict[str, Any] = {}
            with client.stream("POST", "/v1/responses", json=body) as reply:
                assert reply.status_code == 200, reply.read()
                for line in reply.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    event = orjson.loads(line[6:])
                    if event["type"] == "response.output_text.delta":
                        first = first or time.perf_counter()
                        text.append(event["delta"])
                    if event["type"] in ("response.completed", "response.incomplete"):
                        final = event["response"]
            end = time.perf_counter()
            history.append({"type": "message", "role": "assistant", "content": "".join(text)})
            out.ttft.append(first - start)
            out.total.append(end - start)
            out.engine_ttft.append(engine_ttft(vllm, vllm_before))
            out.prompt_tokens.append(final.get("usage", {}).get("input_tokens", 0))


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f}" if values else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()

    started = time.perf_counter()
    # No request log: vLLM at DEBUG would spend time on it that neither path needs.
    vllm = VllmServer(ensure_vllm(), ensure_vllm_model(), log_requests=False).start()
    print(f"vLLM ready in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    node = ServerProcess.start([*vllm.hotloop_flags(), "--chat-template", "auto"])
    hotloop, stateless = Path_("hotloop WS (token ids)"), Path_("vLLM POST /v1/responses")
    try:
        hotloop_turns(vllm, node, args.turns, args.tokens, hotloop)
        vllm_turns(vllm, args.turns, args.tokens, stateless)
    finally:
        node.stop()
        vllm.stop()

    print(f"turns {args.turns}, {args.tokens} tokens each, greedy")
    print("| turn | prompt (hotloop / vLLM) | TTFT hotloop ms | TTFT vLLM /v1/responses ms |")
    print("|---|---|---|---|")
    for i in range(args.turns):
        print(
            f"| {i + 1} | {hotloop.prompt_tokens[i]} / {stateless.prompt_tokens[i]} "
            f"| {hotloop.ttft[i] * 1000:.0f} | {stateless.ttft[i] * 1000:.0f} |"
        )
    print()
    print("| path | total s | median TTFT ms | median engine TTFT ms | median before engine ms |")
    print("|---|---|---|---|---|")
    for path in (hotloop, stateless):
        print(
            f"| {path.name} | {sum(path.total):.1f} | {ms(path.ttft)} | {ms(path.engine_ttft)} "
            f"| {ms(path.before_engine())} |"
        )
    overhead = ms(hotloop.own_overhead)
    print(f"\nhotloop's own turn overhead (request to engine call), median: {overhead} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
