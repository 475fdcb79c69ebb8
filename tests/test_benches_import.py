"""Every benchmark script in `benches/` imports at this commit: `make figures` runs them
only on a quiet machine, long after a change to what they import (bench_engines.py
imported a test helper that had been renamed and nobody saw it until a figures run)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHES = Path(__file__).resolve().parent.parent / "benches"
TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("script", sorted(BENCHES.glob("bench_*.py")), ids=lambda p: p.name)
def test_a_benchmark_script_imports(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The scripts put tests/ on sys.path themselves where they need its helpers; benches/
    # is their own directory when run.
    monkeypatch.setattr(sys, "path", [str(BENCHES), str(TESTS), *sys.path])
    spec = importlib.util.spec_from_file_location(f"bench_import_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)  # the `__main__` guard keeps the benchmark from running
