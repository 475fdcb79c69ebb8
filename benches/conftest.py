"""Prints the figures each benchmark records (`extra_info`: throughputs, ratios,
growth) after the run, so one `make bench` shows the numbers docs/benchmarks.md quotes."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any) -> None:
    session = getattr(terminalreporter.config, "_benchmarksession", None)
    benchmarks = getattr(session, "benchmarks", None) or []
    rows = [(b.fullname.split("::")[-1], b.extra_info) for b in benchmarks if b.extra_info]
    if rows:
        terminalreporter.section("benchmark figures")
        for name, info in rows:
            terminalreporter.write_line(
                f"{name}: " + ", ".join(f"{k}={v}" for k, v in info.items())
            )
