"""A 10-turn tool-using conversation over the WebSocket (deltas + previous_response_id)
vs over stateless HTTP (the full history every turn), end to end, in one run:

    .venv/bin/python benches/bench_turns.py [--turns 10] [--tokens 32] [--rounds 3]

for two engines: SmolLM2 in-process (`--engine llama`, the slow-model regime where the
API server's work hides behind inference) and the simulated engine at 1,000 tokens/s
(where it does not). Each configuration gets its own `hotloop serve` process on a free
loopback port, with its own data directory. A turn replays one tool call the agent made
and its output (~1 KB), and the model answers in at most `--tokens` tokens
(`--output-lines` sizes the tool output). Reported: median seconds per conversation, and
HTTP/WebSocket ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from hotloop.lab.proc import ServerProcess
from openai import OpenAI

TOOL = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a shell command and return its output.",
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}},
        "required": ["cmd"],
        "additionalProperties": False,
    },
    "strict": True,
}


def listing(lines: int) -> str:
    return "\n".join(
        f"-rw-r--r-- 1 dev dev {1000 + i:>6} src/module_{i:02d}.py" for i in range(lines)
    )


def tool_turn(k: int, output: str) -> list[dict[str, Any]]:
    call_id = f"call_{k:024d}"
    return [
        {
            "type": "function_call",
            "call_id": call_id,
            "name": "exec_command",
            "arguments": json.dumps({"cmd": f"ls -l src # step {k}"}),
        },
        {"type": "function_call_output", "call_id": call_id, "output": output},
    ]


def websocket_conversation(
    client: OpenAI, model: str, turns: int, tokens: int, output: str
) -> float:
    start = time.perf_counter()
    with client.responses.connect() as conn:
        previous: str | None = None
        for k in range(turns):
            items = [{"type": "message", "role": "user", "content": "Check the sources."}]
            conn.response.create(
                model=model,
                input=items if k == 0 else tool_turn(k, output),
                tools=[TOOL],  # type: ignore[list-item]
                store=False,
                max_output_tokens=tokens,
                temperature=0.0,
                **({"previous_response_id": previous} if previous else {}),
            )
            for event in conn:
                if event.type in ("response.completed", "response.incomplete"):
                    previous = event.response.id
                    break
                if event.type in ("error", "response.failed"):
                    raise RuntimeError(f"turn {k}: {event}")
    return time.perf_counter() - start


def http_conversation(client: OpenAI, model: str, turns: int, tokens: int, output: str) -> float:
    start = time.perf_counter()
    history: list[Any] = []
    for k in range(turns):
        if k == 0:
            history.append({"type": "message", "role": "user", "content": "Check the sources."})
        else:
            history.extend(tool_turn(k, output))
        response = client.responses.create(
            model=model,
            input=history,
            tools=[TOOL],  # type: ignore[list-item]
            store=False,
            max_output_tokens=tokens,
            temperature=0.0,
        )
        # Stateless: the client carries the whole conversation, outputs included.
        history.extend(item.model_dump(exclude_none=True) for item in response.output)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output-lines", type=int, default=24, help="lines of tool output")
    args = parser.parse_args()
    output = listing(args.output_lines)
    engines = {
        "llama (SmolLM2-135M)": ("SmolLM2-135M-Instruct", ["--engine", "llama"]),
        "sim at 1,000 tok/s": ("sim", ["--engine", "sim", "--sim-tokens-per-second", "1000"]),
    }
    print(f"{args.turns} turns, <= {args.tokens} output tokens per turn, {args.rounds} rounds")
    print(f"{'engine':<24}{'websocket s':>13}{'http s':>10}{'http/ws':>9}")
    medians = {}
    for name, (model, flags) in engines.items():
        with ServerProcess.start(flags) as server:
            client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
            ws: list[float] = []
            http: list[float] = []
            for _ in range(args.rounds):  # alternating, so machine load hits both alike
                ws.append(websocket_conversation(client, model, args.turns, args.tokens, output))
                http.append(http_conversation(client, model, args.turns, args.tokens, output))
        w, h = statistics.median(ws), statistics.median(http)
        print(f"{name:<24}{w:>13.2f}{h:>10.2f}{h / w:>9.2f}")
        medians[name] = {"websocket_s": w, "http_s": h}
    print(json.dumps(medians))  # for benches/figures.py, which writes the docs' table


if __name__ == "__main__":
    main()
