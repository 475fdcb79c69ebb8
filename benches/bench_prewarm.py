"""Time to first token of a long-prompt turn with and without a prewarm, in one run.

    .venv/bin/python benches/bench_prewarm.py [--rounds 5] [--words 600] [--threads 1]

The embedded llama engine (SmolLM2-135M): each round starts a fresh session and a
fresh prompt (a long system text, a question) twice, once cold and once after a
prewarm (`max_output_tokens` 0, what `prompt_cache_options.prewarm` and `generate:
false` ask of the engine) of that prompt; the prewarm itself is not timed, as a client
sends it before the user's turn. Rounds alternate the two so load from elsewhere on the
machine hits both alike. Reported as medians over rounds and the ratio cold/prewarmed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from engine_conversation import first_turn
from hotloop._core import Prompt
from hotloop.engines.base import Sampling
from hotloop.engines.llama import LlamaConfig, LlamaEngine

PREWARM = Sampling(max_output_tokens=0)
FIRST_TOKEN = Sampling(max_output_tokens=1, temperature=0.0)


async def first_token(engine: LlamaEngine, ids: list[int], prewarm: bool) -> float:
    """Seconds to the first id of a turn on `ids` in a new session (prewarmed first)."""
    session = engine.session()
    try:
        if prewarm:
            async for _ in session.generate(Prompt.from_tokens(ids), PREWARM):
                pass
        start = time.perf_counter()
        async for _ in session.generate(Prompt.from_tokens(ids), FIRST_TOKEN):
            break
        return time.perf_counter() - start
    finally:
        await session.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--words", type=int, default=600)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    # Two sequences: a new session evicts the least recent one up front, so no
    # decode waits for room in a full KV cache.
    engine = LlamaEngine(LlamaConfig(n_ctx=4096, max_sequences=2, n_threads=args.threads))
    await engine.start()
    cold: list[float] = []
    warm: list[float] = []
    try:
        for i in range(args.rounds):
            # A prompt no earlier round evaluated: the engine's other sequences would
            # otherwise donate it to the cold turn.
            text = f"Round {i}. " + " ".join(f"note{i}-{n}" for n in range(args.words))
            ids = first_turn(text + "\nWhat is the first note?")
            cold.append(await first_token(engine, ids, prewarm=False))
            text = f"Round {i} again. " + " ".join(f"note{i}-{n}" for n in range(args.words))
            ids = first_turn(text + "\nWhat is the first note?")
            warm.append(await first_token(engine, ids, prewarm=True))
    finally:
        await engine.close()
    result = {
        "rounds": args.rounds,
        "prompt_tokens": len(ids),
        "cold_ttft_ms": statistics.median(cold) * 1000,
        "prewarmed_ttft_ms": statistics.median(warm) * 1000,
    }
    result["ratio_cold_over_prewarmed"] = result["cold_ttft_ms"] / result["prewarmed_ttft_ms"]
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
