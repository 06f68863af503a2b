"""scripts/interop_check.sh checks this checkout's code, never another's.

The check runs by hand in side virtualenvs (lerobot, openpi-client) that CI does not build; what
runs here is its first gate: the project interpreter (``.venv/bin/python`` of the checkout the
script sits in) must import ``dit4dit_npu`` from that checkout. A git worktree sharing main's
.venv (installed editable from main) would otherwise serve and read with main's code and pass.
The script is copied into a scratch checkout whose ``.venv/bin/python`` runs this interpreter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "interop_check.sh", root / "scripts")
    python = root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return root


def run(root: Path, pythonpath: list[Path]) -> subprocess.CompletedProcess:
    # PYTHON=false: building a side virtualenv fails at once (no registry is asked).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, pythonpath)), "PYTHON": "false",
           "INTEROP_DIR": str(root / ".interop")}
    return subprocess.run(["bash", str(root / "scripts" / "interop_check.sh")], capture_output=True, text=True,
                          env=env, timeout=120)


def test_another_checkouts_code_is_one_line_before_anything_is_built(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    r = run(root, [ROOT, ROOT / "client"])  # dit4dit_npu imports from this repository, not `root`
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        f"FAIL setup: {root}/.venv/bin/python imports dit4dit_npu from {ROOT}, not this checkout {root.resolve()} "
        f"(run with PYTHONPATH={root}:{root}/client)"
    ]
    assert not (root / ".interop").exists()


def holding_the_package(root: Path) -> Path:
    (root / "dit4dit_npu").mkdir()
    (root / "dit4dit_npu" / "__init__.py").write_text("")  # the package the script's own checkout holds
    return root


def test_a_worktree_without_its_pythonpath_is_refused(tmp_path: Path) -> None:
    """A worktree holds the package, but its .venv is main's: `python -m` would import the worktree's
    (the current folder first) while scripts/interop/ours.py would import main's."""
    root = holding_the_package(checkout(tmp_path))
    r = run(root, [ROOT])
    assert r.returncode == 1 and r.stdout.startswith(f"FAIL setup: {root}/.venv/bin/python imports dit4dit_npu from {ROOT}, "), r.stdout
    assert not (root / ".interop").exists()


def test_this_checkouts_code_passes_the_gate(tmp_path: Path) -> None:
    root = holding_the_package(checkout(tmp_path))
    r = run(root, [root])
    # past the gate: the next step (the lerobot side virtualenv) is what fails, with PYTHON=false
    assert r.returncode == 1 and r.stdout.splitlines() == ["FAIL setup: cannot install lerobot==0.4.4"], r.stdout
