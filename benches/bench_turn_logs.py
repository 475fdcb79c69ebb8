"""The log lines of one WebSocket turn through `hotloop serve`'s logging configuration
(`hotloop.logs.log_config`, human format, info level, one API key to redact), written
to /dev/null: the `hotloop.requests` line when the response opens and the
`hotloop.ledger` line when it finishes, as the server logs them:

    .venv/bin/python benches/bench_turn_logs.py [--rounds 9] [--turns 2000]
        [--baseline OLD_LOGS_PY]

`--baseline`: another version of `python/hotloop/logs.py` (e.g. `git show
main:python/hotloop/logs.py > /tmp/logs_before.py`), measured in the same run, rounds
interleaved. Reported: the median microseconds per turn of each, their ratio, the load
average; then one JSON line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import logging.config
import os
import statistics
import time
from types import ModuleType

import hotloop.logs

RESPONSE_ID = "resp_0123456789abcdef"


def configure(logs: ModuleType) -> None:
    logging.config.dictConfig(logs.log_config("human", "info", keys=["sk-test-key"], node="n1"))
    for handler in logging.getLogger("hotloop").handlers:
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream(open(os.devnull, "w"))


def turn() -> None:
    """What a turn logs, with the arguments the server passes."""
    logging.getLogger("hotloop.requests").info(
        "response %s request %s", RESPONSE_ID, "req_0123456789abcdef"
    )
    logging.getLogger("hotloop.ledger").info(
        "response %s %s over %s: %d input tokens (%d cached), %d output",
        RESPONSE_ID,
        "completed",
        "websocket",
        40123,
        39876,
        212,
        extra={"response_id": RESPONSE_ID, "event": "response.finished"},
    )


def per_turn_us(logs: ModuleType, turns: int) -> float:
    configure(logs)
    for _ in range(turns // 10):
        turn()  # warm
    start = time.perf_counter_ns()
    for _ in range(turns):
        turn()
    return (time.perf_counter_ns() - start) / turns / 1000


def load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("baseline_logs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    args.add_argument("--rounds", type=int, default=9)
    args.add_argument("--turns", type=int, default=2000)
    args.add_argument("--baseline")
    options = args.parse_args()
    versions = {"current": hotloop.logs}
    if options.baseline:
        versions = {"baseline": load(options.baseline), **versions}
    times: dict[str, list[float]] = {name: [] for name in versions}
    for _ in range(options.rounds):
        for name, logs in versions.items():
            times[name].append(per_turn_us(logs, options.turns))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, median in medians.items():
        print(f"{name}: {median:.1f} us of logging per turn (median of {options.rounds})")
    figures: dict[str, object] = {"median_us": medians, "load": os.getloadavg()[0]}
    if "baseline" in medians:
        figures["ratio"] = medians["baseline"] / medians["current"]
        print(f"baseline / current: {figures['ratio']:.2f}x")
    print(f"load average {figures['load']:.1f}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
