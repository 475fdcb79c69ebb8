"""What the benchmarks that print text only measured, read back from their recorded
output: a results file of `make figures` keeps every command's stdout, and one parser per
script turns its lines into a document. Figure links address it under `/printed/`
(`../benches/results/ws_stream.json#/printed/4000/own_us`) and the renderers of
benches/figure_tables/ read it. A parser reads the script's output as the script prints
it today: change one with the other."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

NUMBER = r"-?\d[\d,]*(?:\.\d+)?"


def number(text: str) -> float:
    return float(text.replace(",", ""))


def slug(label: str) -> str:
    """`upstream, 8 streams, 1/event` -> `upstream_8_streams_1_event`."""
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


def _test_id(name: str) -> tuple[str, str | None]:
    """`test_append_vs_full_render[1k]` -> (`append_vs_full_render`, `1k`)."""
    found = re.fullmatch(r"test_(\w+?)(?:\[(.+)\])?", name)
    if found is None:
        raise ValueError(f"not a test id: {name}")
    return found.group(1), found.group(2)


def _put(into: dict[str, Any], name: str, value: Any) -> None:
    test, parameter = _test_id(name)
    if parameter is None:
        into[test] = value
    else:
        into.setdefault(test, {})[parameter] = value


def pytest_benchmark(stdout: str) -> dict[str, Any]:
    """A `pytest --benchmark-only -s` run of `benches/`: each test's figures (the
    `benchmark figures` section benches/conftest.py prints, `name[param]: k=v, ...`) and
    the median of its timed rounds in microseconds (pytest-benchmark's table)."""
    figures: dict[str, Any] = {}
    medians: dict[str, Any] = {}
    _, _, section = stdout.partition(" benchmark figures ")
    for line in section.splitlines()[1:]:
        name, sep, pairs = line.partition(": ")
        if not sep or not name.startswith("test_"):
            continue
        fields = dict(pair.split("=", 1) for pair in pairs.split(", "))
        _put(figures, name, {k: number(v) for k, v in fields.items()})
    scale = 1.0
    for line in stdout.splitlines():
        unit = re.match(r"Name \(time in (\w+)\)", line)
        if unit:
            scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[unit.group(1)]
        elif line.startswith("test_") and "(" in line:
            name, *columns = line.split()
            values = [c for c in columns if not c.startswith("(") and ";" not in c]
            _put(medians, name, number(values[4]) * scale)  # min max mean stddev median
    return {"figures": figures, "median_us": medians}


def microbenchmarks(results: dict[str, Any]) -> dict[str, Any]:
    """`bench_append.py`, `bench_format.py`, `bench_validate.py`, `bench_tokenize.py`, by
    their names without `bench_`."""
    found = {}
    for run in results["runs"]:
        script = re.search(r"benches/bench_(\w+)\.py", run["command"])
        assert script is not None, run["command"]
        found[script.group(1)] = pytest_benchmark(run["stdout"])
    return found


WS_STREAM_STEP = re.compile(
    rf"(?P<tokens>\d+) token\(s\) per engine step:\s+(?P<us>{NUMBER}) us/token"
)
WS_STREAM_SEND = re.compile(
    rf"1 token per engine step, send_frames: message\s+(?P<message_us>{NUMBER}) us/token, "
    rf"write\s+(?P<write_us>{NUMBER}) us/token"
)
WS_STREAM_SPEED = re.compile(
    rf"(?P<speed>\d+) tokens/s \(achieved (?P<achieved>\d+)\):\s+(?P<whole_us>{NUMBER}) us "
    rf"\((?P<user_pct>\d+)% user\), (?P<frames_per_token>{NUMBER}) frames/token"
)
# the lines under a rate's, each adding its named figures to that rate's
WS_STREAM_PARTS = tuple(
    re.compile(pattern)
    for pattern in (
        rf"sim pacing alone .*?(?P<tokens_per_wakeup>{NUMBER}) tokens/wake-up\):\s+"
        rf"(?P<pacing_us>{NUMBER}) us",
        rf"server's own \(whole process minus pacing\):\s+(?P<whole_minus_pacing_us>{NUMBER}) us",
        rf"server's own \(sampled .*?\):\s+(?P<own_us>{NUMBER}) us = .*?"
        rf"\((?P<own_per_frame_us>{NUMBER}) us/frame\)",
        rf"between batches, .*?:\s+(?P<between_us>{NUMBER}) us "
        rf"\((?P<between_per_frame_us>{NUMBER}) us/frame\)",
        rf"of which the kernel's loopback .*?: (?P<send_per_frame_us>{NUMBER}) us per frame = "
        rf"(?P<send_us>{NUMBER}) us",
    )
)


def ws_stream(results: dict[str, Any]) -> dict[str, Any]:
    """`bench_ws_stream.py`: the in-process path per tokens per step, then per rate the
    whole server's CPU per token and its parts."""
    (run,) = results["runs"]
    found: dict[str, Any] = {"in_process_us": {}}
    speed: dict[str, Any] = {}
    for line in (line.strip() for line in run["stdout"].splitlines()):
        if m := WS_STREAM_STEP.match(line):
            found["in_process_us"][m["tokens"]] = number(m["us"])
        elif m := WS_STREAM_SEND.match(line):
            found["send_frames_us"] = {k: number(v) for k, v in m.groupdict().items()}
        elif m := WS_STREAM_SPEED.match(line):
            fields = {k: number(v) for k, v in m.groupdict().items()}
            speed = found[m["speed"]] = fields
        else:
            for part in WS_STREAM_PARTS:
                if m := part.match(line):
                    speed.update({k: number(v) for k, v in m.groupdict().items()})
    return found


STREAM_LINE = re.compile(
    rf"^\s+(?P<label>\S.*?)\s+whole process\s+(?P<whole_us>{NUMBER}) us/token"
    rf"(?: = (?P<over_sim>{NUMBER})x sim)?, server's own \(sampled\)\s+(?P<own_us>{NUMBER}),"
    rf"\s+(?P<tokens_per_s>{NUMBER}) tokens/s"
    rf"(?:, added per token p50/p99 (?P<token_p50_ms>{NUMBER})/(?P<token_p99_ms>{NUMBER}) ms,"
    rf" added TTFT p50/p99 (?P<ttft_p50_ms>{NUMBER})/(?P<ttft_p99_ms>{NUMBER}) ms)?"
    rf", load (?P<load>{NUMBER})$"
)


def upstream_stream(results: dict[str, Any]) -> dict[str, Any]:
    """`bench_upstream_stream.py`, one command per number of streams: per configuration
    (`upstream_8_streams_1_event`, `ramp_upstream_16_streams_1_event`, ...) its CPU per
    token and the delays it added."""
    found: dict[str, Any] = {}
    for run in results["runs"]:
        for line in run["stdout"].splitlines():
            m = STREAM_LINE.match(line)
            if m:
                fields = m.groupdict()
                label = slug(fields.pop("label"))
                found[label] = {k: number(v) for k, v in fields.items() if v is not None}
    return found


def matching(results: dict[str, Any], pattern: str) -> list[re.Match[str]]:
    """The lines of a one-command figure's output that match `pattern`."""
    (run,) = results["runs"]
    return [m for line in run["stdout"].splitlines() if (m := re.match(pattern, line))]


def upstream_client(results: dict[str, Any]) -> dict[str, Any]:
    """`bench_upstream_client.py`: whole-process CPU per token per client design."""
    pattern = rf"^\s+(\w+)\s+({NUMBER}) us/token = ({NUMBER})x protocol"
    return {
        m.group(1): {"us": number(m.group(2)), "over_protocol": number(m.group(3))}
        for m in matching(results, pattern)
    }


def engines(results: dict[str, Any]) -> dict[str, Any]:
    """`bench_engines.py`: per engine its cold and warm TTFT and decode speed, medians."""
    pattern = rf"^(llama|upstream) .*?\s+({NUMBER})\s+({NUMBER})\s+({NUMBER})$"
    fields = ("cold_ttft_ms", "warm_ttft_ms", "decode_tok_s")
    return {
        m.group(1): {field: number(m.group(i)) for i, field in enumerate(fields, 2)}
        for m in matching(results, pattern)
    }


def hardening(results: dict[str, Any]) -> dict[str, Any]:
    """`bench_hardening.py` (one JSON document over several lines),
    `bench_large_requests.py`, `bench_loop_busy.py`, `bench_queue_memory.py`."""
    checks, large, busy, queue = (run["stdout"] for run in results["runs"])
    found: dict[str, Any] = {"checks": json.loads(checks), "queue": json.loads(queue)}
    found["large"] = {}
    for m in re.finditer(
        rf"^(tool list|history) ({NUMBER}) (MB|KB): server CPU ({NUMBER}) ms, "
        rf"wall ({NUMBER}) ms",
        large,
        re.MULTILINE,
    ):
        found["large"][slug(m.group(1))] = {
            "size": number(m.group(2)),
            "cpu_ms": number(m.group(4)),
            "wall_ms": number(m.group(5)),
        }
    m = re.search(rf"event-loop CPU ({NUMBER}) s", busy)
    found["loop_busy"] = {
        "windows": number(busy.split(" windows")[0].splitlines()[-1]),
        "loop_cpu_s": number(m.group(1)) if m else None,
        "over_50ms": number(re.findall(r"over 0\.05 s:\s+(\d+)", busy)[0]),
        "over_100ms": number(re.findall(r"over 0\.1 s:\s+(\d+)", busy)[0]),
    }
    return found


def tool_schema(results: dict[str, Any]) -> dict[str, Any]:
    """`bench_tool_schema.py` (cost per property per schema size) and
    `bench_tool_stall.py` (another connection's turn while one sends huge tool lists)."""
    schema, stall = (run["stdout"] for run in results["runs"])
    per_property = {
        m.group(1).replace(",", ""): number(m.group(2))
        for m in re.finditer(rf"^\s*(\d+) properties .*?: ({NUMBER}) us per property", schema, re.M)
    }
    growth = re.search(rf"at \d+ / at \d+: ({NUMBER})x", schema)
    found: dict[str, Any] = {
        "us_per_property": per_property,
        "growth": number(growth.group(1)) if growth else None,
    }
    for phase in ("quiet", "under attack"):
        m = re.search(rf"victim turn, {phase}: median ({NUMBER}) ms, worst ({NUMBER}) ms", stall)
        if m:
            found[slug(phase)] = {"median_ms": number(m.group(1)), "worst_ms": number(m.group(2))}
    m = re.search(rf"attacker: (\d+) frames answered .*?, median ({NUMBER}) ms each", stall)
    if m:
        found["attacker"] = {"frames": number(m.group(1)), "median_ms": number(m.group(2))}
    m = re.search(rf"attacker frame: ({NUMBER}) MB", stall)
    if m:
        found["attacker_frame_mb"] = number(m.group(1))
    return found


def templates(results: dict[str, Any]) -> dict[str, Any]:
    """`bench_template_append.py` (a markdown table, kept as it is) and
    `bench_tool_call_stream.py`: a call's arguments parsed streamed and whole."""
    stream = results["runs"][1]["stdout"]
    found: dict[str, Any] = {}
    for m in re.finditer(
        rf"^\s+(streamed|read whole)\s+(\d+) tokens\s+({NUMBER}) us/token", stream, re.M
    ):
        found[slug(m.group(1))] = {"tokens": number(m.group(2)), "us_per_token": number(m.group(3))}
    m = re.search(rf"streamed / read whole\s+({NUMBER})", stream)
    if m:
        found["streamed_over_whole"] = number(m.group(1))
    return found


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """`make bench-ci`'s checks (`benches/test_ratios.py`, `test_store_ratios.py`,
    `test_peers_ratios.py`): each line's ratio by its label, in the order printed."""
    (run,) = results["runs"]
    found: dict[str, Any] = {}
    for line in run["stdout"].splitlines():
        m = re.match(rf"^\.?([a-z].*?): ({NUMBER})x$", line)
        if m:
            found[m.group(1)] = number(m.group(2))
        m = re.match(
            rf"^\.?store: (\d+) responses in (\d+) group commits ({NUMBER}) ms, one commit "
            rf"each ({NUMBER}) ms, ratio ({NUMBER})x",
            line,
        )
        if m:
            found["store"] = {
                "responses": number(m.group(1)),
                "commits": number(m.group(2)),
                "grouped_ms": number(m.group(3)),
                "one_each_ms": number(m.group(4)),
                "ratio": number(m.group(5)),
            }
    return found


PRINTED: dict[str, Callable[[dict[str, Any]], Any]] = {
    "ratios.json": ratios,
    "microbenchmarks.json": microbenchmarks,
    "ws_stream.json": ws_stream,
    "upstream_stream.json": upstream_stream,
    "upstream_client.json": upstream_client,
    "engines.json": engines,
    "hardening.json": hardening,
    "tool_schema.json": tool_schema,
    "templates.json": templates,
}
