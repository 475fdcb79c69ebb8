"""The registry of figures (benches/figures.py) against the docs and the results files:
every results file the pages cite is one `make figures` writes (or a kept run of past
code), stamped with where and when it ran; every table of measured numbers is a figures
block its renderer rewrites as it is. The numbers in prose: tests/test_figures_in_prose.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benches"))
import figure_tables  # noqa: E402 - benches/ is not a package
import figures  # noqa: E402
from figure_printed import PRINTED  # noqa: E402
from figures import (  # noqa: E402
    FIGURES,
    HISTORICAL,
    RESULTS,
    TABLES,
    Figure,
    FigureFailed,
    Table,
    table_block,
    write_tables,
)


def cited(pattern: str) -> set[tuple[str, str]]:
    """(page, match) for every match of `pattern` in the pages figures.py writes."""
    return {
        (page.name, found)
        for page in figures.pages()
        for found in re.findall(pattern, page.read_text())
    }


def test_every_cited_results_file_is_written_by_make_figures() -> None:
    written = {f"benches/results/{name}" for figure in FIGURES for name in figure.files}
    written |= {f"benches/results/{name}" for name in HISTORICAL}
    files = cited(r"benches/results/[\w/]+\.json")
    assert sorted(c for c in files if c[1] not in written) == []


def test_every_benchmark_script_the_docs_cite_is_run_by_make_figures() -> None:
    run = {part for figure in FIGURES for command in figure.commands for part in command}
    scripts = cited(r"benches/(?:bench|test)_\w+\.py")
    assert sorted(c for c in scripts if c[1] not in run) == []


def test_every_kept_results_file_of_past_code_is_listed_with_the_commit_that_recorded_it() -> None:
    """`benches/results/history/` holds runs `make figures` cannot repeat (the other side
    of a before/after): each is in HISTORICAL, which names the commit that recorded it,
    and no figure of the current code writes there."""
    kept = {str(p.relative_to(RESULTS)) for p in (RESULTS / "history").rglob("*.json")}
    assert kept == set(HISTORICAL)
    for name, historical in HISTORICAL.items():
        known = subprocess.run(
            ["git", "cat-file", "-e", f"{historical.commit}^{{commit}}"], cwd=ROOT, check=False
        )
        assert known.returncode == 0, f"{name}: {historical.commit} is not a commit"
    assert [f for figure in FIGURES for f in figure.files if f.startswith("history/")] == []


@pytest.mark.parametrize("figure", FIGURES, ids=lambda figure: figure.name)
def test_every_figure_is_committed_with_where_and_when_it_was_measured(figure: Figure) -> None:
    """Each results file `make figures` writes is in the repository, stamped by its run
    with the commit, machine, date and load: a figure without its run is one nobody can
    trace (`make figures FIGURES=NAME` writes it)."""
    for name in figure.files:
        path = RESULTS / name
        assert path.exists(), f"{name} is missing: make figures FIGURES={figure.name}"
        stamp = json.loads(path.read_text()).get("provenance", {})
        assert {"commit", "machine", "date", "load_average"} <= stamp.keys(), name


@pytest.mark.parametrize("name", sorted(TABLES))
def test_the_docs_tables_are_written_from_their_results(name: str) -> None:
    """A table between `<!-- figures:NAME -->` markers is what its results file gives
    (`make figures` or `python benches/figures.py tables` rewrites it)."""
    _, held, written = table_block(name)
    assert held == written


def test_every_figures_block_has_a_renderer_and_is_on_one_page() -> None:
    """`tables` finds a block by its marker on any page: one block per renderer."""
    names = [
        name
        for page in figures.pages()
        for name in re.findall(r"^<!-- figures:(\w+) -->$", page.read_text(), re.MULTILINE)
    ]
    assert sorted(names) == sorted(TABLES)


STAMP = {"commit": "0" * 40, "date": "2026-12-04T00:00:00Z", "load_average": [0.5, 1.5, 2]}


def copy_of_the_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The pages and benches/results/ copied, and figures.py pointed at the copy."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for page in ("README.md", "CHANGELOG.md"):
        shutil.copy(ROOT / page, tmp_path / page)
    shutil.copytree(RESULTS, tmp_path / "results")
    monkeypatch.setattr(figures, "ROOT", tmp_path)
    monkeypatch.setattr(figures, "RESULTS", tmp_path / "results")
    return tmp_path


def test_writing_the_tables_changes_no_committed_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tables` on the committed results rewrites every block (and every agent-loop
    summary) as it is: a hand edit of a generated table, or a renderer changed
    without rerunning `tables`, shows up here."""
    copy = copy_of_the_tree(tmp_path, monkeypatch)
    write_tables()
    for tree, under in ((ROOT / "docs", copy / "docs"), (RESULTS, copy / "results")):
        for path in sorted(p for p in tree.rglob("*") if p.is_file()):
            written = under / path.relative_to(tree)
            assert written.read_bytes() == path.read_bytes(), path.relative_to(ROOT)
    for page in ("README.md", "CHANGELOG.md"):
        assert (copy / page).read_bytes() == (ROOT / page).read_bytes(), page


def test_a_table_whose_results_file_is_missing_is_left_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before the lead's full rerun most figures have no results file: their hand
    tables stay, and `tables` says which; once the file exists the block is its."""
    copy = copy_of_the_tree(tmp_path, monkeypatch)
    (copy / "results" / "ws_turn.json").unlink(missing_ok=True)
    monkeypatch.setattr(figures, "TABLES", {"ws_turn": TABLES["ws_turn"]})
    page = figures.block_page("ws_turn")
    before = page.read_text()
    write_tables()
    assert page.read_text() == before
    assert "figures:ws_turn left as it is (ws_turn.json missing)" in capsys.readouterr().out
    rows = [{"history_tokens": 1619, "ws_p50_ms": 0.2305, "full_p50_ms": 0.5417}]
    printed = {"provenance": STAMP, "runs": [{"json": [rows]}]}
    (copy / "results" / "ws_turn.json").write_text(json.dumps(printed))
    write_tables()
    assert "| 1.6k | 0.231 ms | 0.54 ms | 2x |" in page.read_text()


def test_a_renderer_takes_every_results_file_of_its_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(figures, "ROOT", tmp_path)
    monkeypatch.setattr(figures, "RESULTS", tmp_path)
    (tmp_path / "README.md").write_text("<!-- figures:both -->\nold\n<!-- /figures:both -->\n")
    (tmp_path / "CHANGELOG.md").write_text("")
    for name, value in (("a.json", 1), ("b.json", 2)):
        (tmp_path / name).write_text(json.dumps({"provenance": STAMP, "v": value}))
    both = Table(("a.json", "b.json"), lambda a, b: f"{a['v']} then {b['v']}")
    monkeypatch.setattr(figures, "TABLES", {"both": both})
    _, held, written = table_block("both")
    assert held == "old\n"
    assert written is not None and written.startswith("1 then 2\n\nMeasured 2026-12-04")
    assert "`benches/results/a.json`.\nMeasured" in written


def leaf_numbers(document: object) -> list[float]:
    if isinstance(document, dict):
        return [n for value in document.values() for n in leaf_numbers(value)]
    if isinstance(document, list):
        return [n for value in document for n in leaf_numbers(value)]
    numeric = isinstance(document, int | float) and not isinstance(document, bool)
    return [float(document)] if numeric else []


@pytest.mark.parametrize("name", sorted(PRINTED))
def test_what_a_script_printed_as_text_is_read_back_whole(name: str) -> None:
    """A parser that stopped matching its script's lines (a label reworded) would read
    nothing, and the figures citing it would be gone: every section it knows is there."""
    document = PRINTED[name](json.loads((RESULTS / name).read_text()))
    assert document and all(leaf_numbers(section) for section in document.values())


def test_the_abuse_table_is_one_row_per_scenario_bench_abuse_printed() -> None:
    committed = json.loads((RESULTS / "abuse.json").read_text())
    scenarios = committed["runs"][0]["json"][-1]
    lines = figure_tables.abuse_table(committed).splitlines()
    assert [line.split(" | ")[0].strip("| ") for line in lines[2:]] == [
        s["attack"] for s in scenarios
    ]
    assert "none" in [s["attack"] for s in scenarios]  # the victim alone, the baseline


def test_the_store_tables_are_what_bench_store_printed() -> None:
    """One JSON line per command (sigkill, commit on SQLite, dedup)."""
    committed = json.loads((RESULTS / "store.json").read_text())
    sigkill = figure_tables.store_sigkill_table(committed).splitlines()
    assert sigkill[2].startswith("| commit before acknowledge |")
    assert sigkill[2].endswith("| **0** |")  # what the docs claim: no acknowledged loss
    commit = figure_tables.store_commit_table(committed).splitlines()
    assert len(commit) == 2 + len(committed["runs"][1]["json"][-1]["runs"])


def test_the_burst_of_the_current_code_is_one_row_of_the_before_after_table() -> None:
    """bench_load_burst.py prints one JSON line per run, the shape of the before/after
    file's runs: a rerun is rendered under the same header."""
    after = json.loads((RESULTS / "history" / "load_burst_before_after.json").read_text())["after"]
    rerun = {"runs": [{"json": [after["runs"][0]]}]}
    lines = figure_tables.load_burst_table(rerun).splitlines()
    assert lines[0] == table_block("load_burst_before_after")[1].splitlines()[0]
    assert lines[2:] == ["| this commit, one run | 0.82 s | 137 ms | 90 ms | 104 / 228 ms |"]


# What marks a table as measured: the text since the previous table or heading cites a
# results file, a benchmark script, or says "measured".
CITES_A_MEASUREMENT = re.compile(r"benches/results/|[Mm]easured|benches/(?:bench|test)_\w+\.py")


def hand_tables() -> list[tuple[str, str]]:
    """(page, header) of each docs table outside a figures block whose text cites a
    measurement."""
    found = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        since: list[str] = []
        generated = False
        in_table = False
        for line in page.read_text().splitlines():
            if line.startswith("|"):
                if not in_table and not generated and CITES_A_MEASUREMENT.search("\n".join(since)):
                    found.append((page.name, line))
                in_table, since = True, []
                continue
            in_table = False
            generated = line.startswith("<!-- figures:") or (
                generated and not line.startswith("<!-- /figures:")
            )
            since = [] if line.startswith("#") else [*since, line]
    return found


def test_every_measured_docs_table_sits_in_a_figures_block() -> None:
    """A table of measured numbers is written by a renderer from its results file; a hand
    table beside a measurement (a run's figures copied by hand, runs of several commits
    side by side) fails here until a renderer writes it. Tables of bounds, settings and
    what a check found stay by hand: their text cites no measurement."""
    assert hand_tables() == []


def python(code: str) -> tuple[tuple[str, ...], ...]:
    return ((sys.executable, "-c", code),)


def test_a_figure_records_what_its_command_printed_where_and_how_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(figures, "RESULTS", tmp_path)
    figures.run(Figure("printed", python("print('{\"ratio\": 2.5}')")))
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
        figures.run(Figure("stale", python("pass"), writes=("stale.json",)))
    assert (tmp_path / "stale.json").read_text() == old


def test_a_results_file_its_commands_wrote_is_never_replaced_by_their_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bench_failover.py` writes failover.json itself; kept as printed output, its
    report (the fault lines it prints are not JSON lines) would have been replaced."""
    monkeypatch.setattr(figures, "RESULTS", tmp_path)
    own = tmp_path / "own.json"
    with pytest.raises(FigureFailed, match=r"wrote own\.json"):
        figures.run(Figure("own", python(f"open({str(own)!r}, 'w').write('{{}}')")))
    assert own.read_text() == "{}"
