"""Every measured number in the docs' prose (README.md, docs/*.md and the CHANGELOG's
latest section) is generated from a results file, or marked as a kept run of past code.

What counts as a figure: a number with a unit of time, size, rate, a ratio sign (`x`), a
percent sign, or a load average, in prose (tables outside figures blocks included).
Such a number is either

- a link to its value, the results file and a JSON pointer (or a `DERIVED` quantity of
  benches/figures.py) in the fragment: `[6.0 ms](../benches/results/agent.json#/speeds/0/
  runs/websocket/summary/added_ttft_p50_ms)`, which shows that value at the precision
  shown (`figures.py tables` rewrites it after a rerun); under `benches/results/history/`
  it is a kept run of past code, and the paragraph names its commit;
- or not a measurement (a limit, a default, a target, a workload's parameter), written in
  code font: `--max-connections-per-key` (`256`), a `2 KB` tool output, at `4,000
  tokens/s`. Those come from the code or the command, not from a run.

Counts without a unit (tokens, turns, requests) are not found by the test: a count that
is measured is linked all the same.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benches"))
import figures  # noqa: E402 - benches/ is not a package
from figures import DERIVED, FIGURE_LINK, HISTORICAL, RESULTS  # noqa: E402

# configuration.md is generated from the CLI (`make docs`): its numbers are the code's.
GENERATED = {"configuration.md"}
CHECKED = [page for page in figures.pages() if page.name not in GENERATED]

UNIT = (
    r"(?:x|ns|us|µs|ms|s|min|minutes?|seconds?|hours?|bytes?|[KMGT]i?B|%"
    r"|(?:tok|tokens|turns|commits|responses|requests|[KMG]i?B)/s)"
)
NUMBER = r"\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(rf"(?<![\w.]){NUMBER}(?:\s?(?:-|to)\s?{NUMBER})?\s?{UNIT}(?![\w/])")
# The load a figure was measured under is a measurement too.
LOAD = re.compile(r"\bload(?: average)?s?(?: of| at)?\s+(?:about\s+)?\d")
# "The idle machine" was said of a run whose 5-minute load average was 1.8 on 2 cores:
# a run's load is its figures' line (1 and 5 minute load averages), not a word.
IDLE = re.compile(r"\bidle\b[\w\s,-]{0,16}\bmachine\b", re.IGNORECASE)
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")


def text_of(page: Path) -> str:
    """The page as the test reads it: the CHANGELOG's latest section only (the sections
    before are the record of past releases)."""
    text = page.read_text()
    if page.name == "CHANGELOG.md":
        latest = text.split("\n## [", 2)
        return "\n## [" + latest[1] if len(latest) > 1 else text
    return text


def prose(text: str) -> str:
    """What a reader reads as prose: no code (fenced, indented, inline), no figures block
    (generated), no figure link (checked against its file), no link target."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.DOTALL | re.MULTILINE)
    text = re.sub(r"^(?: {4}|\t).*$", "", text, flags=re.MULTILINE)
    text = re.sub(r"^<!-- figures:(\w+) -->$.*?^<!-- /figures:\1 -->$", "", text, flags=re.S | re.M)
    text = re.sub(r"`[^`]*`", "", text)
    text = FIGURE_LINK.sub("", text)
    return re.sub(r"\]\([^)\s]*\)", "]", text)


def unmarked(page: Path) -> list[str]:
    """Each figure of the page's prose that is neither linked nor code, and each run
    called idle (its load average is its figures' line), with its context."""
    text = prose(text_of(page))
    found = []
    for pattern in (FIGURE, LOAD, IDLE):
        for match in pattern.finditer(text):
            start = max(0, match.start() - 40)
            found.append(" ".join(text[start : match.end() + 10].split()))
    return found


@pytest.mark.parametrize("page", CHECKED, ids=lambda page: page.name)
def test_every_figure_in_prose_is_linked_to_its_results_or_is_code(page: Path) -> None:
    assert unmarked(page) == []


def links() -> Iterator[tuple[str, str, str, str]]:
    """(page, text, results file, fragment) of every figure link of every page."""
    for page in figures.pages():
        for text, _, name, fragment in FIGURE_LINK.findall(page.read_text()):
            yield page.name, text, name, fragment


def test_the_pages_link_their_figures() -> None:
    assert len(list(links())) >= 4


@pytest.mark.parametrize("page, text, name, fragment", list(links()), ids=str)
def test_a_linked_figure_shows_the_value_in_its_results_file(
    page: str, text: str, name: str, fragment: str
) -> None:
    value = figures.figure_value(name, fragment)
    assert figures.shown(text, value) == text, f"{page}: {text} but {name}#{fragment} is {value}"


@pytest.mark.parametrize("page", figures.pages(), ids=lambda page: page.name)
def test_a_link_up_from_a_page_reaches_the_results(page: Path) -> None:
    """docs/ pages link `../benches/results/`, README.md and the CHANGELOG
    `benches/results/`: a figure link is a working link."""
    depth = len(page.relative_to(ROOT).parts) - 1
    for match in FIGURE_LINK.finditer(page.read_text()):
        assert match.group(2) == "../" * depth, match.group(0)
        assert (RESULTS / match.group(3)).exists(), match.group(0)


def test_a_figure_link_is_rewritten_from_its_file_at_the_precision_it_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `figures.py tables` does to the pages after a rerun: every linked number, a
    field or a DERIVED quantity, signed or not, and a run's commit."""
    (tmp_path / "docs").mkdir()
    for page in ("README.md", "CHANGELOG.md"):
        (tmp_path / page).write_text("")
    results = tmp_path / "benches" / "results"
    results.mkdir(parents=True)
    run = {"provenance": {"commit": "abcdef0123"}, "a": {"b c": [1234.5678, -2.75]}}
    (results / "run.json").write_text(json.dumps(run))
    monkeypatch.setattr(figures, "ROOT", tmp_path)
    monkeypatch.setattr(figures, "RESULTS", results)
    monkeypatch.setitem(DERIVED, "times", lambda d, n: int(n) * d["a"]["b c"][0])
    link = "[{}](../benches/results/run.json#{})".format
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        f"{link('**1.0x**', '/a/b%20c/0')}, {link('+9 ms', '/a/b%20c/1')}, "
        f"{link('7 ms', 'times/2')} at {link('0000000', '/provenance/commit')}"
    )
    figures.write_figures_in_prose()
    assert page.read_text() == (
        f"{link('**1,234.6x**', '/a/b%20c/0')}, {link('-3 ms', '/a/b%20c/1')}, "
        f"{link('2,469 ms', 'times/2')} at {link('abcdef0', '/provenance/commit')}"
    )


def test_a_link_its_rerun_no_longer_answers_is_left_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rerun that no longer writes a linked field must not stop `tables` (the other
    pages' figures are still rewritten); the link stays, and the test above fails on it."""
    (tmp_path / "docs").mkdir()
    for page in ("README.md", "CHANGELOG.md"):
        (tmp_path / page).write_text("")
    results = tmp_path / "benches" / "results"
    results.mkdir(parents=True)
    (results / "run.json").write_text(json.dumps({"kept": 2.0}))
    monkeypatch.setattr(figures, "ROOT", tmp_path)
    monkeypatch.setattr(figures, "RESULTS", results)
    page = tmp_path / "docs" / "page.md"
    gone, kept = (
        "[1.0x](../benches/results/run.json#/gone)",
        "[1.0x](../benches/results/run.json#/kept)",
    )
    page.write_text(f"{gone} {kept}")
    figures.write_figures_in_prose()
    assert page.read_text() == f"{gone} [2.0x](../benches/results/run.json#/kept)"
    assert f"docs/page.md: {gone} left as it is" in capsys.readouterr().out


def test_every_derived_quantity_is_cited() -> None:
    cited = {fragment.split("/")[0] for *_, fragment in links()}
    assert sorted(set(DERIVED) - cited) == []


def paragraphs(page: Path) -> Iterator[str]:
    yield from re.split(r"\n\s*\n", page.read_text())


def commits_of(name: str) -> set[str]:
    """The commits a kept results file can be named by: the one that recorded it and
    those its description names."""
    kept = HISTORICAL[name]
    return {kept.commit[:7], *(c[:7] for c in COMMIT.findall(kept.what))}


@pytest.mark.parametrize("page", figures.pages(), ids=lambda page: page.name)
def test_a_figure_of_past_code_says_so_with_its_commit(page: Path) -> None:
    """A link into `benches/results/history/` is a kept run of code that no longer
    exists: its paragraph (or table row) names the commit, so nobody reads it as the
    current code's."""
    unnamed = []
    for paragraph in paragraphs(page):
        for block in paragraph.splitlines() if paragraph.startswith("|") else [paragraph]:
            for _, _, name, _ in FIGURE_LINK.findall(block):
                if name.startswith(figures.HISTORY) and not any(
                    c in block for c in commits_of(name)
                ):
                    unnamed.append(f"{name} in: {block[:80]}")
    assert unnamed == []
