"""README.md's measured numbers against the results files they come from.

A measured number in README.md is written as a link to its value: the results file and a
JSON pointer (RFC 6901) in the fragment, `[1.016x](benches/results/agent.json#/speeds/0/
runs/websocket/summary/ratio_to_ideal)`. Each must show the value at that pointer at the
precision shown, and every number with a unit of time or size, a ratio sign or a load
average in the README's prose must be so marked: a figure nobody can trace to a committed
run fails CI. Every results file README.md and docs/ cite is one `make figures` writes
(benches/figures.py).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benches"))
import figures  # noqa: E402 - benches/ is not a package
from figures import FIGURES, HISTORICAL, TABLES, Figure, FigureFailed, table_block  # noqa: E402

README = ROOT / "README.md"
MEASURED = re.compile(r"\[([^\]]*)\]\((benches/results/[^)#]+\.json)#([^)]*)\)")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
# A number followed by a unit of time or size, or a ratio sign: a measurement, in prose.
WITH_UNIT = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?\s?"
    r"(?:x|ms|us|µs|s|min|minutes?|seconds?|hours?|[KMG]i?B|%)(?!\w)"
)
# The load a figure was measured under is a measurement too.
LOAD = re.compile(r"load average\s+\d[\d.]*")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code."""
    outside = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return re.sub(r"`[^`]*`", "", outside)


def resolve(document: Any, pointer: str) -> Any:
    """RFC 6901: `/a/0/b`, with `~1` for `/` and `~0` for `~`."""
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        document = document[int(token)] if isinstance(document, list) else document[token]
    return document


def marked() -> list[tuple[str, str, str]]:
    return MEASURED.findall(README.read_text())


def test_the_readme_marks_its_measured_numbers() -> None:
    assert len(marked()) >= 4


@pytest.mark.parametrize("shown, path, pointer", marked(), ids=lambda v: str(v)[-40:])
def test_a_marked_number_is_the_value_in_its_results_file(
    shown: str, path: str, pointer: str
) -> None:
    value = resolve(json.loads((ROOT / path).read_text()), pointer)
    (number,) = NUMBER.findall(shown)
    decimals = len(number.split(".")[1]) if "." in number else 0
    assert f"{value:,.{decimals}f}" == number, f"{shown} but {path}#{pointer} is {value}"


def test_every_number_with_a_unit_in_the_readme_is_marked() -> None:
    text = MEASURED.sub("", prose(README.read_text()))
    assert WITH_UNIT.findall(text) + LOAD.findall(text) == []


def cited(pattern: str) -> set[tuple[str, str]]:
    """(page, match) for every match of `pattern` in README.md and docs/."""
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    return {(page.name, found) for page in pages for found in re.findall(pattern, page.read_text())}


def test_every_cited_results_file_is_written_by_make_figures() -> None:
    written = {f"benches/results/{name}" for figure in FIGURES for name in figure.files}
    written |= {f"benches/results/{name}" for name in HISTORICAL}
    files = cited(r"benches/results/[\w/]+\.json")
    assert sorted(c for c in files if c[1] not in written) == []


def test_every_benchmark_script_the_docs_cite_is_run_by_make_figures() -> None:
    run = {part for figure in FIGURES for command in figure.commands for part in command}
    scripts = cited(r"benches/(?:bench|test)_\w+\.py")
    assert sorted(c for c in scripts if c[1] not in run) == []


@pytest.mark.parametrize("name", sorted(TABLES))
def test_the_docs_tables_are_written_from_their_results(name: str) -> None:
    """A table between `<!-- figures:NAME -->` markers is what its results file gives
    (`make figures` or `python benches/figures.py tables` rewrites it)."""
    _, held, written = table_block(name)
    assert held == written


def python(code: str) -> tuple[tuple[str, ...], ...]:
    return ((sys.executable, "-c", code),)


def test_a_figure_records_what_its_command_printed_where_and_how_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(figures, "RESULTS", tmp_path)
    figures.run(Figure("printed", python("print('{\"ratio\": 2.5}')"), ()))
    recorded = json.loads((tmp_path / "printed.json").read_text())
    assert recorded["runs"][0]["json"] == [{"ratio": 2.5}]
    assert recorded["provenance"]["seconds"] >= 0
    assert recorded["provenance"]["commit"]


def test_a_results_file_its_commands_did_not_write_is_never_stamped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A figure declared as writing its own file (`bench_load_burst.py` was, and only
    printed) would have had an old run's file stamped with this commit's provenance."""
    monkeypatch.setattr(figures, "RESULTS", tmp_path)
    old = '{"before": 1}'
    (tmp_path / "stale.json").write_text(old)
    with pytest.raises(FigureFailed, match=r"did not write stale\.json"):
        figures.run(Figure("stale", python("pass"), (), writes=("stale.json",)))
    assert (tmp_path / "stale.json").read_text() == old


def test_a_results_file_its_commands_wrote_is_never_replaced_by_their_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bench_failover.py` writes failover.json itself; kept as printed output, its
    report (the fault lines it prints are not JSON lines) would have been replaced."""
    monkeypatch.setattr(figures, "RESULTS", tmp_path)
    own = tmp_path / "own.json"
    with pytest.raises(FigureFailed, match=r"wrote own\.json"):
        figures.run(Figure("own", python(f"open({str(own)!r}, 'w').write('{{}}')"), ()))
    assert own.read_text() == "{}"
