"""The tables the docs print, one renderer per figures block: a results document (or
several) in, markdown out. benches/figures.py registers each in TABLES and writes it
between its page's `<!-- figures:NAME -->` markers; the values a script printed as text
only are read back by benches/figure_printed.py."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from statistics import median
from typing import Any

import figure_printed as printed

Cells = Sequence[str]


def markdown(header: Cells, rows: Iterable[Cells]) -> str:
    """A markdown table, as docs/ writes them."""
    line = "| {} |".format
    return "\n".join(
        [line(" | ".join(header)), "|" + "---|" * len(header)]
        + [line(" | ".join(row)) for row in rows]
    )


def printed_json(results: dict[str, Any], command: int = 0) -> list[Any]:
    """The JSON lines one of a figure's commands printed (`run` keeps them)."""
    found: list[Any] = results["runs"][command]["json"]
    return found


def ms(value: float, decimals: int = 1) -> str:
    return f"{value:,.{decimals}f} ms"


def mode_label(mode: str) -> str:
    """`peer_open-model_http_full` -> `peer (open-model), http_full`."""
    if not mode.startswith("peer_"):
        return mode
    peer, rest = mode.removeprefix("peer_").split("_", 1)
    return f"peer ({peer}), {rest}"


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


def load_table(results: dict[str, Any]) -> str:
    """docs/benchmarks-capacity.md's concurrency table, per worker count and number of agents."""
    header = (
        *("workers", "agents", "turns/s", "streamed tok/s", "TTFT p50", "TTFT p99"),
        *("server CPU", "client CPU", "RSS / connection"),
    )
    rows = [
        (
            str(p["workers"]),
            str(p["agents"]),
            f"{p['turns_per_s']:.1f}",
            f"{p['tokens_per_s']:,.0f}",
            ms(p["ttft_p50_ms"], 0),
            ms(p["ttft_p99_ms"], 0),
            f"{p['server_cpu_cores']:.2f} cores",
            f"{p['client_cpu_cores']:.2f}",
            f"{p['rss_per_connection_kb']:.0f} KB",
        )
        for series in results["series"]
        for p in series["points"]
    ]
    return markdown(header, rows)


BURST_HEADER = (
    *("", "burst done", "probe's worst wait for `response.created`", "probe p50"),
    *("handshake p50 / max",),
)


def burst_row(label: str, runs: list[dict[str, float]]) -> Cells:
    """bench_load_burst.py's figures, medians over `runs`."""

    def m(field: str) -> float:
        return median(r[field] for r in runs)

    return (
        label,
        f"{m('burst_s'):.2f} s",
        ms(m("probe_created_max_ms"), 0),
        ms(m("probe_created_p50_ms"), 0),
        f"{m('handshake_p50_ms'):.0f} / {ms(m('handshake_max_ms'), 0)}",
    )


def load_burst_before_after_table(results: dict[str, Any]) -> str:
    """The burst of large first requests, before and after they were rendered off the
    loop: medians of the alternated runs."""
    return markdown(
        BURST_HEADER,
        [
            burst_row("before (render on the loop)", results["before"]["runs"]),
            burst_row("after (render in a thread)", results["after"]["runs"]),
        ],
    )


def store_fairness_before_after_table(results: dict[str, Any]) -> str:
    """Another key's commit under one key's large responses, before and after issue 39's
    writer, per run (interleaved): the median of the rounds' attacked/quiet ratios, and
    after it the range of the rounds'."""
    runs = results["runs"]
    header = ["store", "A's responses"]
    for n in range(1, len(runs) + 1):
        header += [f"before, run {n}", f"after, run {n} (rounds)"]
    stores = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
    rows = []
    for i, first in enumerate(runs[0]["rows"]):
        cells = [stores[first["store"]], f"`{first['shape']}`"]
        for run in runs:
            before, after = run["rows"][i]["before"], run["rows"][i]["current"]
            rounds = after["rounds"]
            cells += [
                f"{before['ratio']:.2f}x",
                f"{after['ratio']:.2f}x ({min(rounds):.2f}-{max(rounds):.2f}x)",
            ]
        rows.append(cells)
    return markdown(header, rows)


def load_burst_table(results: dict[str, Any]) -> str:
    """The same burst, one run of the current code (`make figures`)."""
    return markdown(BURST_HEADER, [burst_row("this commit, one run", printed_json(results))])


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


# bench_turns.py's engine -> the docs' row
TURNS_ENGINES = {
    "llama (SmolLM2-135M)": "`llama` (SmolLM2-135M)",
    "sim at 1,000 tok/s": "`sim` at 1,000 tok/s",
}


def turns_table(results: dict[str, Any]) -> str:
    """A tool-replay conversation over WebSocket and over stateless HTTP, per engine."""
    (medians,) = printed_json(results)
    rows = [
        (
            TURNS_ENGINES.get(name, name),
            f"{m['websocket_s']:.2f} s",
            f"{m['http_s']:.2f} s",
            f"{m['http_s'] / m['websocket_s']:.2f}",
        )
        for name, m in medians.items()
    ]
    return markdown(("engine", "WebSocket", "HTTP (full history)", "HTTP/WS"), rows)


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


def capacity_tables(results: dict[str, Any]) -> str:
    """The capacity sweep: every point, then the headline per system and mode."""

    def signed(point: dict[str, Any], q: str) -> str:
        value = point.get(f"added_ttft_{q}_ms")
        return "" if value is None else f"{value:+.1f}"

    rows = []

    def order(p: dict[str, Any]) -> tuple[int, bool, str, str]:
        return (p["agents"], p["system"] != "direct", p["mode"], p["system"])

    for p in sorted(results["points"], key=order):
        server = p["server"]
        cpu = server.get("gateway_cpu_ms_per_turn")
        saturated = "; ".join(p["saturated"]) or "no"
        rows.append(
            (
                str(p["agents"]),
                f"{p['system']} {p['mode']}",
                f"{p['context_mean_tokens'] / 1e3:.0f}k",
                f"{p['turns_per_s']:.1f}",
                f"{p['ttft_p50_ms']:.1f} / {p['ttft_p99_ms']:.1f}",
                "(the floor)"
                if p["system"] == "direct"
                else " / ".join(signed(p, q) for q in ("p50", "p99", "max")),
                "" if cpu is None else f"{server['gateway_cpu_cores']:.2f} / {cpu:.1f} ms",
                "" if cpu is None else f"{server['rss_per_agent_mb']:.2f} MB",
                f"{p['client_cpu_cores']:.2f} / {server['upstream_cpu_cores']:.2f}",
                str(p["errors"]),
                saturated,
            )
        )
    header = (
        *("agents", "system", "context", "turns/s", "TTFT p50 / p99 ms"),
        *("added p50 / p99 / max ms", "gateway cores / CPU per turn", "RSS / agent"),
        *("client / fake cores", "errors", "saturated"),
    )
    heads = []
    for key, best in results["headline"].items():
        if best is None:
            heads.append((key, "never met", "", "", ""))
            continue
        heads.append(
            (
                key,
                str(best["agents"]),
                f"{best['added_ttft_p99_ms']:+.1f} ms",
                f"**{best['turns_per_s_per_core']:.0f}**",
                f"{best['agents_per_core_at_session_think_times']:,.0f}",
            )
        )
    head_header = (
        *("system", "most agents meeting the target", "added p99 there"),
        *("turns/s per gateway core", "agents per core at the sessions' think times"),
    )
    return markdown(header, rows) + "\n\n" + markdown(head_header, heads)


def prewarm_table(results: dict[str, Any]) -> str:
    (run,) = printed_json(results)
    return markdown(
        ("turn", "TTFT"),
        [
            ("cold (the whole prompt evaluated)", ms(run["cold_ttft_ms"], 0)),
            ("after a prewarm (one id evaluated)", ms(run["prewarmed_ttft_ms"], 0)),
            ("ratio cold/prewarmed", f"{run['ratio_cold_over_prewarmed']:.0f}"),
        ],
    )


def http_turn_table(results: dict[str, Any]) -> str:
    (run,) = printed_json(results)
    return markdown(
        ("sent as", "server time to the engine, p50", "p50 of the last 10 turns"),
        [
            (
                "`previous_response_id`",
                ms(run["previous_p50_ms"], 2),
                ms(run["previous_last10_p50_ms"], 2),
            ),
            ("full history", ms(run["full_p50_ms"]), ms(run["full_last10_p50_ms"])),
            ("full / previous (last 10)", "", f"{run['full_over_previous_last10']:.1f}x"),
        ],
    )


def store_sigkill_table(results: dict[str, Any]) -> str:
    """bench_store.py sigkill's JSON line: responses acknowledged and lost to SIGKILL."""
    section = printed_json(results, 0)[-1]
    runs = section["runs"]
    acknowledged = sum(r["acknowledged"] for r in runs)
    lost = sum(r["lost"] for r in runs)
    per_run = ", ".join(str(r["lost"]) for r in runs)
    shown = f"{lost} ({lost / acknowledged:.1%}; {per_run} per run)" if lost else "**0**"
    label = (
        "commit before acknowledge"
        if section["tree"] == "this"
        else f"before (put after the terminal event, `--tree {section['tree']}`)"
    )
    return markdown(("code", "acknowledged", "lost"), [(label, f"{acknowledged:,}", shown)])


STORES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


def store_commit_table(results: dict[str, Any]) -> str:
    """bench_store.py commit's JSON line: group commit per window and concurrency."""
    section = printed_json(results, 1)[-1]
    rows = [
        (
            f"{STORES[section['store']]}, {r['window_ms']:g} ms",
            str(r["together"]),
            ms(r["wait_p50_ms"]),
            ms(r["wait_p99_ms"]),
            f"{r['commits_per_s']:,.0f}",
            f"{r['responses_per_s']:,.0f}",
        )
        for r in section["runs"]
    ]
    header = ("store, window", "N at once", "wait p50", "wait p99", "commits/s", "responses/s")
    return markdown(header, rows)


FAULTS = {"kill": "SIGKILL", "hang": "SIGSTOP", "drain": "drain", "store": "PostgreSQL stopped"}


def failover_faults_table(results: dict[str, Any]) -> str:
    rows = []
    for kind, f in results["faults"].items():
        detected = f["detection_s"]
        rows.append(
            (
                FAULTS.get(kind, kind),
                str(f["acknowledged"]),
                f"**{f['acknowledged_lost']}**",
                str(f["failed_responses"]),
                f"{f['conversations_finished']}/{f['conversations']}",
                f"{f['prompts_identical_to_control']}/{f['runs']} runs",
                f"{f['failover_p50_s']:.2f} s / {f['failover_p99_s']:.2f} s",
                f"{min(detected):.2f}-{max(detected):.2f} s" if detected else "",
            )
        )
    header = (
        *("fault", "acknowledged", "acknowledged lost", "failed responses"),
        *("conversations finished", "prompts identical to the undisturbed run"),
        *("failover p50 / p99 (fault to the first delta of the retried turn)",),
        *("HAProxy took the node out after",),
    )
    return markdown(header, rows)


def failover_continuation_table(results: dict[str, Any]) -> str:
    rows = [
        (
            f"{c['history_tokens'] // 1000}k tokens",
            ms(c["same_node_ms"], 0),
            ms(c["other_node_ms"], 0),
            str(c["samples"]),
        )
        for c in results["continuation"]
    ]
    return markdown(("history", "same node", "other node", "chains (median)"), rows)


def failover_prefix_cache_table(results: dict[str, Any]) -> str:
    rows = [
        (
            p["routing"],
            f"{round(p['history_hits'] * p['turns_after_a_node_change'])}/"
            f"{p['turns_after_a_node_change']} ({p['history_hits']:.0%})",
            f"{p['prefill_tokens_per_turn']:,.0f}",
            f"{p['cached_share']:.0%}",
        )
        for p in results["prefix_cache"]
    ]
    header = ("routing", "history hits", "prefill tokens per turn", "prompt tokens cached")
    return markdown(header, rows)


def printed_table(results: dict[str, Any]) -> str:
    """The table a figure's first command prints as markdown, with no JSON line
    (bench_mcp_loop.py, bench_template_append.py): its recorded rows, as they are."""
    lines = results["runs"][0]["stdout"].splitlines()
    return "\n".join(line for line in lines if line.startswith("|"))


def attacker(figures: dict[str, Any]) -> str:
    """What an abuse scenario's attacker did, `{"refused": {"x": 8}}` -> `refused x 8`."""
    return ", ".join(
        f"{key} {attacker(value) if isinstance(value, dict) else value}"
        for key, value in figures.items()
    )


def abuse_table(results: dict[str, Any]) -> str:
    """The abuse suite's victim per scenario, from the rows bench_abuse.py prints as one
    JSON list after its text lines."""
    rows = [
        (
            r["attack"],
            f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f} ms",
            f"{r['peak_rss_mib']} MiB",
            str(r["loop_stalls"]),
            attacker(
                {**r["attacker"], **{k[9:]: v for k, v in r.items() if k.startswith("attacker_")}}
            ),
        )
        for r in printed_json(results)[-1]
    ]
    header = ("scenario (in run order)", "victim p50 / p99", "peak RSS", "loop stalls")
    return markdown((*header, "the attacker"), rows)


def frames_tables(before: dict[str, Any], now: dict[str, Any]) -> str:
    """Bodies of tiny compressed frames (`bench_body_attack.py frames`): the server's CPU
    per body before issue 39's bound (the kept runs of b43205f) and now, refused and
    decoded whole past the bound; then another key's requests during the attack."""
    runs_before = [r["json"][-1] for r in before["runs"] if r["code"].startswith("before")]
    refused, whole = printed_json(now, 0)[-1], printed_json(now, 1)[-1]

    def decoded(run: dict[str, Any], encoding: str, mib: float) -> dict[str, Any] | None:
        found = [d for d in run["decode"] if d["encoding"] == encoding and d["mib"] == mib]
        return found[0] if found else None

    def then(encoding: str, mib: float) -> str:
        found = [d for r in runs_before if (d := decoded(r, encoding, mib)) is not None]
        if not found:
            return "not run"
        walls = sorted(d["seconds"] for d in found)
        wall = f"{walls[0]:.0f} s" if len(walls) == 1 else f"{walls[0]:.1f}-{walls[-1]:.0f} s"
        cpu = [d["cpu_seconds"] for d in found if "cpu_seconds" in d]
        return f"{cpu[0]:.1f} s ({wall})" if cpu else f"({wall})"

    def cpu(run: dict[str, Any], encoding: str, mib: float) -> str:
        found = decoded(run, encoding, mib)
        return "" if found is None else f"{found['cpu_seconds']:.3f} s (`{found['code']}`)"

    rows = [
        (
            f"{encoding} {mib:g} MiB",
            then(encoding, mib),
            cpu(refused, encoding, mib),
            cpu(whole, encoding, mib),
        )
        for encoding in ("gzip", "zstd")
        for mib in sorted({d["mib"] for d in refused["decode"]})
    ]
    header = (
        *("body", "before: server CPU (wall)", "now: server CPU (refused)"),
        *("now, `--max-compressed-frames 100000000`: decoded whole",),
    )

    def victim(label: str, run: dict[str, Any]) -> Cells:
        quiet = run["quiet"]["post_p50_ms"]
        return (
            label,
            ms(quiet),
            f"{ms(run['uploading']['post_p50_ms'])} ({run['uploading_post_p50_ratio']:.2f}x)",
            f"{ms(run['decoding']['post_p50_ms'])} ({run['decoding_post_p50_ratio']:.2f}x)",
            ms(run["decoding"]["post_max_ms"], 0),
        )

    victims = [victim(f"before, run {n}", r) for n, r in enumerate(runs_before, 1)]
    victims += [victim("now", refused), victim("now, decoded whole", whole)]
    victim_header = (
        *("another key's 100 KB requests, p50", "quiet", "while 1 MiB is uploaded plain"),
        *("while it is posted as gzip members", "max, gzip"),
    )
    return markdown(header, rows) + "\n\n" + markdown(victim_header, victims)


# ---------------------------------------------------------------- the core's parts
# These read `figure_printed`'s documents (the pytest-benchmark runs print text only).

FAMILIES = {
    "o200k_base": "o200k_base",
    "smollm2": "SmolLM2 (GGUF)",
    "llama3_1": "Llama 3.1",
    "qwen3": "Qwen3",
    "deepseek_v3": "DeepSeek V3",
    "gemma3": "Gemma 3",
    "llama2": "Llama 2",
    "tekken": "Mistral tekken",
    "mistral_v7": "Mistral v7 (`.model`)",
}
PATHOLOGICAL = {
    "A": '`"A" * n`',
    "spaces": "n spaces",
    "base64": "base64 blob",
    "digits": "digit run",
    "newlines": "mixed newlines",
    "tabs-and-spaces": '`" \\t" * n`',
    "punctuation": '`"!?" * n`',
    "combining": '`"a"` + n combining accents',
}


def tokens(n: float) -> str:
    """1231 -> `1.2k`, 1000400 -> `1.0M`."""
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k".replace(".0k", "k")


def microseconds(value: float) -> str:
    return f"{value:,.0f} us" if value >= 100 else f"{value:.1f} us"


def append_table(results: dict[str, Any]) -> str:
    """`bench_append.py`: a 2 KB tool output appended against the whole history
    re-rendered, and the cache's memory over 4 bytes a token plus the items' bytes."""
    micro = printed.microbenchmarks(results)
    rows = [
        (
            f"{tokens(f['history_tokens'])} tokens",
            microseconds(f["append_us"]),
            ms(f["full_us"] / 1000, 2 if f["full_us"] < 10_000 else 1),
            f"{f['full_over_append']:,.0f}x",
            f"{f['append_over_1k_append']:.2f}",
            f"{f['memory_over_ideal']:.2f}",
        )
        for f in micro["append"]["figures"]["append_vs_full_render"].values()
    ]
    header = ("history", "append 2 KB", "full re-render + encode", "full / append")
    return markdown((*header, "append vs 1k history", "memory / ideal"), rows)


VALIDATED = {
    "delta_2kb": "2 KB delta (one tool result)",
    "history_200kb": "200 KB full history (~100 items, 10 tools)",
    "delta_2kb_with_agent_tools": "2 KB delta + a coding agent's 46 KB tool list",
}


def validate_table(results: dict[str, Any]) -> str:
    """`bench_validate.py`: parse and validate per frame, per byte, against
    `orjson.loads` of the same frame."""
    micro = printed.microbenchmarks(results)
    figures, medians = micro["validate"]["figures"], micro["validate"]["median_us"]
    ratios = figures["per_byte_cost_ratios"]
    orjson = {
        "delta_2kb": ratios["delta_vs_orjson_loads"],
        "history_200kb": ratios["history_vs_orjson_loads"],
    }
    rows = [
        (
            label,
            microseconds(medians["parse_and_validate"][frame]),
            f"{medians['parse_and_validate'][frame] * 1000 / figures['parse_and_validate'][frame]['frame_bytes']:.1f} ns",  # noqa: E501
            f"{orjson[frame]:.1f}x" if frame in orjson else "",
        )
        for frame, label in VALIDATED.items()
    ]
    scan = medians["policy_scan"]
    rows.append(
        (
            "policy scan of the 200 KB history, 1,000 patterns",
            microseconds(scan),
            f"{scan * 1000 / figures['policy_scan']['input_bytes']:.1f} ns",
            "",
        )
    )
    header = ("frame", "parse + validate", "per byte", "vs `orjson.loads` of the same frame")
    return markdown(header, rows)


def encode_table(results: dict[str, Any]) -> str:
    """`bench_tokenize.py`: hotloop's encode against tiktoken and llama.cpp."""
    micro = printed.microbenchmarks(results)
    figures = micro["tokenize"]["figures"]
    rows = [
        (
            label,
            f"{f['ours_mb_s']:.1f} MB/s",
            f"{f['reference_mb_s']:.1f} MB/s",
            f"{f['ratio']:.2f}x",
        )
        for label, f in (
            ("o200k_base vs tiktoken", figures["encode_vs_tiktoken"]["o200k_base"]),
            ("cl100k_base vs tiktoken", figures["encode_vs_tiktoken"]["cl100k_base"]),
            ("SmolLM2 vs llama.cpp (llama-cpp-python)", figures["encode_vs_llama_cpp"]),
        )
    ]
    return markdown(("encode", "hotloop", "reference", "ratio"), rows)


def family_encode_table(results: dict[str, Any]) -> str:
    """`bench_tokenize.py`: each open-model family against Hugging Face `tokenizers` (or
    `mistral-common`), and against tiktoken running the same vocabulary."""
    micro = printed.microbenchmarks(results)
    figures = micro["tokenize"]["figures"]
    hf = dict(figures["family_encode_vs_hugging_face"])
    hf["mistral_v7"] = figures["sentencepiece_encode_vs_mistral_common"]
    tiktoken = figures["family_encode_vs_tiktoken"]
    rows = []
    for family, label in FAMILIES.items():
        if family not in hf and family not in tiktoken:
            continue
        cells = [label]
        against = hf.get(family)
        same = tiktoken.get(family)
        cells.append(f"{(against or same)['ours_mb_s']:.1f} MB/s")  # type: ignore[index]
        cells += (
            [f"{against['reference_mb_s']:.1f} MB/s", f"**{against['ratio']:.1f}x**"]
            if against
            else ["", ""]
        )
        cells += (
            [f"{same['reference_mb_s']:.1f} MB/s", f"**{same['ratio']:.2f}x**"]
            if same
            else ["", ""]
        )
        rows.append(cells)
    header = ("family", "hotloop", "Hugging Face (`mistral-common` for v7)", "ratio")
    return markdown((*header, "tiktoken, same vocabulary", "ratio"), rows)


def linear_time_table(results: dict[str, Any]) -> str:
    """`bench_tokenize.py`'s pathological inputs: CPU ns per byte at 10 KB and 1 MB, and
    their ratio (flat: linear), per family."""
    micro = printed.microbenchmarks(results)
    growth = micro["tokenize"]["figures"]["pathological_growth"]
    families = [f for f in FAMILIES if f"{f}-A" in growth]
    rows = []
    for key, label in PATHOLOGICAL.items():
        cells = [label]
        for family in families:
            g = growth[f"{family}-{key}"]
            small, large = g["ns_per_byte_10000"], g["ns_per_byte_1000000"]
            cells.append(f"{small:.0f} / {large:.0f} ({g['growth_1m_vs_10k']:.2f})")
        rows.append(cells)
    return markdown(("input", *(FAMILIES[f] for f in families)), rows)


def incremental_append_table(results: dict[str, Any]) -> str:
    """`bench_tokenize.py`: a 2 KB chunk appended to a text of 10 KB, 100 KB and 1 MB,
    against encoding the 1 MB text again."""
    micro = printed.microbenchmarks(results)
    appends = micro["tokenize"]["figures"]["incremental_append"]
    rows = [
        (
            FAMILIES[family],
            *(microseconds(appends[family][f"append_us_{n}"]) for n in (10000, 100000, 1000000)),
            ms(appends[family]["full_encode_1m_us"] / 1000, 0),
            f"{appends[family]['full_vs_append_1m']:,.0f}x",
        )
        for family in FAMILIES
        if family in appends
    ]
    header = ("family", "10 KB", "100 KB", "1 MB", "full re-encode of 1 MB", "full / append")
    return markdown(header, rows)


def parsers_table(results: dict[str, Any]) -> str:
    """`bench_format.py`: the output parsers per token, against decoding the same ids."""
    micro = printed.microbenchmarks(results)
    parsers = micro["format"]["figures"]["parser_cost_per_token"]
    rows = [
        (
            label,
            f"{p['tokens']:,.0f}",
            f"{p['parse_ns_per_token']:.0f} ns",
            f"{p['decode_ns_per_token']:.0f} ns",
            f"{p['parse_over_decode']:.1f}x",
            f"{p['budget_headroom']:.0f}x",
        )
        for label, p in (("harmony", parsers["harmony"]), ("ChatML (SmolLM2)", parsers["chatml"]))
    ]
    header = ("format", "tokens", "parse per token", "decode per token", "parse / decode")
    return markdown((*header, "under the `10 us` budget"), rows)


def engines_table(results: dict[str, Any]) -> str:
    """`bench_engines.py`: the embedded llama engine against the same model behind
    `llama-server`, medians."""
    engines = printed.engines(results)
    llama, upstream = engines["llama"], engines["upstream"]
    rows = [
        (
            label,
            ms(e["cold_ttft_ms"], 0),
            ms(e["warm_ttft_ms"], 0),
            f"{e['decode_tok_s']:.0f} tok/s",
        )
        for label, e in (
            ("`llama` (in-process)", llama),
            ("`upstream` -> `llama-server` (llamacpp dialect, loopback)", upstream),
        )
    ]
    rows.append(
        (
            "ratio upstream / llama",
            *(
                f"{upstream[k] / llama[k]:.2f}"
                for k in ("cold_ttft_ms", "warm_ttft_ms", "decode_tok_s")
            ),
        )
    )
    return markdown(("engine", "cold TTFT", "warm TTFT (turn 2)", "decode"), rows)


def times(ratio: float) -> str:
    """A ratio at the precision its size needs: 2,451x, 13.9x, 0.62x."""
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.1f}x" if ratio >= 10 else f"{ratio:.2f}x"


def ratios_table(results: dict[str, Any]) -> str:
    """`make bench-ci`'s checks as the run printed them (the bounds they assert are in
    the tests)."""
    checks = printed.ratios(results)
    rows = [(label, times(value)) for label, value in checks.items() if label != "store"]
    store = checks["store"]
    rows.append(
        (
            f"`test_store_ratios.py`: {store['responses']:.0f} responses, one commit each / "
            f"grouped (SQLite; {store['commits']:.0f} commits)",
            f"{store['ratio']:.1f}x",
        )
    )
    (peers,) = [line for line in printed_json(results) if "cpu_per_turn_ratio" in line]
    rows += [
        (
            "`test_peers_ratios.py`: hotloop / agentic-api, CPU per turn",
            times(peers["cpu_per_turn_ratio"]),
        ),
        (
            "`test_peers_ratios.py`: hotloop / agentic-api, loop / ideal",
            times(peers["loop_over_ideal_ratio"]),
        ),
    ]
    return markdown(("check", "measured"), rows)


# ---------------------------------------------------------------- one agent's loop


def span(values: Sequence[float], unit: str = "ms") -> str:
    low, high = min(values), max(values)
    return f"{low:.0f}-{high:.0f} {unit}" if round(low) != round(high) else f"{low:.0f} {unit}"


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


# ---------------------------------------------------------------- beside other gateways

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


# ---------------------------------------------------------------- storage and several nodes


def turn_costs_table(results: dict[str, Any]) -> str:
    """`bench_commit_tail.py`, `bench_frame_hops.py`, `bench_turn_logs.py`: the commit
    tail per durability setting, a large continuation frame's hops, the log lines."""
    tail = printed_json(results, 0)[-1]["median_ms"]
    hops = printed_json(results, 1)[-1]
    logs = printed_json(results, 2)[-1]
    rows = [
        (
            f"last delta -> `response.completed`, `store: true`, `{setting}` (median)",
            ms(tail[f"hotloop {setting}"], 2),
        )
        for setting in ("power-loss", "process-crash")
    ]
    rows += [
        (
            f"a `{hops['kb']} KB` continuation frame to the engine call, {label} (median / p90)",
            f"{ms(hops['median_us'][side] / 1000, 2)} / {ms(hops['p90_us'][side] / 1000, 2)}",
        )
        for side, label in (
            ("before", "parsed off the loop (two thread hops)"),
            ("after", "parsed on the loop, rendered off it (one hop)"),
        )
    ]
    rows.append(("the two log lines of a turn (median)", f"{logs['median_us']['current']:.1f} us"))
    return markdown(("per turn", "measured"), rows)


def store_dedup_table(results: dict[str, Any]) -> str:
    """`bench_store.py dedup`: the SQLite file of one session with its tool list stored
    in every response, and stored once."""
    dedup = printed_json(results, 2)[-1]
    inline, once = dedup["file_bytes_list_inline"], dedup["file_bytes_list_once"]
    rows = [
        ("the list in every response (the first release's schema)", f"{inline:,}"),
        ("the list kept once", f"{once:,}"),
        ("every response / once", f"{inline / once:.1f}x"),
    ]
    header = (f"{dedup['turns']} turns, a {dedup['tool_list_bytes']:,}-byte tool list", "bytes")
    return markdown(header, rows)


# ---------------------------------------------------------------- hardening fixes


def hardening_15_table(results: dict[str, Any]) -> str:
    """`bench_hardening.py` and `bench_queue_memory.py` on the current code: issue 15's
    items 3, 4, 6 and 7 (each test named on the page fails on the code before them)."""
    found = printed.hardening(results)
    checks, queue = found["checks"], found["queue"]
    soft, hard = checks["4_server_open_files_soft_hard"]
    rows = [
        (
            "3: HTTP continuation after a socket continued the same response and closed",
            ", ".join(str(s) for s in checks["3_http_continuations_after_the_socket_closed"]),
        ),
        (
            "3: the other of two sockets continuing one stored response, after the first closes",
            f"`{checks['3_the_other_socket_continues']}`",
        ),
        (
            "4: a legitimate request while `1,100` connections hold half a request",
            checks["4_legitimate_request"],
        ),
        (
            "4: half-open connections answered or closed by the server",
            checks["4_half_open_closed_by_the_server"],
        ),
        ("4: the server's soft / hard open-files limit", f"{soft} / {hard}"),
        (
            "7: `GET .../input_items?limit=%C2%B2`, `limit=` 5,000 digits",
            f"{checks['7_limit_sup2']}, {checks['7_limit_5000_digits']}",
        ),
        (
            "7: continuing a response on its socket after `DELETE` over HTTP",
            f"`{checks['7_continue_after_delete']}`",
        ),
        (
            "7: `/metrics` labels a key with its SHA-256 prefix",
            "yes" if checks["7_metrics_label_is_sha256_of_key"] else "no",
        ),
        ("6: RSS per queued byte", f"{queue['rss_per_queued_byte']:.2f}"),
    ]
    return markdown(("check", "this code"), rows)


def hardening_21_table(results: dict[str, Any]) -> str:
    """The issue 21 scripts on the current code, one row per defect they reproduce."""
    body, flood, reads, booking, leak, rebuild = (printed_json(results, i)[-1] for i in range(6))
    fairness = printed_json(results, 6)[:2]
    bounded = reads["max_reads_per_key=2"]
    unbounded = reads["max_reads_per_key=1000"]
    read_ms = flood["median_256k_read_ms"]
    booked = "; ".join(
        f"{path} {b['responses']} responses, {b['input_tokens']:,} in, {b['output_tokens']:,} out"
        for path, b in booking.items()
        if isinstance(b, dict)
    )
    rows = [
        (
            f"defect 1: `GET /health` on new connections while {body['cap']} keyless clients "
            f"hold every place of `--max-connections {body['cap']}`",
            f"{body['health_200']} of {body['health_total']} answered 200",
        ),
        (
            "defect 8: RSS growth for a `512 MiB` event line without a newline",
            f"{flood['endless_line_rss_growth_mib']['bounded_16mib']} MiB "
            "(`--upstream-max-line-bytes`), then `upstream_protocol`",
        ),
        (
            "minor: loop time of one `256 KiB` read of comments / empty `data:` events / "
            "one-token events",
            f"{read_ms['comments']:.2f} / {read_ms['empty_events']:.2f} / "
            f"{read_ms['token_events']:.2f} ms",
        ),
        (
            "minor: another key's `GET` median while one key runs `16` readers of a `6 MB` "
            "`input_items` page, quiet / attacked",
            f"{bounded['quiet_ms']:.2f} / {bounded['attacked_ms']:.2f} ms "
            f"({bounded['ratio']:.1f}x; {unbounded['attacked_ms']:.2f} ms with "
            "`--max-reads-per-key 1000`)",
        ),
        (
            f"defect 2: engine work booked for clients that leave ({booking['requests']} each)",
            booked,
        ),
        (
            f"defect 6: {leak['sockets']} idle sockets of one key, refused steered continuations",
            f"{', '.join(f'{n} `{code}`' for code, n in leak['refusals'].items())}; "
            f"{leak['queued_mib']:.1f} MiB held",
        ),
        (
            "defect 9: another tenant's median turn while a 1M-token chain is rebuilt, quiet / "
            "attacked",
            f"{rebuild['victim_quiet_p50_ms']:.1f} / {rebuild['victim_attacked_p50_ms']:.1f} ms "
            f"({rebuild['ratio']:.2f}x; a rebuild {rebuild['rebuild_median_ms']:.0f} ms)",
        ),
        *(
            (
                f"target: another key's `store: true` commit while one key writes large "
                f"responses ({STORES[f['store']]}), quiet / attacked",
                f"{f['quiet']['p50_ms']:.2f} / {f['attacked']['p50_ms']:.2f} ms "
                f"({f['ratio']:.2f}x)",
            )
            for f in fairness
        ),
    ]
    return markdown(("check", "this code"), rows)


# ---------------------------------------------------------------- whole-history clients

WHOLE_HISTORY_ROWS = {
    "hotloop websocket": "hotloop, WebSocket",
    "hotloop http_full": "hotloop, whole history",
    "hotloop@before http_full": "hotloop before, whole history",
    "agentic-api http_full": "agentic-api, whole history",
    "floor http_full": "client straight to the upstream",
}


def whole_history_tables(main: dict[str, Any], short: dict[str, Any], long: dict[str, Any]) -> str:
    """Clients that resend their whole history (`bench_peers.py`, `http_full`) beside the
    same loop over WebSocket: CPU per turn and loop / ideal per speed, then CPU per turn
    from the shortest history to the longest."""
    configurations = main["configurations"]
    last = configurations[0]["systems"]["hotloop websocket"]["input_tokens_last"]
    header = [f"~{tokens(last)} tokens at the last turn"]
    for c in configurations:
        speed = f"{c['tokens_per_second']:,.0f} tok/s"
        header += [f"gateway CPU / turn, {speed}", "loop / ideal"]
    rows = []
    for key, label in WHOLE_HISTORY_ROWS.items():
        if key not in configurations[0]["systems"]:
            continue  # a run without `--baseline before=DIR` has no "before" rows
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
        f"CPU / turn, {short['configurations'][0]['tokens_per_second']:,.0f} tok/s",
        *(tokens(n) for n in (first, last)),
        f"{tokens(last)} / {tokens(first)}",
    )
    growth = [
        (
            WHOLE_HISTORY_ROWS[key],
            *(ms(s[key]["gateway_cpu_ms_per_turn"], 2) for s in lengths),
            f"{lengths[1][key]['gateway_cpu_ms_per_turn'] / lengths[0][key]['gateway_cpu_ms_per_turn']:.2f}x",  # noqa: E501
        )
        for key in ("hotloop websocket", "hotloop http_full", "agentic-api http_full")
    ]
    return markdown(header, rows) + "\n\n" + markdown(growth_header, growth)


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


def tool_schema_tables(results: dict[str, Any]) -> str:
    """`bench_tool_schema.py`: CPU per property of one tool's schema against its size;
    `bench_tool_stall.py`: another connection's turns while one sends huge tool lists."""
    found = printed.tool_schema(results)
    per_property = found["us_per_property"]
    rows = [(f"{int(n):,}", f"{us:.2f} us") for n, us in per_property.items()]
    first, last = next(iter(per_property)), list(per_property)[-1]
    rows.append((f"ratio {int(last):,} / {int(first):,}", f"{found['growth']:.2f}x"))
    quiet, attacked, attacker = found["quiet"], found["under_attack"], found["attacker"]
    stall = [
        ("quiet: median / worst", f"{quiet['median_ms']:.1f} / {quiet['worst_ms']:.1f} ms"),
        (
            "during the attack: median / worst",
            f"{attacked['median_ms']:.1f} / {attacked['worst_ms']:.1f} ms",
        ),
        (
            f"the attacker's {found['attacker_frame_mb']:.1f} MB frames",
            f"{attacker['frames']:.0f} answered `array_above_max_bytes`, "
            f"{attacker['median_ms']:.0f} ms each (median)",
        ),
    ]
    return (
        markdown(("required string properties", "CPU per property"), rows)
        + "\n\n"
        + markdown(("victim's turn (sim engine, default speed)", "this code"), stall)
    )


def large_requests_table(results: dict[str, Any]) -> str:
    """`bench_large_requests.py`, `bench_loop_busy.py`, `bench_queue_memory.py`: the
    server's CPU for large requests, the event loop's long windows under huge tool
    lists, and the memory a queued byte costs."""
    found = printed.hardening(results)
    large, busy, queue = found["large"], found["loop_busy"], found["queue"]
    rows = [
        (
            f"server CPU for one {large['tool_list']['size']:g} MB tool list (refused by its "
            f"size) / one {large['history']['size']:g} KB history (medians)",
            f"{large['tool_list']['cpu_ms']:.1f} / {large['history']['cpu_ms']:.1f} ms",
        ),
        (
            f"event-loop windows of more than `0.05 s` / `0.1 s` of CPU, over "
            f"{busy['windows']:.0f} windows of huge tool lists",
            f"{busy['over_50ms']:.0f} / {busy['over_100ms']:.0f} (loop CPU "
            f"{busy['loop_cpu_s']:.2f} s)",
        ),
        (
            f"RSS per queued byte ({queue['sockets']} socket, {queue['queued_mib']:.1f} MiB "
            "queued)",
            f"{queue['rss_per_queued_byte']:.2f} (+{queue['rss_growth_mib']:.1f} MiB)",
        ),
    ]
    return markdown(("check", "this code"), rows)
