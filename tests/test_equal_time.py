"""scripts/equal_time.sh: its settings checked before anything runs (one line, exit code 2, nothing
written), and its SMOKE=1 end to end (slow): two arms' data prepared one after the other, the arms
trained side by side for the same budget of training time, every checkpoint evaluated in closed
loop, one table and one plot against training time."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def equal_time(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/equal_time.sh", *args], cwd=ROOT, capture_output=True, text=True, timeout=1200,
        env={**os.environ, "PY": sys.executable, "DATA_ROOT": str(tmp_path / "data"), **env},
    )


@pytest.mark.parametrize(("env", "args", "message"), [
    ({"SMOKE": "2"}, [], "error: SMOKE=2: expected 0 or 1"),
    ({"ARMS": "no_video video"}, [], "error: ARMS=no_video video: unknown arm 'video'"),
    ({"ARMS": "joint joint"}, [], "error: ARMS=joint joint: an arm named twice"),
    ({"ARMS": " "}, [], "error: ARMS= : expected arms among"),
    ({"VIDEO_EVERY": "1"}, [], "error: VIDEO_EVERY=1: expected >= 2 (1 is the joint arm)"),
    ({"VIDEO_EVERY": "x"}, [], "error: VIDEO_EVERY=x: expected a positive integer"),
    ({"ARMS": "no_video joint", "VIDEO_EVERY": "4"}, [], "error: VIDEO_EVERY=4: applies only with an every_k"),
    ({"ARMS": "video_first", "VIDEO_SWITCH": "1"}, [], "error: VIDEO_SWITCH=1: expected a share of the training between 0 and 1"),
    ({"ARMS": "video_last", "VIDEO_SWITCH": "0.0"}, [], "error: VIDEO_SWITCH=0.0: expected a share of the training between 0 and 1"),
    ({"ARMS": "no_video joint", "VIDEO_SWITCH": "0.5"}, [], "error: VIDEO_SWITCH=0.5: applies only with a video_first or video_last"),
    ({"ARMS": "video_first", "VIDEO_SWITCH": ""}, [], "error: VIDEO_SWITCH=: expected a share of the training"),
    ({"DEMOS": ""}, [], "error: DEMOS=: expected a positive integer"),
    ({"TRAIN_MINUTES": ""}, [], "error: TRAIN_MINUTES=: expected a number of training minutes > 0"),
    ({"OUT": ""}, [], "error: OUT=: expected a folder for the table, the plot and the logs"),
    ({"TRAIN_MINUTES": "1h"}, [], "error: TRAIN_MINUTES=1h: expected a number of training minutes > 0"),
    ({"TRAIN_SEEDS": "42 x"}, [], "error: TRAIN_SEEDS=42 x: 'x' is not a seed"),
    ({"TRAIN_SEEDS": "7 7"}, [], "error: TRAIN_SEEDS=7 7: a seed named twice"),
    ({"CORES": "0 a"}, [], "error: CORES=0 a: 'a' is not a CPU number"),
    ({"CORES": "4096"}, [], "error: CORES=4096: CPU 4096 is not one this process may run on"),
    ({"DEMOS": "0"}, [], "error: DEMOS=0: expected a positive integer"),
    ({"EPISODES": "-1"}, [], "error: EPISODES=-1: expected a positive integer"),
    ({"SMOKE": "1", "EPISODES": "5"}, [], "error: EPISODES=5: SMOKE=1 sets its own"),
    # an 11-digit EPISODES was refused as INTERMEDIATE_EPISODES (its default), one of 5e9 after the data preparation
    ({"EPISODES": "99999999999"}, [], "error: EPISODES=99999999999: expected at most 2**32"),
    ({"EPISODES": "5000000000"}, [], "error: EPISODES=5000000000: expected at most 2**32"),
    ({"INTERMEDIATE_EPISODES": "x"}, [], "error: INTERMEDIATE_EPISODES=x: expected a positive integer"),
    ({"INTERMEDIATE_EPISODES": "101"}, [], "error: INTERMEDIATE_EPISODES=101: expected at most EPISODES=100"),
    ({"SMOKE": "1", "INTERMEDIATE_EPISODES": "5"}, [], "error: INTERMEDIATE_EPISODES=5: SMOKE=1 sets its own"),
    ({"TASK": "stack"}, [], "error: TASK=stack: expected transfer_cube or insertion"),
    ({"PY": "/nonexistent/python"}, [], "error: PY=/nonexistent/python: expected a Python executable"),
    # the script sets these per arm: refused, not silently overridden
    ({"OBJECTIVE": "joint"}, [], "error: OBJECTIVE=joint: set by scripts/equal_time.sh for each arm"),
    ({"ONE_PASS": "1"}, [], "error: ONE_PASS=1: set by scripts/equal_time.sh for each arm"),
    ({"VIDEO_SPAN": "0-0.5"}, [], "error: VIDEO_SPAN=0-0.5: set by scripts/equal_time.sh for each arm"),
    ({"RUN_ID": "mine"}, [], "error: RUN_ID=mine: set by scripts/equal_time.sh for each arm"),
    ({"ENCODE_RANKS": "2"}, [], "error: ENCODE_RANKS=2: set by scripts/equal_time.sh from CORES"),
    # the extra training overrides, through the config's own checks
    ({}, ["trainer.max_train_step=5"], "error: the extra overrides: unknown config key 'trainer.max_train_step'"),
    ({}, ["trainer.max_train_time_s=0"], "error: the extra overrides: trainer.max_train_time_s: got 0.0"),
])
def test_a_bad_setting_is_one_line_before_anything_runs(tmp_path: Path, env, args, message) -> None:
    r = equal_time(tmp_path, f"run_root_dir={tmp_path / 'runs'}", *args, **env)
    assert r.returncode == 2 and r.stdout == "", r.stdout[-2000:] + r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith(message), r.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_smoke_two_arms_side_by_side_one_table_and_one_plot(tmp_path: Path) -> None:
    if importlib.util.find_spec("gym_aloha") is None:
        pytest.skip("simulation extra not installed (pip install -e '.[sim]')")
    cores = sorted(os.sched_getaffinity(0))[:2]  # (a rank per core encodes each cache: two at most here)
    r = equal_time(tmp_path, f"run_root_dir={tmp_path / 'runs'}", SMOKE="1", ARMS="no_video one_pass",
                   TRAIN_MINUTES="0.05", CORES=" ".join(map(str, cores)), MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path / "runs" / "equal_time_smoke"
    if len(cores) == 2:  # each arm's cache by one rank per core, in one launch
        for arm in ("no_video", "one_pass"):
            log = (out / "logs" / f"prepare_{arm}_seed42.log").read_text()
            assert re.search(r"^latent cache .*: encoded \d+ clips \(\d episodes\) by 2 ranks in ", log, re.M), log[-2000:]
    assert r.stdout.strip().splitlines()[-1] == f"table -> {out}/table.md, plot -> {out}/success_vs_time.png"
    assert (out / "success_vs_time.png").stat().st_size > 0
    table = (out / "table.md").read_text()
    # the caches' time apart from training, each arm's runs and headline, every checkpoint
    assert re.search(r"^\| latent cache, 1-frame clips \(no_video\) \| \d+ \|$", table, re.M), table
    assert re.search(r"^\| latent cache, 5-frame clips \(the joint arms\) \| \d+ \|$", table, re.M), table
    for arm in ("no_video", "one_pass"):
        assert re.search(rf"^\| {arm} \| 42 \| \d+ \| \d+ \| [\d.]+ \| [\d.]+ \| \d/1 = ", table, re.M), table
        assert re.search(rf"^\| {arm} \| \d/1 = [\d.]+% \| ", table, re.M), table
        run = tmp_path / "runs" / f"equal_time_smoke_{arm}_seed42"
        ckpts = sorted((run / "checkpoints").glob("step_*"))
        # a checkpoint at each third of the 3-second budget, the last at its stop
        assert 1 <= len(ckpts) <= 3 and (ckpts[-1] / "policy" / "policy.json").is_file()
        seconds = torch.load(ckpts[-1] / "trainer_state.pt", weights_only=False)["train_time_s"]
        assert seconds >= 3.0
        assert f"| {arm} seed42 | {int(ckpts[-1].name[5:])} |" in table
    one_pass_cfg = (tmp_path / "runs" / "equal_time_smoke_one_pass_seed42" / "config.yaml").read_text()
    assert re.search(r"one_pass:\n\s+enabled: true", one_pass_cfg), one_pass_cfg
