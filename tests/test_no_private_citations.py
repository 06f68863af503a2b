"""The repository explains itself: no tracked text file cites a document a reader of the repository
cannot open (the project's private specification and design notes, research notes, issue-tracker
numbers). A comment or page says the reason itself, or links a page of docs/."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# What a reader outside the project's tracker cannot follow. Section numbers of the private
# specification ("SPEC 1.6", "SPEC §2", "SPEC A4"), its design notes, the names of its research
# notes, and issue numbers ("issue 32", "Issue #10", "issues 10 and 22").
CITATIONS = re.compile(
    r"\bSPEC\b"
    r"|DESIGN\.md"
    r"|\b[Ii]ssues? #?\d+"
    r"|\breference/[A-Za-z_]+\.md"
    r"|\b(?:aloha_sim|cosmos25_tiny_recipe|cosmos25_tiny|deepspeed_cpu|original_on_cpu|peers|robotwin_lerobot_npu)\.md\b"
    r"|\bseed 00\d\b|\bseed documents?\b|\bporting note\b"
)


def tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    paths = [REPO / p for p in out.decode().split("\0") if p]
    return [p for p in paths if p.is_file() and p != Path(__file__).resolve() and b"\0" not in p.read_bytes()[:8192]]


def test_no_citation_of_documents_outside_the_repository() -> None:
    found: dict[str, list[str]] = {}
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if m := CITATIONS.search(line):
                found.setdefault(str(path.relative_to(REPO)), []).append(f"{n}: {m.group(0)!r}")
    assert not found, "cites what the repository does not contain (say the reason instead):\n" + "\n".join(
        f"  {f}: line {', line '.join(hits)}" for f, hits in sorted(found.items())
    )
