"""Issue 21, defect 1: the unauthenticated outage through the request body. One
`hotloop serve --engine sim --api-keys sk-a --max-connections CAP` process; CAP
attackers with no key each send complete headers announcing a megabyte, read the 401,
send one more byte and hold the connection (reconnecting whenever the server closes
it), while a legitimate client asks `GET /health` on a new connection every 20 ms.
Prints how many of those were answered 200 (and what the others got) as one JSON line.

    .venv/bin/python benches/bench_body_attack.py [SECONDS [CAP]]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections import Counter

from hotloop.lab.proc import ServerProcess

SLOW_BODY = (
    b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000000\r\n\r\n{"
)
HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


async def attacker(port: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        writer = None
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(SLOW_BODY)
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b" ")
            ended = asyncio.ensure_future(reader.read())  # held until the server closes
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait((ended, stopped), return_when=asyncio.FIRST_COMPLETED)
            ended.cancel()
            stopped.cancel()
        except (OSError, asyncio.IncompleteReadError):
            await asyncio.sleep(0.01)  # refused: try again, as an attacker would
        finally:
            if writer is not None:
                writer.close()


async def health(port: int) -> str:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(HEALTH)
        reply = await reader.read()
        writer.close()
    except OSError as e:
        return type(e).__name__
    return reply.split(b" ", 2)[1].decode() if reply else "closed"


async def attack(port: int, seconds: float, cap: int) -> Counter[str]:
    stop = asyncio.Event()
    attackers = [asyncio.ensure_future(attacker(port, stop)) for _ in range(cap)]
    await asyncio.sleep(1.0)  # the attackers hold their places
    answers: Counter[str] = Counter()
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        answers[await asyncio.wait_for(health(port), 30)] += 1
        await asyncio.sleep(0.02)
    stop.set()
    for task in attackers:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return answers


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    cap = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    flags = ["--engine", "sim", "--api-keys", "sk-a", "--max-connections", str(cap)]
    with ServerProcess.start(flags) as server:
        answers = asyncio.run(attack(server.port, seconds, cap))
    total = sum(answers.values())
    row = {"cap": cap, "seconds": seconds, "health_200": answers["200"], "health_total": total}
    print(json.dumps({**row, "answers": dict(answers)}))


if __name__ == "__main__":
    main()
