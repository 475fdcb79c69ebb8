"""The tables of one agent's loop (docs/benchmarks-agent-loop.md) and of the pages that
measure the streaming path (steering, protocol conformance)."""

from __future__ import annotations

from statistics import median
from typing import Any

import figure_printed as printed

from figure_tables.common import (
    markdown,
    mode_label,
    ms,
    printed_json,
    span,
)


def agent_table(results: dict[str, Any]) -> str:
    """The agent-loop tables: time / ideal, server CPU per turn, time to first token
    and what the server added to it, per speed and mode."""
    rows = []
    for speed in results["speeds"]:
        for mode, run in speed["runs"].items():
            s = run["summary"]
            ratio = f"{s['ratio_to_ideal']:.3f}"
            rows.append(
                (
                    f"{speed['tokens_per_second']:,.0f}",
                    mode_label(mode),
                    f"**{ratio}**" if mode == "websocket" else ratio,
                    ms(s["server_cpu_per_turn_ms_median"]),
                    ms(s["ttft_p50_ms"], 0),
                    ms(s["added_ttft_p50_ms"]),
                )
            )
    header = ("tok/s", "mode", "time / ideal", "server CPU / turn", "TTFT p50")
    return markdown((*header, "added TTFT p50"), rows)


def agent_last_turns_table(results: dict[str, Any]) -> str:
    """The agent loop at its first speed as the conversation grows: per mode, the median
    of what the server added to the first token, then over the last five turns (the
    longest history) that and the server's CPU per turn."""
    from hotloop.lab.agent import TurnRecord
    from hotloop.lab.report import SimParameters, added_ttft_ms, usage_of

    speed = results["speeds"][0]
    sim = SimParameters(**speed["sim"])
    rows = []
    for mode, run in speed["runs"].items():
        turns = [TurnRecord(**t) for t in run["turns"]]
        added = added_ttft_ms(turns, sim, usage_of(speed["runs"], mode))
        rows.append(
            (
                mode_label(mode),
                ms(median(added)),
                span(added[-5:]),
                span([t.server_cpu_ns / 1e6 for t in turns[-5:]]),
            )
        )
    header = (f"{speed['tokens_per_second']:,.0f} tok/s", "added TTFT, median")
    return markdown((*header, "added TTFT, last 5 turns", "server CPU, last 5 turns"), rows)


def long_running_table(results: dict[str, Any]) -> str:
    """The long-running response against the `previous_response_id` chain, per speed."""
    rows = []
    for speed in results["speeds"]:
        chain = speed["runs"]["websocket"]["summary"]
        for mode, run in speed["runs"].items():
            s = run["summary"]
            versus = s["wall_s"] / chain["wall_s"]
            rows.append(
                (
                    f"{speed['tokens_per_second']:,.0f}",
                    "websocket (chain)" if mode == "websocket" else mode,
                    f"{s['ratio_to_ideal']:.3f}",
                    "1" if mode == "websocket" else f"**{versus:.4f}**",
                    ms(s["server_cpu_per_turn_ms_median"], 2),
                    ms(s["ttft_p50_ms"], 0),
                    f"{s['new_prompt_tokens_per_turn']:,.1f}",
                )
            )
    header = (
        *("tok/s", "mode", "time / ideal", "vs chain", "server CPU / round trip"),
        *("TTFT p50", "new prompt tokens / round trip"),
    )
    return markdown(header, rows)


def ws_turn_table(results: dict[str, Any]) -> str:
    """A `response.create` up to the engine call against history length, in process."""

    def tokens(n: int) -> str:
        return f"{n / 1e6:.1f}M" if n >= 1_000_000 else f"{n / 1000:.1f}k".replace(".0k", "k")

    (rows,) = printed_json(results)
    header = ("history (tokens)", "WebSocket continuation", "full history on a fresh connection")
    return markdown(
        (*header, "ratio"),
        [
            (
                tokens(r["history_tokens"]),
                ms(r["ws_p50_ms"], 3),
                ms(r["full_p50_ms"], 2),
                f"{r['full_p50_ms'] / r['ws_p50_ms']:.0f}x",
            )
            for r in rows
        ],
    )


STREAM_ROWS = {
    "whole_us": "whole server process, user + system, sim engine included",
    "send_us": "of which the kernel's loopback send of the frames",
    "own_us": "**server's own, measured in the server** (sampled: a batch's ids to its frames "
    "written)",
    "own_per_frame_us": "server's own, per frame",
    "between_us": "between batches, measured in the server (the engine's hand-over: loop "
    "wake-up, the sim's code)",
    "pacing_us": "the sim's pacing alone, measured in the bench's own process",
}


def ws_stream_table(results: dict[str, Any]) -> str:
    """`bench_ws_stream.py`: CPU per streamed token against `hotloop serve --engine sim`
    at each rate, and its parts."""
    found = printed.ws_stream(results)
    speeds = [k for k in found if k.isdigit()]
    header = [
        "per streamed token",
        *(
            f"{int(s):,} tokens/s ({found[s]['tokens_per_wakeup']:g} tokens per wake-up)"
            for s in speeds
        ),
    ]
    rows = [
        (label, *(f"{found[s][field]:.1f} us" for s in speeds))
        for field, label in STREAM_ROWS.items()
    ]
    return markdown(header, rows)


STEER_PATHS = {
    "steer": "steer (steer frame to the successor's `Generate`)",
    "append": "2 KB append (`response.create` continuation to its `Generate`)",
    "re-render": "re-render of the whole history + 2 KB",
}


def steer_table(results: dict[str, Any]) -> str:
    """A steer against an append and a re-render, in process (bench_steer.py)."""
    (run,) = printed_json(results)
    medians = run["median_ms"]
    rows = [
        (STEER_PATHS.get(path, path), f"{v:.3f} ms" if v < 1 else ms(v))
        for path, v in medians.items()
    ]
    rows += [
        ("steer / append", f"{medians['steer'] / medians['append']:.2f}"),
        ("re-render / steer", f"{medians['re-render'] / medians['steer']:.0f}"),
    ]
    return markdown(("path", "median"), rows)


def ws_deflate_table(results: dict[str, Any]) -> str:
    """permessage-deflate on a coding agent's traffic, then the whole server A/B."""
    (run,) = printed_json(results)
    server, client, cpu = run["server_bytes"], run["client_bytes"], run["server_us_per_token"]
    frames = run["server_frames"]
    per_frame = f"{server['raw'] / frames:.0f} B -> {server['deflated'] / frames:.0f} B per frame"
    client_raw = f"{client['raw'] / run['client_frames'] / 1024:.0f} KB per frame raw"
    rows = [
        (
            "server -> client bytes, deflated / raw",
            f"{server['deflated'] / server['raw']:.2f} ({per_frame})",
        ),
        (
            "client -> server bytes, deflated / raw",
            f"{client['deflated'] / client['raw']:.2f} ({client_raw})",
        ),
        ("CPU to deflate one server frame", f"{run['deflate_us_per_server_frame']:.1f} us"),
        (
            "CPU to inflate one client frame (a `response.create` with a tool output)",
            f"{run['inflate_us_per_client_frame']:.0f} us",
        ),
        ("deflate + inflate per streamed token", f"{run['deflate_inflate_us_per_token']:.2f} us"),
        (
            "whole server at 4,000 tokens/s, CPU per token, deflate off / on (median of "
            "per-round ratios)",
            f"{cpu['off']:.1f} / {cpu['on']:.1f} us ({cpu['on_over_off']:.2f}x)",
        ),
    ]
    return markdown(("this machine", f"{run['steps']} steps, {run['rounds']} rounds"), rows)


def printed_table(results: dict[str, Any]) -> str:
    """The table a figure's first command prints as markdown, with no JSON line
    (bench_mcp_loop.py, bench_template_append.py): its recorded rows, as they are."""
    lines = results["runs"][0]["stdout"].splitlines()
    return "\n".join(line for line in lines if line.startswith("|"))
