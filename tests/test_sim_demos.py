"""Expert demos -> LeRobot v3.0 through the incremental writer -> our reader and inspect --check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gym_aloha", reason="simulation extra not installed (pip install -e '.[sim]')")

from dit4dit_npu.data.lerobot import LeRobotDataset  # noqa: E402
from dit4dit_npu.sim.cli import demos_main  # noqa: E402
from dit4dit_npu.sim.demos import record_expert_episode, write_demos  # noqa: E402
from dit4dit_npu.sim.scene import AlohaScene  # noqa: E402
from dit4dit_npu.sim.tasks import CAMERAS, MOTORS, TRAIN_SEED0, get_task  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demos_round_trip_through_our_reader(tmp_path: Path) -> None:
    out = tmp_path / "transfer_cube_32x40"
    summary = write_demos(out, "transfer_cube", 2, (32, 40), progress=False)
    assert summary["seeds"] == [TRAIN_SEED0, TRAIN_SEED0 + 1] and summary["failed_seeds"] == []
    assert json.loads((out / "meta/sim_demos.json").read_text())["seeds"] == summary["seeds"]

    check = subprocess.run(
        [sys.executable, "-m", "dit4dit_npu.data.inspect", str(out), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode == 0 and "check: OK" in check.stdout, check.stdout + check.stderr

    ds = LeRobotDataset(out)
    assert ds.meta.info["codebase_version"] == "v3.0" and ds.fps == 50
    assert ds.num_episodes == 2 and ds.num_frames == 2 * summary["frames_per_episode"]
    assert ds.features["action"]["names"] == MOTORS and list(ds.meta.video_keys) == list(CAMERAS)
    assert ds[0]["task"] == get_task("transfer_cube").instruction

    # The dataset holds exactly what the expert did: rerun the second seed (physics only) and compare.
    with AlohaScene("transfer_cube", render=False) as scene:
        episode, first = record_expert_episode(scene, TRAIN_SEED0 + 1, summary["frames_per_episode"])
    assert first is not None
    start, end = ds.episode_bounds(1)
    np.testing.assert_array_equal(ds.column("action")[start:end], episode["actions"])
    np.testing.assert_array_equal(ds.column("observation.state")[start:end], episode["states"])
    # Episode 1 starts mid-file in the shared mp4s: its first frame is the seed's reset view.
    with AlohaScene("transfer_cube", (32, 40)) as scene:
        reset_view = scene.reset(TRAIN_SEED0 + 1)
    for key in CAMERAS:
        decoded = ds.frames_at([start, end - 1], key).astype(np.int16)  # and its last frame decodes
        assert np.abs(decoded[0] - reset_view[key]).mean() < 8  # h264 at crf 12
        assert np.abs(decoded[0] - ds.frames_at([0], key)[0]).mean() > 0.5  # not episode 0's view


@pytest.mark.slow
def test_workers_write_the_dataset_one_process_writes(tmp_path: Path) -> None:
    """Two worker processes, each with its own scene, give the same files as one scene in this
    process (that a late first seed is still written first: tests/test_sim_workers.py)."""
    one, two = tmp_path / "one", tmp_path / "two"
    s1 = write_demos(one, "transfer_cube", 2, (32, 40), progress=False)
    s2 = write_demos(two, "transfer_cube", 2, (32, 40), progress=False, workers=2)
    assert (s1["workers"], s2["workers"]) == (1, 2)
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(two) for p in two.rglob("*") if p.is_file())
    assert any(f.suffix == ".mp4" for f in files) and any(f.suffix == ".parquet" for f in files)
    for f in files:
        if f.name == "sim_demos.json":  # the same but for its timing and worker count
            a, b = json.loads((one / f).read_text()), json.loads((two / f).read_text())
            for key in ("sim_and_write_s", "workers"):
                a.pop(key), b.pop(key)
            assert a == b
        else:
            assert (one / f).read_bytes() == (two / f).read_bytes(), f


def test_demo_cli_bad_input_exit_2(tmp_path: Path, capsys) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    cases = [
        (["--task", "fold_shirt"], "unknown task 'fold_shirt'"),
        (["--seed", "7"], f"demo seeds start at {TRAIN_SEED0}"),
        (["--size", "240"], "--size: expected HxW"),
        (["--workers", "0"], "--workers: expected >= 1, got 0"),
        (["--out", str(tmp_path / "full")], "exists and is not empty"),
    ]
    for args, message in cases:
        argv = ["--episodes", "1", "--size", "32x40", "--out", str(tmp_path / "new"), *args]
        assert demos_main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and message in err, err
        assert not (tmp_path / "new").exists()
    assert (tmp_path / "full" / "x").read_text() == "keep me"
