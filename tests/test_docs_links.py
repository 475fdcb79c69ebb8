"""Every relative link in README.md, CHANGELOG.md and docs/ reaches a file that exists,
and a link to a heading (`page.md#anchor`, `#anchor`) reaches a heading of that page, as
GitHub names its anchors (lowercase, punctuation dropped, spaces as hyphens, `-1`, `-2`
for repeats). A page merged or a heading renamed cannot leave a dead link behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]
FENCED = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
HEADING = re.compile(r"^#{1,6} (.*)$", re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings."""
    seen: dict[str, int] = {}
    for title in HEADING.findall(FENCED.sub("", page.read_text())):
        anchor = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
    return {a if n == 0 else f"{a}-{n}" for a, times in seen.items() for n in range(times)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_reaches_its_file_and_heading(page: Path) -> None:
    dead = []
    for target in LINK.findall(FENCED.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # another site
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            dead.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            dead.append(target)
    assert dead == []
