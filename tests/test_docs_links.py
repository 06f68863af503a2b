"""The front door and the topic pages stay navigable: every relative link in README.md,
CONTRIBUTING.md, client/README.md and docs/*.md names a file of the repository (and, with a
``#fragment``, a heading of that page), README.md stays a front door (<= 150 lines, a results
table of <= 12 rows of <= 200 characters; the rest lives in docs/ and CONTRIBUTING.md), and the
dated lab log is reached from one place (the simulation guide), not cited as a reference."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "client" / "README.md",
         *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return [link for link in LINK.findall(text) if not re.match(r"^[a-z]+:", link)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for link in relative_links(page):
        path, _, fragment = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.is_file():
            broken.append(f"{link}: no such file")
        elif fragment and target.suffix == ".md" and fragment not in anchors(target):
            broken.append(f"{link}: no heading with that anchor in {target.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_readme_is_a_front_door() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = text.count("\n")
    assert lines <= 150, f"README.md has {lines} lines; reference and lab notes belong in docs/"
    results = text.split("## Results at a glance", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in results.splitlines() if r.startswith("| ") and not r.startswith("| ---")][1:]
    assert 0 < len(rows) <= 12, f"README.md's results table has {len(rows)} rows (at most 12: the rest in docs/)"
    long = [r[:60] for r in rows if len(r) > 200]
    assert not long, f"README.md's results rows over 200 characters: {long}"


def test_the_lab_log_is_linked_from_one_place() -> None:
    where = [str(page.relative_to(REPO)) for page in PAGES for link in relative_links(page)
             if link.partition("#")[0].endswith("sim_recipe_log.md")]
    assert where == ["docs/simulation.md"], f"docs/sim_recipe_log.md is linked from {where}"
