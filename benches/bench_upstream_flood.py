"""What a misbehaving replica's stream costs the server, through the upstream client's
reader (`hotloop._core.ResponseReader`, one call per socket read on the event loop):

- `endless line`: 512 MiB of one `data:` line, in 64 KiB reads; the process's RSS
  growth with the line unbounded (issue 21, defect 8: what the reader did before the
  bound) and at the default bound (16 MiB);
- `flood`: the median loop time of one 256 KiB read of keep-alive comments, of
  `data:` events without tokens, and of one-token events, and the flood's cost per
  read as a ratio to the token events'.

Prints one JSON line.

    .venv/bin/python benches/bench_upstream_flood.py
"""

from __future__ import annotations

import json
import os
import statistics
import time

from hotloop._core import ResponseReader

MIB = 1024 * 1024
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
READ = 256 * 1024
COMMENT = b": keep-alive\n\n"
EMPTY = b'data: {"choices":[{"index":0,"text":"","token_ids":[],"finish_reason":null}]}\n\n'
TOKEN = b'data: {"choices":[{"index":0,"text":"a","token_ids":[100],"finish_reason":null}]}\n\n'


def rss() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def endless_line(max_line: int) -> int:
    """RSS growth while 512 MiB of one line arrive (stopping at the failure)."""
    reader = ResponseReader("vllm", max_line)
    reader.feed(HEAD + b"data: ")
    chunk = b"x" * (64 * 1024)
    before = rss()
    peak = before
    for _ in range(512 * MIB // len(chunk)):
        reader.feed(chunk)
        peak = max(peak, rss())
        if reader.failure is not None:
            break
    return peak - before


def read_time(event: bytes, reads: int = 200) -> float:
    """The median loop time of one `feed` of a 256 KiB read of `event`s, in seconds
    (the median: the machine's other work lands in the slowest reads)."""
    data = event * (READ // len(event))
    reader = ResponseReader("vllm")
    reader.feed(HEAD)
    times = []
    for _ in range(reads):
        start = time.perf_counter()
        reader.feed(data)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    unbounded = endless_line(1 << 40)
    bounded = endless_line(16 * MIB)
    comments, empty, tokens = (read_time(e) for e in (COMMENT, EMPTY, TOKEN))
    print(
        json.dumps(
            {
                "endless_line_rss_growth_mib": {
                    "unbounded": round(unbounded / MIB),
                    "bounded_16mib": round(bounded / MIB),
                },
                "median_256k_read_ms": {
                    "comments": round(comments * 1e3, 3),
                    "empty_events": round(empty * 1e3, 3),
                    "token_events": round(tokens * 1e3, 3),
                },
                "empty_to_token_ratio": round(empty / tokens, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
