"""Tokens/s and time to first token of the real engines on this machine, in one run.

    .venv/bin/python benches/bench_engines.py [--rounds 5] [--tokens 64] [--threads 1]

Engines: `llama` (SmolLM2-135M in-process) and `upstream` with the llama.cpp dialect
against a local `llama-server` serving the same GGUF with the same thread count, so the
ratio between them is the cost of the HTTP hop and the server. Each round is a two-turn
conversation on a fresh session: turn 1 evaluates its whole prompt (cold), turn 2 only
its new tokens (warm KV); rounds alternate between the engines. Decode speed is measured
from the first to the last id.
Reported as medians over rounds, and as ratios upstream/llama.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from engine_conversation import first_turn, next_turn
from hotloop._core import Prompt
from hotloop.engines.base import Engine, Sampling
from hotloop.engines.llama import LlamaConfig, LlamaEngine
from hotloop.engines.upstream import UpstreamConfig, UpstreamEngine
from hotloop.lab.llama_server import LlamaServer
from hotloop.native_deps import ensure_llama_server, smollm2_gguf_path


@dataclass
class Samples:
    cold_ttft: list[float] = field(default_factory=list)
    warm_ttft: list[float] = field(default_factory=list)
    decode_tps: list[float] = field(default_factory=list)

    def medians(self) -> tuple[float, float, float]:
        return (
            statistics.median(self.cold_ttft),
            statistics.median(self.warm_ttft),
            statistics.median(self.decode_tps),
        )


async def one_turn(
    engine: Engine, session: object, ids: list[int], tokens: int
) -> tuple[float, float, list[int]]:
    sampling = Sampling(max_output_tokens=tokens, temperature=0.0)
    start = time.perf_counter()
    first = last = 0.0
    out: list[int] = []
    async for batch in session.generate(Prompt.from_tokens(ids), sampling):  # type: ignore[attr-defined]
        now = time.perf_counter()
        if not out:
            first = now
        last = now
        out.extend(batch)
    ttft = first - start
    tps = (len(out) - 1) / (last - first) if len(out) > 1 and last > first else 0.0
    return ttft, tps, out


async def one_round(engine: Engine, i: int, tokens: int, samples: Samples) -> None:
    session = engine.session()
    p1 = first_turn(f"Write a short poem about the number {i}.")
    cold, tps1, reply = await one_turn(engine, session, p1, tokens)
    p2 = next_turn(p1, reply, "Now a shorter one.")
    warm, tps2, _ = await one_turn(engine, session, p2, tokens)
    await session.close()
    samples.cold_ttft.append(cold)
    samples.warm_ttft.append(warm)
    samples.decode_tps.extend([tps1, tps2])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    gguf = smollm2_gguf_path()

    llama = LlamaEngine(LlamaConfig(n_ctx=4096, n_threads=args.threads))
    server = LlamaServer(ensure_llama_server(), gguf, n_ctx=4096, parallel=1, threads=args.threads)
    upstream = UpstreamEngine(
        UpstreamConfig(
            dialect="llamacpp", replicas=(server.url,), model="smollm2", context_window=4096
        )
    )
    results = {"llama": Samples(), "upstream (llama-server)": Samples()}
    await llama.start()
    await server.start()
    await upstream.start()
    try:
        # Rounds alternate between the engines so load from elsewhere on the machine
        # hits both alike and the ratios stay meaningful.
        for i in range(args.rounds):
            await one_round(llama, i, args.tokens, results["llama"])
            await one_round(upstream, i, args.tokens, results["upstream (llama-server)"])
    finally:
        await upstream.close()
        await server.stop()
        await llama.close()

    print(f"{args.rounds} rounds, {args.tokens} output tokens, {args.threads} thread(s); medians")
    print(f"{'engine':<26}{'cold TTFT ms':>14}{'warm TTFT ms':>14}{'decode tok/s':>14}")
    for name, samples in results.items():
        cold, warm, tps = samples.medians()
        print(f"{name:<26}{cold * 1000:>14.1f}{warm * 1000:>14.1f}{tps:>14.1f}")
    base = results["llama"].medians()
    other = results["upstream (llama-server)"].medians()
    print(
        "ratios upstream/llama: "
        f"cold TTFT {other[0] / base[0]:.2f}, warm TTFT {other[1] / base[1]:.2f}, "
        f"decode tok/s {other[2] / base[2]:.2f}"
    )


if __name__ == "__main__":
    asyncio.run(main())
