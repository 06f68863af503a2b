"""scripts/metaworld_agreement.py: the two referees' table from their own result files, and one
line (exit code 2) for a folder or file that is not what it expects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "metaworld_agreement.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def write_both(tmp_path: Path, ours: list[bool], theirs: list[bool]) -> tuple[Path, Path]:
    own, lr = tmp_path / "own", tmp_path / "lerobot"
    (own / "reach-v3_seeds1000").mkdir(parents=True)
    (own / "reach-v3_seeds1000" / "results.json").write_text(
        json.dumps({"episodes": [{"seed": 1000 + i, "success": s} for i, s in enumerate(ours)]})
    )
    (lr / "reach-v3").mkdir(parents=True)
    (lr / "reach-v3" / "eval_info.json").write_text(json.dumps({"per_task": [{"metrics": {"successes": theirs}}]}))
    return own, lr


def test_the_table_pairs_the_seeds_and_counts_the_flips(tmp_path: Path) -> None:
    own, lr = write_both(tmp_path, [True, True, False, False], [True, False, True, True])
    r = run("--ours", str(own), "--lerobot", str(lr), "--tasks", "reach-v3")
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()
    assert rows[2].startswith("| reach-v3 (seeds 1000-1003) | 2/4 = 50.0% ") and "3/4 = 75.0%" in rows[2]
    assert "| 1/4 (1 ours only, 2 lerobot's only) |" in rows[2]
    assert rows[3].startswith("| all | 2/4 = 50.0% ")


@pytest.mark.slow  # over 4 s of one core: the full tier (the fast tier keeps to 3 minutes)
def test_a_missing_or_foreign_file_is_one_line(tmp_path: Path) -> None:
    own, lr = write_both(tmp_path, [True], [True])
    r = run("--ours", str(own), "--lerobot", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: --lerobot {tmp_path / 'nowhere'}: expected a folder of eval results"
    ]
    (lr / "reach-v3" / "eval_info.json").unlink()
    r = run("--ours", str(own), "--lerobot", str(lr), "--tasks", "reach-v3")
    assert r.returncode == 2 and r.stderr.startswith(
        f"error: {lr / 'reach-v3' / 'eval_info.json'}: expected lerobot-eval's eval_info.json of one task (FileNotFoundError"
    ) and len(r.stderr.strip().splitlines()) == 1
    (lr / "reach-v3" / "eval_info.json").write_text("{}")
    r = run("--ours", str(own), "--lerobot", str(lr), "--tasks", "reach-v3")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: {lr / 'reach-v3' / 'eval_info.json'}: expected lerobot-eval's eval_info.json of one task "
        "(one 'per_task' entry)"
    ]
