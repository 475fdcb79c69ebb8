"""The tables of the core's parts (docs/benchmarks-core.md): the cache, parsing,
tokenizers, parsers, engines, the ratios CI asserts."""

from __future__ import annotations

from typing import Any

import figure_printed as printed

from figure_tables.common import (
    markdown,
    microseconds,
    ms,
    printed_json,
    times,
    tokens,
)

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
            (
                "o200k_base vs tiktoken, 3 KB turns, CPU caches emptied before each",
                figures["turn_encode_cold_vs_tiktoken"],
            ),
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


COLD_ENCODE_FAMILIES = {
    "qwen3": "Qwen3 (tokenizer.json)",
    "llama3_1": "Llama 3.1 (tokenizer.json)",
    "deepseek_v3": "DeepSeek V3 (tokenizer.json)",
    "gemma3": "Gemma 3 (tokenizer.json, SentencePiece)",
    "llama2": "Llama 2 (tokenizer.json, SentencePiece)",
    "gemma3_gguf": "Gemma 3 (GGUF)",
    "tekken": "Mistral tekken (`tekken.json`)",
    "o200k_base": "o200k_base",
}


def cold_encode_table(results: dict[str, Any]) -> str:
    """bench_cold_encode.py: 1 MB of fresh Python source, a fresh tokenizer per run,
    hotloop against fastokens (MB/s wall, MB per CPU-second), Hugging Face `tokenizers`
    and tiktoken; then hotloop's CPU time on 10 MB of source in one call over the same
    bytes in calls of 1 MB, and per byte at 10 MB over 1 MB on the adversarial input
    that grew most, in all CPU time and in user time alone (the rest is the kernel's:
    page faults on the 10 MB call's fresh memory)."""
    (run,) = printed_json(results)

    def speed(lib: dict[str, Any] | None) -> str:
        return f"{lib['wall_mb_s']:.1f} / {lib['cpu_mb_s']:.1f}" if lib else ""

    rows = []
    for family, label in COLD_ENCODE_FAMILIES.items():
        if family not in run:
            continue
        f = run[family]
        libs, ratio = f["libraries"], f["hotloop_over_fastokens"]
        adversarial = f["adversarial_10mb_over_1mb"]
        kind, growth = max(adversarial["cpu"].items(), key=lambda kv: kv[1])
        user_kind, user_growth = max(adversarial["user"].items(), key=lambda kv: kv[1])
        source = f["linearity_10mb_over_1mb"]["hotloop"]
        rows.append(
            (
                label,
                speed(libs["hotloop"]),
                speed(libs["fastokens"]),
                speed(libs.get("tokenizers")),
                speed(libs.get("tiktoken")),
                f"**{ratio['cpu']:.2f}x** / **{ratio['wall']:.2f}x**",
                f"{source:.2f} ({PATHOLOGICAL[kind]}: {growth:.2f})",
                f"{user_growth:.2f} ({PATHOLOGICAL[user_kind]})",
            )
        )
    header = (
        "family",
        "hotloop",
        "fastokens",
        "HF `tokenizers`",
        "tiktoken",
        "hotloop / fastokens per CPU-s / wall",
        "hotloop 10 MB / 1 MB per byte (worst adversarial)",
        "the same, user time alone (worst adversarial)",
    )
    return markdown(header, rows)
