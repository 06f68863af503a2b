"""python -m dit4dit_npu.train.success_curve over several runs against training wall time (--x time):
on run folders laid out as training leaves them, with each checkpoint's closed-loop results already
kept (the tool reads kept results instead of evaluating again; the evaluation itself runs in
tests/test_equal_time.py's smoke)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dit4dit_npu.train.ops_cli import success_curve_main as main


def fake_run(root: Path, name: str, checkpoints: dict[int, tuple[float | None, int]], episodes: int = 4,
             earlier: int | None = None) -> Path:
    """A run folder: step -> (training seconds, or None for an older version's; successes), each
    checkpoint's results kept for ``episodes`` episodes (all but the last: ``earlier``, if given)."""
    run = root / name
    last = max(checkpoints)
    for step, (seconds, wins) in checkpoints.items():
        n = episodes if earlier is None or step == last else earlier
        ckpt = run / "checkpoints" / f"step_{step:06d}"
        (ckpt / "policy").mkdir(parents=True)
        state = {"step": step}
        if seconds is not None:
            state["train_time_s"] = seconds
        torch.save(state, ckpt / "trainer_state.pt")
        kept = run / "sim_curve" / f"step_{step:06d}_seed0x{n}"
        kept.mkdir(parents=True)
        (kept / "results.json").write_text(json.dumps({"summary": {"successes": wins, "episodes": n, "wall_s": 1.0}}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "val/action_mse": 0.1 / s}) + "\n" for s in checkpoints))
    return run


def test_several_runs_against_training_time_one_plot_and_one_table(tmp_path: Path, capsys) -> None:
    a = fake_run(tmp_path, "no_video", {100: (60.0, 1), 200: (120.0, 3)})
    b = fake_run(tmp_path, "joint", {50: (61.0, 0), 100: (119.0, 2)})
    out, table = tmp_path / "curve.png", tmp_path / "curve.md"
    code = main(["--run", str(a), "--run", str(b), "--label", "no-video", "--label", "joint", "--x", "time",
                 "--episodes", "4", "--out", str(out), "--table", str(table)])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "no-video: step 200 (2.0 training min): held-out action MSE 0.0005" in "\n".join(lines)
    assert lines[-2].startswith("no-video: success 3/4 = 75.0%") and lines[-1].startswith("joint: success 2/4 = 50.0%")
    assert out.stat().st_size > 0
    rows = table.read_text().splitlines()
    assert rows[2] == "| no-video | 100 | 1.00 | 1/4 = 25.0% | 4.6-69.9% | 0.0010 |"
    assert rows[-1].startswith("| joint | 100 | 1.98 | 2/4 = 50.0% |")
    curve = json.loads((b / "sim_curve" / "curve_seed0x4.json").read_text())
    assert [r["train_time_s"] for r in curve] == [61.0, 119.0]


def test_against_time_a_checkpoint_without_its_training_time_is_refused_first(tmp_path: Path, capsys) -> None:
    a = fake_run(tmp_path, "a", {100: (60.0, 1)})
    old = fake_run(tmp_path, "old", {100: (None, 1)})
    out = tmp_path / "curve.png"
    assert main(["--run", str(a), "--run", str(old), "--x", "time", "--episodes", "4", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not record its training time" in err[0] and "--x step" in err[0], err
    assert not out.exists() and not (a / "sim_curve" / "curve_seed0x4.json").exists()  # before the first run's curve


def test_against_steps_an_older_checkpoint_plots_as_before(tmp_path: Path, capsys) -> None:
    old = fake_run(tmp_path, "old", {100: (None, 1), 200: (None, 4)})
    assert main(["--run", str(old), "--episodes", "4", "--out", str(tmp_path / "c.png")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("success 4/4 = 100.0%")


@pytest.mark.parametrize("labels", [["x"], ["x", "y", "z"]])
def test_one_label_per_run(tmp_path: Path, capsys, labels: list[str]) -> None:
    a, b = fake_run(tmp_path, "a", {1: (1.0, 1)}), fake_run(tmp_path, "b", {1: (1.0, 1)})
    argv = ["--run", str(a), "--run", str(b), "--out", str(tmp_path / "c.png")]
    for label in labels:
        argv += ["--label", label]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--label: given {len(labels)} time(s) for 2 --run" in err[0], err


def test_intermediate_episodes_fewer_before_the_last_checkpoint_all_on_the_last(tmp_path: Path, capsys) -> None:
    """--intermediate-episodes 2 reads the earlier checkpoints' 2-episode results and the last one's
    4-episode result (a folder each, named by its count), and the rows carry each one's own count."""
    a = fake_run(tmp_path, "a", {100: (60.0, 1), 200: (120.0, 2), 300: (180.0, 3)}, episodes=4, earlier=2)
    table = tmp_path / "curve.md"
    code = main(["--run", str(a), "--x", "time", "--episodes", "4", "--intermediate-episodes", "2",
                 "--out", str(tmp_path / "c.png"), "--table", str(table)])
    assert code == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("success 3/4 = 75.0%")
    rows = table.read_text().splitlines()[2:]
    assert [r.split("|")[4].strip().split(" ")[0] for r in rows] == ["1/2", "2/2", "3/4"]
    curve = json.loads((a / "sim_curve" / "curve_seed0x4_earlier2.json").read_text())
    assert [r["episodes"] for r in curve] == [2, 2, 4]


@pytest.mark.parametrize("m", ["0", "5"])
def test_intermediate_episodes_out_of_range_is_one_line(tmp_path: Path, capsys, m: str) -> None:
    a = fake_run(tmp_path, "a", {1: (1.0, 1)})
    assert main(["--run", str(a), "--episodes", "4", "--intermediate-episodes", m, "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--intermediate-episodes: expected 1..4 (at most --episodes), got {m}" in err[0], err
    assert not (tmp_path / "c.png").exists()


def test_intermediate_episodes_with_smoke_is_refused_not_ignored(tmp_path: Path, capsys) -> None:
    """--smoke sets its own one episode per checkpoint: an --intermediate-episodes beside it was
    accepted and dropped (and the smoke went on to evaluate)."""
    a = fake_run(tmp_path, "a", {1: (1.0, 1)})
    assert main(["--run", str(a), "--smoke", "--intermediate-episodes", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--intermediate-episodes: --smoke evaluates one episode per checkpoint" in err[0], err
    assert not (a / "sim_curve" / "smoke.png").exists()


@pytest.mark.parametrize(("clocks", "axis"), [
    ({"wall"}, "training wall time"),
    ({"process_cpu"}, "training CPU time (one thread)"),
    ({None}, "training time (each run's budget clock)"),  # checkpoints from before the clock was recorded
    ({"wall", "process_cpu"}, "training time (each run's budget clock)"),
])
def test_the_time_axis_names_the_clock_the_checkpoints_record(clocks: set, axis: str) -> None:
    """A budget counted in CPU time (trainer.train_time_clock=process_cpu, for a shared host) was
    plotted as 'training wall time'."""
    from dit4dit_npu.train.success_curve import time_axis

    assert time_axis(clocks) == axis


@pytest.mark.parametrize("argv, message", [
    (["--workers", "2", "--episode-timeout", "0"], "--episode-timeout: expected seconds > 0, got 0"),
    (["--episode-timeout", "60"], "--episode-timeout 60: --workers 1 runs the episodes in this process"),
    (["--workers", "2", "--intermediate-episodes", "1", "--episode-timeout", "60"],
     "--episode-timeout 60: --workers 2 with --intermediate-episodes 1 runs in this process"),
    (["--workers", "2", "--smoke", "--episode-timeout", "60"],
     "--episode-timeout 60: --workers 2 with --smoke (one episode per checkpoint) runs in this process"),
])
def test_episode_timeout_bad_values_are_one_line_before_any_eval(tmp_path: Path, capsys, argv: list[str],
                                                                  message: str) -> None:
    """The eval's own check, said before the first checkpoint's eval (an earlier checkpoint's smaller
    eval counts: with one episode it runs in this process, so the deadline would do nothing)."""
    a = fake_run(tmp_path, "a", {1: (1.0, 1)})
    assert main(["--run", str(a), "--episodes", "4", "--out", str(tmp_path / "c.png"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "c.png").exists()


def test_episode_timeout_reaches_the_eval(tmp_path: Path, capsys) -> None:
    """A checkpoint without kept results is evaluated with the curve's --episode-timeout (here its
    policy folder is empty, so the eval then refuses it: what is checked is the eval's command)."""
    a = fake_run(tmp_path, "a", {1: (1.0, 1)})
    (a / "checkpoints" / "step_000002" / "policy").mkdir(parents=True)
    torch.save({"step": 2}, a / "checkpoints" / "step_000002" / "trainer_state.pt")
    code = main(["--run", str(a), "--episodes", "4", "--workers", "2", "--episode-timeout", "30",
                 "--out", str(tmp_path / "c.png")])
    out = capsys.readouterr().out
    assert code != 0 and "--workers 2 --videos 0" in out and "--episode-timeout 30.0" in out, out
