"""The tables of storage and several nodes (docs/benchmarks-store.md)."""

from __future__ import annotations

from typing import Any

from figure_tables.common import (
    STORES,
    markdown,
    ms,
    printed_json,
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
