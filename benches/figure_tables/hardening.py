"""The tables of the hardening fixes and the abuse suite (docs/benchmarks-hardening.md,
docs/hardening.md)."""

from __future__ import annotations

from typing import Any

import figure_printed as printed

from figure_tables.common import (
    STORES,
    Cells,
    markdown,
    ms,
    printed_json,
)


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
