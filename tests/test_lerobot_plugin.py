"""The lerobot 0.6 plugin (lerobot_plugin/, ``--policy.type=dit4dit``) in its side environment.

lerobot 0.6.1 needs Python >= 3.12, so the plugin runs only in the side virtualenv that
``bash scripts/lerobot_check.sh`` builds (.lerobot06/venv: lerobot[metaworld] 0.6.1, this checkout,
the plugin); without it this test is skipped (CI does not build it: 5.9 GB, ~8 min). With it, a
tiny policy exported here goes through ``dit4dit-lerobot-prepare`` and lerobot's own
``make_policy`` / ``make_pre_post_processors`` (scripts/lerobot06/plugin_side.py): lerobot's batch
gives predict_action's chunk, select_action pops it from a queue, and each refusal is one line;
the lean Meta-World env (lerobot_plugin/env) against lerobot's stock one.
This checkout's package and plugin are put first on the side interpreter's path, so a side venv
built from another checkout still checks this one's code.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from policy_fixtures import build_tiny_setup

ROOT = Path(__file__).resolve().parents[1]
SIDE_PY = ROOT / ".lerobot06" / "venv" / "bin" / "python"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.interop,
    pytest.mark.skipif(not SIDE_PY.is_file(), reason="no lerobot 0.6 side venv: bash scripts/lerobot_check.sh builds it"),
]


def side(*args: str) -> subprocess.CompletedProcess:
    path = (ROOT, ROOT / "client", ROOT / "lerobot_plugin", ROOT / "lerobot_plugin" / "env")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path)), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    return subprocess.run([str(SIDE_PY), *args], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)


def test_lerobot_opens_a_prepared_policy_folder_and_runs_its_chunks(tmp_path: Path) -> None:
    policy = build_tiny_setup(tmp_path).policy_dir
    r = side("-m", "lerobot_policy_dit4dit.prepare", "--policy", str(policy))
    assert r.returncode == 0, r.stdout + r.stderr
    assert {"config.json", "policy_preprocessor.json", "policy_postprocessor.json"} <= {p.name for p in policy.iterdir()}

    r = side(str(ROOT / "scripts" / "lerobot06" / "plugin_side.py"), str(policy))
    lines = [line for line in r.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert r.returncode == 0 and len(lines) == 9 and all(line.startswith("PASS") for line in lines), r.stdout + r.stderr


def test_a_folder_that_is_not_a_policy_is_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    r = side("-m", "lerobot_policy_dit4dit.prepare", "--policy", str(tmp_path))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: ") and list(tmp_path.iterdir()) == []


def test_another_policys_lerobot_config_is_not_replaced(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"type": "act"}')
    r = side("-m", "lerobot_policy_dit4dit.prepare", "--policy", str(tmp_path))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: {config}: a lerobot config of type 'act' is already there; not replacing it"
    ], r.stderr
    assert config.read_text() == '{"type": "act"}' and [p.name for p in tmp_path.iterdir()] == ["config.json"]


def test_the_lean_metaworld_env_is_lerobots_env_with_a_cheaper_picture() -> None:
    """--env.type=metaworld_lean (lerobot_plugin/env): lerobot's discovery registers it (the check
    imports it no earlier), its create_envs builds the vector envs lerobot's Meta-World config builds
    (async: lerobot's lazy, freezing wrapper), lerobot's create_envs sizes it, an 8-pixel image is
    refused, and under the scripted expert's actions it gives the stock env's states, rewards and end,
    with pictures that differ only in shading."""
    r = side(str(ROOT / "scripts" / "lerobot06" / "metaworld_side.py"), "lean", "--tasks", "reach-v3")
    lines = [line for line in r.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert r.returncode == 0 and len(lines) == 6 and all(line.startswith("PASS") for line in lines), r.stdout + r.stderr
