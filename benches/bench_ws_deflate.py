"""What `permessage-deflate` costs and saves on a coding agent's WebSocket traffic.

A deterministic rollout (`hotloop.lab.rollout`: real tool outputs, the Codex-like
instructions and tools) is played through hotloop's protocol state machine in process:
per step, the client's `response.create` (the tool output, continuing the previous
response) and every frame the server sends while the model's reasoning and call stream
at 4 tokens per frame (4,000 tokens/s with the engine's 1 ms wake-ups). The frames are
then run through websockets' permessage-deflate with the settings uvicorn negotiates
(12-bit windows, memLevel 5, context takeover), as the server would: it compresses
what it sends and decompresses what it receives.

Then the whole server, A/B in the same run: `hotloop serve --engine sim` at 4,000
tokens/s with and without `--websocket-deflate` (its client offering it or not), the
server process's CPU per streamed token from its CPU clock, rounds alternated.

Reported, in one run (medians of `--rounds`): bytes on the wire with and without
deflate, by direction; the server's CPU per frame to deflate what it sends and inflate
what it receives; and the whole server's CPU per streamed token both ways.

    .venv/bin/python benches/bench_ws_deflate.py --steps 30 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import orjson
from bench_ws_stream import Served
from hotloop._core import ChatFormat
from hotloop.lab.rollout import build_rollout
from hotloop.protocol import CacheBudget, Connection, ConnectionCache, Generate, Render
from websockets.extensions.permessage_deflate import PerMessageDeflate
from websockets.frames import Frame, Opcode

TOKENS_PER_FRAME = 4
RATE = 4000.0
WORDS = 3000  # about 0.75 s per turn at RATE


def deflate() -> PerMessageDeflate:
    """A server's side of the extension as uvicorn negotiates it."""
    return PerMessageDeflate(False, False, 12, 12, {"memLevel": 5})


def traffic(steps: int) -> tuple[list[bytes], list[bytes], list[int]]:
    """The client's frames, the server's frames, and the size in tokens of each
    streamed batch, for `steps` agent steps."""
    rollout = build_rollout(seed=7, tool_calls=steps)
    chat_format = ChatFormat.harmony()
    connection = Connection(
        chat_format=chat_format,
        context_window=1 << 24,
        model="sim",
        cache=ConnectionCache(1 << 34, CacheBudget(1 << 34)),
    )
    sent: list[bytes] = []
    received: list[bytes] = []
    batches: list[int] = []
    previous = call_id = None
    for index, step in enumerate(rollout.steps):
        body: dict[str, object] = {"type": "response.create", "model": "sim", "store": False}
        if previous is None:
            body |= {
                "model": "sim",
                "instructions": rollout.instructions,
                "tools": rollout.tools,
                "input": rollout.task,
            }
        else:
            body |= {
                "model": "sim",
                "tools": rollout.tools,
                "previous_response_id": previous,
                "input": [rollout.tool_result(index - 1, call_id)],
            }
        frame = orjson.dumps(body)
        received.append(frame)
        connection.receive_text(frame)
        actions = connection.actions()
        for render in [a for a in actions if isinstance(a, Render)]:
            # A large tool output is rendered off the event loop; here, inline.
            request, turn = render.run()
            connection.render_done(render.key, turn, request)
            actions += connection.actions()
        work = next(a for a in actions if isinstance(a, Generate))
        ids = chat_format.completion_tokens(
            reasoning=step.reasoning, calls=[(step.call.name, step.call.arguments)]
        )
        for start in range(0, len(ids), TOKENS_PER_FRAME):
            batch = ids[start : start + TOKENS_PER_FRAME]
            connection.engine_output(work.key, batch)
            batches.append(len(batch))
        connection.engine_done(work.key)
        frames = [a for a in connection.actions() if isinstance(a, bytes)]
        sent.extend(frames)
        response = orjson.loads(frames[-1])["response"]
        previous = response["id"]
        call_id = response["output"][-1]["call_id"]
    return received, sent, batches


def timed(run: Callable[[], object], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.thread_time_ns()
        run()
        samples.append(time.thread_time_ns() - start)
    return statistics.median(samples) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="agent steps")
    parser.add_argument("--rounds", type=int, default=5, help="measurements per figure")
    args = parser.parse_args()
    received, sent, batches = traffic(args.steps)

    def compress_sent() -> list[int]:
        ext = deflate()
        return [len(ext.encode(Frame(Opcode.TEXT, f)).data) for f in sent]

    client = deflate()
    compressed_received = [client.encode(Frame(Opcode.TEXT, f)) for f in received]

    def decompress_received() -> None:
        ext = deflate()
        for frame in compressed_received:
            ext.decode(frame)

    sent_deflated = compress_sent()
    compress_us = timed(compress_sent, args.rounds)
    decompress_us = timed(decompress_received, args.rounds)

    raw_sent, raw_received = sum(map(len, sent)), sum(map(len, received))
    deflated_sent = sum(sent_deflated)
    deflated_received = sum(len(f.data) for f in compressed_received)
    deltas = len(batches)
    print(f"{args.steps} agent steps: {len(received)} client frames, {len(sent)} server frames")
    print(f"{'':34}{'raw':>12}{'deflated':>12}{'ratio':>8}")
    print(
        f"{'server -> client bytes':34}{raw_sent:>12,}{deflated_sent:>12,}"
        f"{deflated_sent / raw_sent:>8.2f}"
    )
    print(
        f"{'client -> server bytes':34}{raw_received:>12,}{deflated_received:>12,}"
        f"{deflated_received / raw_received:>8.2f}"
    )
    print(
        f"server -> client mean frame: {raw_sent / len(sent):.0f} B raw, "
        f"{deflated_sent / len(sent):.0f} B deflated"
    )
    print(f"deflate CPU per server frame: {compress_us / len(sent):6.1f} us")
    print(f"inflate CPU per client frame: {decompress_us / len(received):6.1f} us")
    per_token = (compress_us + decompress_us) / sum(batches)
    print(
        f"deflate + inflate per streamed token: {per_token:.2f} us "
        f"({TOKENS_PER_FRAME} tokens per frame, {deltas} delta frames)"
    )
    saved = (raw_sent + raw_received) - (deflated_sent + deflated_received)
    print(f"CPU per KB saved on the wire: {(compress_us + decompress_us) / (saved / 1024):.1f} us")
    print("whole server at 4,000 tokens/s, CPU per streamed token (rounds alternated):")
    plain, deflated = Served(RATE, WORDS), Served(RATE, WORDS, deflate=True)
    try:
        pairs = [(plain.measure()[0], deflated.measure()[0]) for _ in range(args.rounds)]
    finally:
        plain.close()
        deflated.close()
    off, on = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
    ratio = statistics.median(p[1] / p[0] for p in pairs)
    print(f"  deflate off: {off:6.2f} us   deflate on: {on:6.2f} us   on/off: {ratio:.2f}x")
    # for benches/figures.py, which writes docs/protocol-conformance.md's table from it
    print(
        orjson.dumps(
            {
                "steps": args.steps,
                "rounds": args.rounds,
                "server_frames": len(sent),
                "client_frames": len(received),
                "server_bytes": {"raw": raw_sent, "deflated": deflated_sent},
                "client_bytes": {"raw": raw_received, "deflated": deflated_received},
                "deflate_us_per_server_frame": compress_us / len(sent),
                "inflate_us_per_client_frame": decompress_us / len(received),
                "deflate_inflate_us_per_token": per_token,
                "server_us_per_token": {"off": off, "on": on, "on_over_off": ratio},
            }
        ).decode()
    )


if __name__ == "__main__":
    main()
