"""Every command that runs episodes from --seed on (--episodes of them) checks the whole seed range
up front: each seed >= 0 (demos: >= 100000) and the last < 2**32, the simulator's limit (gym-aloha
places objects with np.random.RandomState(seed)). One line, exit code 2, before any episode runs
and before anything is written; numpy's traceback at the first bad seed used to end the run, after
the good ones ran. The generated (non-simulated) demo dataset's trajectory seed must be >= 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dit4dit_npu.data.cli import demo_main as data_demo_main
from dit4dit_npu.sim.cli import demos_main, eval_main
from dit4dit_npu.sim.errors import SimError
from dit4dit_npu.sim.tasks import SEED_LIMIT, check_seed_range
from dit4dit_npu.train.ops_cli import success_curve_main as curve_main

ROOT = Path(__file__).resolve().parents[1]
PAST = ["--seed", str(SEED_LIMIT - 1), "--episodes", "2"]  # episode 1 is fine, episode 2's seed is 2**32


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_the_range_rule() -> None:
    check_seed_range(0, 1)
    check_seed_range(SEED_LIMIT - 50, 50)  # the last seed is 2**32 - 1
    with pytest.raises(SimError, match=r"^--seed -1 with --episodes 50: the episodes' seeds are -1\.\.48, expected each >= 0"):
        check_seed_range(-1, 50)
    with pytest.raises(SimError, match=r"seeds are 4294967295\.\.4294967296, .*< 2\*\*32 = 4294967296"):
        check_seed_range(SEED_LIMIT - 1, 2)
    with pytest.raises(SimError, match="demo seeds start at 100000"):
        check_seed_range(7, 1, low=100_000)


@pytest.mark.parametrize("seed_args", [["--seed", "-1", "--episodes", "2"], PAST], ids=["negative", "past-2**32"])
def test_sim_eval_refuses_the_range_before_any_episode(tmp_path, capsys, seed_args) -> None:
    out = tmp_path / "eval"
    assert eval_main(["--scripted", "hold", *seed_args, "--max-steps", "2", "--videos", "0", "--out", str(out)]) == 2
    assert one_line(capsys).startswith(f"error: --seed {seed_args[1]} with --episodes 2: the episodes' seeds are")
    assert not out.exists()


@pytest.mark.parametrize("seed_args", [["--seed", "-1"], PAST], ids=["negative", "past-2**32"])
def test_success_curve_refuses_the_range_before_any_checkpoint(tmp_path, capsys, seed_args) -> None:
    # a run with no checkpoints: the range is said first, not "no checkpoints" nor a traceback later
    assert curve_main(["--run", str(tmp_path), *seed_args]) == 2
    assert "expected each >= 0 and < 2**32" in one_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_sim_demos_refuses_the_range_before_any_episode(tmp_path, capsys) -> None:
    out = tmp_path / "demos"
    assert demos_main(["--size", "32x40", *PAST, "--out", str(out)]) == 2
    assert "the episodes' seeds are 4294967295..4294967296" in one_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("argv", [
    [sys.executable, "-m", "dit4dit_npu.eval.feature_probe", "--policy", "p", "--episodes", "10", "--seed", "-1"],
    [sys.executable, "-m", "dit4dit_npu.eval.video_picture", "--policy", "p", "--demos", "d", "--seed", "-1",
     "--out", "x.png"],
    [sys.executable, "bench/rtc_sim.py", "--seed", "-1", "--episodes", "3"],
], ids=["feature_probe", "video_picture", "bench-rtc_sim"])
def test_the_other_seeded_commands_refuse_the_range(tmp_path, argv) -> None:
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert "error: --seed -1" in r.stderr and "expected each >= 0" in r.stderr


def test_the_generated_demo_datasets_seed_is_not_negative(tmp_path, capsys) -> None:
    out = tmp_path / "demo"
    assert data_demo_main(["--out", str(out), "--episodes", "2", "--seed", "-1"]) == 2
    assert one_line(capsys) == "error: seed (--seed): expected an int >= 0, got -1"
    assert not out.exists()
