"""The tables of capacity (docs/benchmarks-capacity.md): many agents on one process, an
arrival burst, the capacity sweep."""

from __future__ import annotations

from statistics import median
from typing import Any

from figure_tables.common import (
    Cells,
    markdown,
    ms,
    printed_json,
)


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


def load_burst_table(results: dict[str, Any]) -> str:
    """The same burst, one run of the current code (`make figures`)."""
    return markdown(BURST_HEADER, [burst_row("this commit, one run", printed_json(results))])


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
        behind = [] if p.get("kept_up", True) else ["fell behind the direct path's turns/s"]
        saturated = "; ".join([*p["saturated"], *behind]) or "no"
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
        *("client / fake cores", "errors", "saturated or behind"),
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


def capacity_workers_tables(results: dict[str, Any]) -> str:
    """One worker against two, each process capped at the same share of a core
    (`--gateway-quota`): every point, then where each met the target and where it
    missed it."""
    names = {"direct": "direct (the floor)"}
    for name, flags in results["variants"].items():
        names[name] = f"hotloop `{flags}`"
    rows = []
    for p in sorted(results["points"], key=lambda p: (p["agents"], p["system"] != "direct")):
        server = p["server"]
        gateway = p["system"] != "direct"
        shares = server.get("gateway_cpu_shares", [])
        met = p["errors"] == 0 and not p["saturated"] and p.get("kept_up", False)
        met = met and p.get("added_ttft_p99_ms", float("inf")) <= results["target_ms"]
        rows.append(
            (
                str(p["agents"]),
                names.get(p["system"], "hotloop, one worker"),
                f"{p['turns_per_s']:.1f}",
                " / ".join(f"{p[f'added_ttft_{q}_ms']:+.1f}" for q in ("p50", "p99"))
                if gateway
                else f"{p['ttft_p50_ms']:.1f} / {p['ttft_p99_ms']:.1f} (TTFT)",
                f"{server['gateway_cpu_cores']:.2f}" if gateway else "",
                " / ".join(f"{share:.2f}" for share in shares) if gateway else "",
                f"{server['throttled_ms']:,.0f} ms" if "throttled_ms" in server else "",
                f"{p['client_cpu_cores']:.2f} / {server['upstream_cpu_cores']:.2f}",
                ("yes" if met else "; ".join(p["saturated"]) or "no") if gateway else "",
            )
        )
    header = (
        *("agents", "system", "turns/s", "added p50 / p99 ms", "gateway cores"),
        *("CPU share per process", "held by the quota (all processes)"),
        *("client / fake cores", "met"),
    )
    heads = []
    for key, best in results["headline"].items():
        system = names.get(key.rsplit(" ", 1)[0], "hotloop, one worker")
        if best is None:
            heads.append((system, "never met", "", "", "", ""))
            continue
        missed = best["missed_at_agents"]
        crossing = target_crossing(results, key)
        heads.append(
            (
                system,
                str(best["agents"]),
                f"{best['turns_per_s']:.1f}",
                "" if missed is None else str(missed),
                "" if missed is None else f"{best['missed_at_direct_turns_per_s']:.1f}",
                "" if crossing is None else f"**{crossing:.1f}**",
            )
        )
    head_header = (
        *("system", "most agents meeting the target", "turns/s there"),
        *("fewest agents missing it", "turns/s asked there"),
        "turns/s where the added p99 crosses the target (interpolated)",
    )
    return markdown(header, rows) + "\n\n" + markdown(head_header, heads)


def target_crossing(results: dict[str, Any], key: str) -> float | None:
    """The turns/s at which `key`'s (`system mode`) added p99 reaches the target,
    interpolated linearly between the most agents that met it and the next number
    measured, on the direct path's turns/s at each: between its lower bound (the rate it
    met) and its upper bound (the rate it missed). None: never met, or never missed."""
    best = results["headline"].get(key)
    if best is None or best["missed_at_agents"] is None:
        return None
    points = {(p["agents"], f"{p['system']} {p['mode']}"): p for p in results["points"]}
    asked = {p["agents"]: p["turns_per_s"] for p in results["points"] if p["system"] == "direct"}
    low = points[(best["agents"], key)]["added_ttft_p99_ms"]
    high = points[(best["missed_at_agents"], key)]["added_ttft_p99_ms"]
    met, missed = asked[best["agents"]], asked[best["missed_at_agents"]]
    if high <= results["target_ms"]:
        return float(met)  # missed for another reason (errors, saturation, behind)
    share = (results["target_ms"] - low) / (high - low)
    return float(met + share * (missed - met))
