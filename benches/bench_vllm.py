"""The same agent conversation three ways on one real vLLM (CPU build, SmolLM2 bf16):
through hotloop's WebSocket mode (token ids, `--engine upstream --upstream-dialect
vllm`), through agentic-api 0.9.0's WebSocket mode in front of the same vLLM (it sends
vLLM's stateless `POST /v1/responses` the whole rehydrated history every turn), and
through vLLM's own stateless `POST /v1/responses` with the whole history every turn.
Time to first token per turn, total time, and the part of the first-token time spent
before the engine started.

    .venv/bin/python benches/bench_vllm.py [--turns 20] [--tokens 24] [--paths ...]

Each turn sends a user message of about 150 tokens (a tool-output-like paragraph and a
question) and samples `--tokens` greedy tokens, so 20 turns reach about 4k tokens. The
paths run one after the other on the same vLLM, each with its own instructions (the
same number of tokens: the prompts are the same length turn for turn, and no path finds
another's conversation in vLLM's prefix cache). "Before the engine" is the client's
time to first token minus vLLM's own (`vllm:time_to_first_token_seconds`, from the
request's arrival at its engine to the first token); for hotloop also its own
`hotloop_turn_overhead_seconds` (request to engine call). "Engine cached" is the
prompt ids vLLM served from its prefix cache, as each response's usage reports it.
Needs `hotloop setup vllm` (run on first use) and, for agentic-api, the peers'
virtualenv (benches/bench_peers.py, made on first use). The last line printed is the
results as JSON (`benches/figures.py run vllm` keeps it).
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
from bench_peers import gateway_command, peer_venv, started
from hotloop.lab.proc import ServerProcess, free_port
from hotloop.lab.vllm_server import SERVED_MODEL, VllmServer, metric
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
    """A path's own instructions: `path` is one letter, so every path's prompt has the
    same number of ids (names of different token counts made the prompts differ by
    one id, which looked like a render difference)."""
    return f"Conversation {path}. You are a build assistant. Answer in one sentence."


def question(i: int) -> str:
    paragraph = PARAGRAPH.format(i=i)
    # About 150 tokens: with the replies, 20 turns end near 3.7k of the 4k window.
    return f"{paragraph}{paragraph[: len(paragraph) // 2]} Summarise step {i} in one sentence."


@dataclass
class Path_:
    name: str
    letter: str
    """Its instructions' conversation name."""
    ttft: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    engine_ttft: list[float] = field(default_factory=list)
    own_overhead: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    engine_cached: list[int | None] = field(default_factory=list)

    def before_engine(self) -> list[float]:
        return [c - e for c, e in zip(self.ttft, self.engine_ttft, strict=True)]

    def record(self, response: dict[str, Any]) -> None:
        usage = response.get("usage") or {}
        self.prompt_tokens.append(usage.get("input_tokens", 0))
        details = usage.get("input_tokens_details") or {}
        # hotloop: the engine's figure beside its own; vLLM: its only cached figure.
        self.engine_cached.append(details.get("engine_cached_tokens", details.get("cached_tokens")))

    def summary(self) -> dict[str, Any]:
        return {
            "total_s": sum(self.total),
            "ttft_ms": [t * 1000 for t in self.ttft],
            "engine_ttft_ms": [t * 1000 for t in self.engine_ttft],
            "before_engine_ms": [t * 1000 for t in self.before_engine()],
            "own_overhead_ms": [t * 1000 for t in self.own_overhead],
            "prompt_tokens": self.prompt_tokens,
            "engine_cached_tokens": self.engine_cached,
        }


def engine_ttft(vllm: VllmServer, before: float) -> float:
    return metric(vllm.url, "vllm:time_to_first_token_seconds_sum") - before


def ws_turns(
    vllm: VllmServer, ws_url: str, own_metrics: str | None, turns: int, tokens: int, out: Path_
) -> None:
    """The conversation over a gateway's WebSocket mode (`previous_response_id`);
    `own_metrics`: the base URL of hotloop's `/metrics`, for its own turn overhead."""
    previous: str | None = None
    with connect(ws_url, max_size=None) as socket:
        for i in range(turns):
            frame: dict[str, Any] = {
                "type": "response.create",
                "model": SERVED_MODEL,
                "input": question(i),
                "instructions": instructions(out.letter),
                "max_output_tokens": tokens,
                "temperature": 0,
            }
            if previous is not None:
                frame["previous_response_id"] = previous
            vllm_before = metric(vllm.url, "vllm:time_to_first_token_seconds_sum")
            if own_metrics is not None:
                own_before = metric(own_metrics, "hotloop_turn_overhead_seconds_sum")
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
            if own_metrics is not None:
                own = metric(own_metrics, "hotloop_turn_overhead_seconds_sum")
                out.own_overhead.append(own - own_before)
            out.record(response)


def vllm_turns(vllm: VllmServer, turns: int, tokens: int, out: Path_) -> None:
    history: list[dict[str, Any]] = []
    with httpx.Client(base_url=vllm.url, timeout=GUARD) as client:
        for i in range(turns):
            history.append({"type": "message", "role": "user", "content": question(i)})
            body = {
                "model": SERVED_MODEL,
                "instructions": instructions(out.letter),
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
            out.record(final)


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f}" if values else "-"


PATHS = ("hotloop", "agentic-api", "vllm")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--paths", default=",".join(PATHS), help="a subset of " + ",".join(PATHS))
    args = parser.parse_args()
    chosen = args.paths.split(",")
    paths = {
        "hotloop": Path_("hotloop WS (token ids)", "A"),
        "agentic-api": Path_("agentic-api WS (vLLM /v1/responses)", "B"),
        "vllm": Path_("vLLM POST /v1/responses", "C"),
    }
    venv = peer_venv() if "agentic-api" in chosen else None

    started_at = time.perf_counter()
    # No request log: vLLM at DEBUG would spend time on it that no path needs.
    vllm = VllmServer(ensure_vllm(), ensure_vllm_model(), log_requests=False).start()
    print(f"vLLM ready in {time.perf_counter() - started_at:.0f} s", file=sys.stderr)
    try:
        if "hotloop" in chosen:
            node = ServerProcess.start([*vllm.hotloop_flags(), "--chat-template", "auto"])
            try:
                ws_turns(
                    vllm, node.ws_url, node.base_url, args.turns, args.tokens, paths["hotloop"]
                )
            finally:
                node.stop()
        if venv is not None:
            port = free_port()
            command = gateway_command("agentic-api", port, vllm.url, venv)
            with started("agentic-api", command, port):
                url = f"ws://127.0.0.1:{port}/v1/responses"
                ws_turns(vllm, url, None, args.turns, args.tokens, paths["agentic-api"])
        if "vllm" in chosen:
            vllm_turns(vllm, args.turns, args.tokens, paths["vllm"])
    finally:
        vllm.stop()

    measured = [paths[name] for name in PATHS if name in chosen]
    print(f"turns {args.turns}, {args.tokens} tokens each, greedy")
    print("| turn | prompt | " + " | ".join(f"TTFT {p.name} ms" for p in measured) + " |")
    print("|---|---|" + "---|" * len(measured))
    for i in range(args.turns):
        prompts = "/".join(str(p.prompt_tokens[i]) for p in measured)
        ttfts = " | ".join(f"{p.ttft[i] * 1000:.0f}" for p in measured)
        print(f"| {i + 1} | {prompts} | {ttfts} |")
    print()
    print("| path | total s | median TTFT ms | median engine TTFT ms | median before engine ms |")
    print("|---|---|---|---|---|")
    for path in measured:
        print(
            f"| {path.name} | {sum(path.total):.1f} | {ms(path.ttft)} | {ms(path.engine_ttft)} "
            f"| {ms(path.before_engine())} |"
        )
    if "hotloop" in chosen:
        overhead = ms(paths["hotloop"].own_overhead)
        print(f"\nhotloop's own turn overhead (request to engine call), median: {overhead} ms")
    results = {
        "turns": args.turns,
        "tokens": args.tokens,
        "paths": {name: paths[name].summary() for name in PATHS if name in chosen},
    }
    print(orjson.dumps(results).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
