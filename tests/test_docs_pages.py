"""Each docs page is a reference a reader can use: it opens with what the reader can do
there, it stays under `MAX_PAGE_BYTES` (a longer page is two subjects: split it by what
the reader does), and no table cell is an essay (`MAX_CELL_CHARS`: what needs more goes
in the prose under the table, or on the page the cell links to)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *DOCS]
MAX_PAGE_BYTES = 40_000
MAX_CELL_CHARS = 600
# Generated from the CLI by `make docs`: it opens with what it lists.
GENERATED = {"configuration.md"}
FENCED = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_is_over_the_size_bound(page: Path) -> None:
    assert len(page.read_bytes()) <= MAX_PAGE_BYTES


@pytest.mark.parametrize("page", [p for p in DOCS if p.name not in GENERATED], ids=lambda p: p.name)
def test_every_docs_page_opens_with_what_the_reader_can_do_there(page: Path) -> None:
    title, _, rest = page.read_text().partition("\n\n")
    assert title.startswith("# ")
    assert re.match(r"What (?:you|an? [\w ]+) can do here: ", rest), rest[:80]


def cells(page: Path) -> list[str]:
    """Every cell of every table row of the page, code blocks left out."""
    rows = (line for line in FENCED.sub("", page.read_text()).splitlines())
    # a `|` inside inline code does not end a cell
    return [
        cell.strip()
        for row in rows
        if row.startswith("|")
        for cell in re.split(r"\|(?=(?:[^`]*`[^`]*`)*[^`]*$)", row.strip("|"))
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_table_cell_is_an_essay(page: Path) -> None:
    long = [
        f"{len(cell)} chars: {cell[:60]}..." for cell in cells(page) if len(cell) > MAX_CELL_CHARS
    ]
    assert long == []
