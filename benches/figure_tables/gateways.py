"""The tables of hotloop beside other gateways (docs/benchmarks-gateways.md,
docs/benchmarks-whole-history.md) and of the upstream path (docs/upstream-streaming.md)."""

from __future__ import annotations

from statistics import median
from typing import Any

import figure_printed as printed

from figure_tables.common import (
    markdown,
    ms,
    printed_json,
    tokens,
)

# bench_peers.py's name for a configuration -> the docs' (see benchmarks-gateways.md's legend)
PEER_SYSTEMS = {
    "hotloop+nofsync": "hotloop, process-crash",
    "hotloop+coalesce5": "hotloop, `--stream-coalesce-ms 5`,",
}


def peers_tables(results: dict[str, Any], labels: dict[str, str] | None = None) -> str:
    """The side-by-side tables, one per speed and upstream (`labels`: names for systems
    beyond `PEER_SYSTEMS`')."""
    names = {**PEER_SYSTEMS, **(labels or {})}
    header = (
        *("system, mode", "loop / ideal", "TTFT, last 10 turns", "TTFT - floor"),
        *("gateway CPU / turn", "upstream CPU / turn", "last token -> terminal"),
    )
    blocks = []
    for c in results["configurations"]:
        rows = []
        for key, r in c["systems"].items():
            system, mode = key.rsplit(" ", 1)
            rows.append(
                (
                    f"{names.get(system, system)} {mode}",
                    f"{r['loop_over_ideal']:.3f}",
                    ms(r["ttft_ms"]),
                    f"{r['ttft_over_floor_ms']:+.1f} ms",
                    ms(r["gateway_cpu_ms_per_turn"], 2),
                    ms(r["upstream_cpu_ms_per_turn"], 2),
                    ms(r["tail_ms"], 2),
                )
            )
        title = f"**{c['tokens_per_second']:g} tok/s, upstream {c['upstream']}"
        blocks.append(f"{title} (ideal {c['ideal_s']:.2f} s)**\n\n{markdown(header, rows)}")
    return "\n\n".join(blocks)


def peers_before_after_tables(results: dict[str, Any]) -> str:
    """The side-by-side tables of the run with the code before issue 23 as `before`."""
    return peers_tables(results, {"hotloop@before": "hotloop before issue 23 (d10a9fd),"})


def peers_history_table(*runs: dict[str, Any]) -> str:
    """Per-turn cost against history length: one results file per length."""
    systems = [r["configurations"][0]["systems"] for r in runs]
    tokens = [s["hotloop websocket"]["input_tokens_last"] for s in systems]
    spread = f"{tokens[-1] // 1000}k / {tokens[0] // 1000}k"
    rows = []
    for label, key, field in (
        ("hotloop, CPU per turn", "hotloop websocket", "gateway_cpu_ms_per_turn"),
        ("before, CPU per turn", "hotloop@before websocket", "gateway_cpu_ms_per_turn"),
        (
            "floor (the client's own request, upstream side)",
            "floor http_full",
            "gateway_cpu_ms_per_turn",
        ),
        ("hotloop, time to first token (last 10 turns)", "hotloop websocket", "ttft_ms"),
        ("before, time to first token", "hotloop@before websocket", "ttft_ms"),
        ("floor, time to first token", "floor http_full", "ttft_ms"),
    ):
        if not all(key in s for s in systems):
            continue  # a run without `--baseline before=DIR` has no "before" rows
        values = [s[key][field] for s in systems]
        cpu = field.startswith("gateway")
        growth = f"**{values[-1] / values[0]:.2f}x**" if cpu else ""
        rows.append((label, *(ms(v, 2 if cpu else 1) for v in values), growth))
    return markdown(("history at the last turn", *(f"{t:,}" for t in tokens), spread), rows)


# bench_vllm.py's path -> (the medians' row, the per-turn rows)
VLLM_PATHS = {
    "hotloop": ("hotloop WebSocket (token ids)", "hotloop"),
    "agentic-api": ("agentic-api WebSocket (vLLM `/v1/responses`)", "agentic-api"),
    "vllm": ("vLLM `POST /v1/responses` (whole history)", "vLLM"),
}


def vllm_tables(results: dict[str, Any]) -> str:
    """One real vLLM, three paths: the medians, then every turn's time to first token."""
    (run,) = printed_json(results)
    paths = run["paths"]
    rows = []
    for name, p in paths.items():
        before = f"**{ms(median(p['before_engine_ms']))}**"
        if p["own_overhead_ms"]:
            before += f" (`hotloop_turn_overhead_seconds`: {ms(median(p['own_overhead_ms']))})"
        rows.append(
            (
                VLLM_PATHS.get(name, (name,))[0],
                f"{p['total_s']:.1f} s",
                ms(median(p["ttft_ms"]), 0),
                ms(median(p["engine_ttft_ms"]), 0),
                before,
            )
        )
    header = ("path", f"total, {run['turns']} turns", "median TTFT", "median engine TTFT")
    blocks = [
        markdown((*header, "median before the engine"), rows),
        "Per turn (time to first token, ms; the prompt is the same for the three):",
    ]
    turns = range(run["turns"])
    for first in turns[::10]:
        shown = turns[first : first + 10]
        prompt = ("prompt", *(str(paths["hotloop"]["prompt_tokens"][t]) for t in shown))
        ttft = [
            (VLLM_PATHS.get(name, (name, name))[1], *(f"{p['ttft_ms'][t]:.0f}" for t in shown))
            for name, p in paths.items()
        ]
        blocks.append(markdown(("turn", *(str(t + 1) for t in shown)), [prompt, *ttft]))
    return "\n\n".join(blocks)


UPSTREAM_ROWS = {
    "sim_{n}_streams": "`--engine sim`, the same rate",
    "upstream_{n}_streams_1_event": "upstream, 1 token per SSE event",
    "upstream_{n}_streams_4_event": "upstream, 4 tokens per SSE event",
    "upstream_{n}_streams_1_event_coalesce_1_ms": "upstream, 1 per event, `--stream-coalesce-ms 1`",
    "upstream_{n}_streams_1_event_coalesce_2_ms": "upstream, 1 per event, `--stream-coalesce-ms 2`",
    "upstream_{n}_streams_1_event_coalesce_5_ms": "upstream, 1 per event, `--stream-coalesce-ms 5`",
}


def upstream_stream_tables(results: dict[str, Any]) -> str:
    """`bench_upstream_stream.py`: whole-process CPU per streamed token in front of a
    paced fake vLLM at each number of streams, and what the server added to each token
    and to the first; then the ramp of streams, one token per event."""
    found = printed.upstream_stream(results)
    streams = sorted({int(k.split("_")[1]) for k in found if k.startswith("sim_")})

    def cell(key: str) -> str:
        if key not in found:
            return ""
        f = found[key]
        text = f"{f['whole_us']:.1f} us"
        if "token_p50_ms" in f:
            text += (
                f"; added per token {f['token_p50_ms']:.2f} / {f['token_p99_ms']:.2f} ms, "
                f"first token {f['ttft_p50_ms']:.1f} / {f['ttft_p99_ms']:.1f} ms"
            )
        return text

    rows = [
        (label, *(cell(key.format(n=n)) for n in streams))
        for key, label in UPSTREAM_ROWS.items()
        if any(key.format(n=n) in found for n in streams)
    ]
    header = ("CPU per streamed token (added p50 / p99)", *(f"{n} streams" for n in streams))
    ramp = sorted(
        (int(k.split("_")[2]), f) for k, f in found.items() if k.startswith("ramp_upstream_")
    )
    ramp_rows = [
        (
            str(n),
            f"{f['tokens_per_s']:,.0f}",
            f"{f['whole_us']:.1f} us",
            f"{f['token_p50_ms']:.2f} / {f['token_p99_ms']:.2f} ms",
            f"{f['ttft_p50_ms']:.1f} / {f['ttft_p99_ms']:.1f} ms",
        )
        for n, f in ramp
    ]
    ramp_header = ("ramp: streams", "tokens/s", "CPU per token", "added per token p50 / p99")
    ramp_header += ("added first token p50 / p99",)
    return markdown(header, rows) + "\n\n" + markdown(ramp_header, ramp_rows)


CLIENTS = {
    "httpx": "httpx (`AsyncClient.stream().aiter_raw()`, before)",
    "streams": "asyncio streams",
    "protocol": "**asyncio protocol (`hotloop.engines.http1`, chosen)**",
}


def upstream_client_table(results: dict[str, Any]) -> str:
    """`bench_upstream_client.py`: the client designs' CPU per token received."""
    found = printed.upstream_client(results)
    rows = [
        (label, f"{found[k]['us']:.2f} us", f"{found[k]['over_protocol']:.2f}x")
        for k, label in CLIENTS.items()
        if k in found
    ]
    return markdown(("client", "CPU per token received", "vs the protocol"), rows)


WHOLE_HISTORY_ROWS = {
    "hotloop websocket": "hotloop, WebSocket",
    "hotloop http_full": "hotloop, whole history",
    "hotloop+items http_full": "hotloop, whole history, items parsed (`--whole-history items`)",
    "hotloop@before http_full": "hotloop before, whole history",
    "agentic-api http_full": "agentic-api, whole history",
    "floor http_full": "client straight to the upstream",
}


CHAT_ROWS = {
    "hotloop websocket": "hotloop, WebSocket",
    "hotloop chat": "hotloop, whole history, Chat Completions",
    "hotloop http_full": "hotloop, whole history, Responses",
    "smg chat": "smg, whole history, Chat Completions (pass-through)",
    "smg http_full": "smg, whole history, Responses",
    "floor chat": "client straight to the upstream, Chat Completions",
    "floor http_full": "client straight to the upstream, Responses",
}


def chat_whole_history_tables(
    main: dict[str, Any], short: dict[str, Any], long: dict[str, Any]
) -> str:
    """`whole_history_tables` for clients that resend their whole history on Chat
    Completions (`bench_peers.py`, `chat`), beside smg's pass-through."""
    return whole_history_tables(main, short, long, CHAT_ROWS)


def whole_history_tables(
    main: dict[str, Any],
    short: dict[str, Any],
    long: dict[str, Any],
    labels: dict[str, str] = WHOLE_HISTORY_ROWS,
) -> str:
    """Clients that resend their whole history (`bench_peers.py`, `http_full`) beside the
    same loop over WebSocket: CPU per turn and loop / ideal per speed, then the same turns
    after a short and a long resumed session (`--resume-tokens`): CPU per turn after the
    first (`labels`: the rows, by system and mode)."""
    configurations = main["configurations"]
    last = configurations[0]["systems"]["hotloop websocket"]["input_tokens_last"]
    header = [f"~{tokens(last)} tokens at the last turn"]
    for c in configurations:
        speed = f"{c['tokens_per_second']:,.0f} tok/s"
        header += [f"gateway CPU / turn, {speed}", "loop / ideal"]
    rows = []
    for key, label in labels.items():
        if key not in configurations[0]["systems"]:
            continue  # a run without `--baseline before=DIR` or the variant has no row
        cells = [label]
        for c in configurations:
            r = c["systems"][key]
            cells += [
                "-" if key.startswith("floor") else ms(r["gateway_cpu_ms_per_turn"], 2),
                f"{r['loop_over_ideal']:.3f}",
            ]
        rows.append(cells)
    lengths = [run["configurations"][0]["systems"] for run in (short, long)]
    first, last = (s["hotloop websocket"]["input_tokens_last"] for s in lengths)
    growth_header = (
        f"CPU / turn after the first, {short['configurations'][0]['tokens_per_second']:,.0f} "
        "tok/s, tokens at the last turn",
        *(tokens(n) for n in (first, last)),
        f"{tokens(last)} / {tokens(first)}",
    )
    growth = [
        (
            labels[key],
            *(ms(s[key]["gateway_cpu_ms_per_later_turn"], 2) for s in lengths),
            f"{lengths[1][key]['gateway_cpu_ms_per_later_turn'] / lengths[0][key]['gateway_cpu_ms_per_later_turn']:.2f}x",  # noqa: E501
        )
        for key in labels
        if not key.startswith("floor") and all(key in s for s in lengths)
    ]
    return markdown(header, rows) + "\n\n" + markdown(growth_header, growth)
