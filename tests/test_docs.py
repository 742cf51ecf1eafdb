"""The README and docs/ render on GitHub: every relative link names a file of the checkout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _links(page: Path) -> list[str]:
    """The relative link targets of ``page``, outside code blocks (anchors dropped)."""
    out, fence = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        for target in LINK.findall(line):
            if re.match(r"^(https?:|mailto:|#)", target):
                continue
            out.append(target.split("#")[0])
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_names_a_file(page):
    missing = [t for t in _links(page) if not (page.parent / t).exists()]
    assert missing == [], f"{page.relative_to(REPO)}: {missing}"


def test_the_readme_stays_short_and_reaches_every_page():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "pytest suites/" in "\n".join(readme.splitlines()[:15])
    linked = {(REPO / t).resolve() for t in _links(REPO / "README.md")}
    assert {p.resolve() for p in (REPO / "docs").glob("*.md")} <= linked
