"""The wall-time budget (trainer.max_train_time_s) and time checkpoints (trainer.save_every_s):
the clock's arithmetic on a clock the test moves (no timed test), the config's refusals, and the
real trainer (in this process, DeepSpeed ZeRO-2) stopping at its first step past a budget, saving
and exporting there, recording its training seconds per checkpoint, and a resume continuing them."""

from __future__ import annotations

import json

import pytest
import torch
from train_runs import TINY, one_line_error, run_training, tiny_overrides, train_here

from dit4dit_npu.config import ConfigError, load_config
from dit4dit_npu.train import checkpoint as ckpt_io
from dit4dit_npu.train.budget import TrainClock
from dit4dit_npu.train.metrics import read_metrics

CONFIG = "configs/aloha/dit4dit_aloha_transfer_cube_tiny.yaml"


class Now:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_paused_time_does_not_count_and_a_restored_count_continues() -> None:
    now = Now()
    clock = TrainClock(limit_s=10.0, every_s=None, now=now)
    clock.restore(4.0)
    clock.start()
    now.t += 3
    with clock.paused():  # an evaluation or a save
        now.t += 100
        with clock.paused():  # nested (an export inside a save)
            now.t += 5
        assert clock.seconds == 7.0
    assert clock.seconds == 7.0 and not clock.spent()
    now.t += 3
    assert clock.spent() and clock.crossed(clock.seconds) == (True, True)
    clock.stop()
    now.t += 50
    assert clock.seconds == 10.0


def test_time_checkpoints_at_the_first_boundary_past_each_multiple() -> None:
    clock = TrainClock(limit_s=None, every_s=10.0, now=Now())
    clock.start()
    seen = [s for s in (3.0, 9.9, 10.2, 12.0, 19.0, 31.0, 35.0, 40.0) if clock.crossed(s)[1]]
    # 31 is past both 20 and 30: one checkpoint, the next after 40
    assert seen == [10.2, 31.0, 40.0]
    assert clock.crossed(1e9) == (False, True)  # no budget: never a stop


def test_a_resumed_clock_checkpoints_after_its_own_count() -> None:
    clock = TrainClock(limit_s=None, every_s=10.0, now=Now())
    clock.restore(25.0)  # the checkpoint of the 20 s mark, saved at 25 s
    clock.start()
    assert not clock.crossed(29.0)[1] and clock.crossed(30.5)[1]


def test_an_unrecorded_count_is_unknown_and_nothing_is_enabled_without_settings() -> None:
    clock = TrainClock(limit_s=None, every_s=None, now=Now())
    assert not clock.enabled
    clock.restore(None)
    assert not clock.known and clock.seconds == 0.0


@pytest.mark.parametrize("key", ["max_train_time_s", "save_every_s"])
@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf"])
def test_bad_budgets_are_one_line_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"^trainer\.{key}: got .*, expected a number of seconds > 0, or null"):
        load_config(CONFIG, [f"trainer.{key}={value}"])


def test_budgets_load_as_seconds() -> None:
    cfg = load_config(CONFIG, ["trainer.max_train_time_s=90", "trainer.save_every_s=30.5"])
    assert (cfg.trainer.max_train_time_s, cfg.trainer.save_every_s) == (90.0, 30.5)
    assert load_config(CONFIG, []).trainer.max_train_time_s is None


def _seconds(run_dir) -> dict[int, float]:
    return {s: ckpt_io.read_trainer_state(p)["train_time_s"] for s, p in ckpt_io.list_checkpoints(run_dir)}


@pytest.mark.slow
def test_the_trainer_stops_past_its_budget_saves_there_and_a_resume_continues_the_count(tmp_path, demo_root, capfd):
    # Any step of the tiny model takes far more than a millisecond: the budget ends at step 1, of 50.
    budget = {"trainer.max_train_steps": 50, "trainer.save_interval": 100, "trainer.eval_interval": 100,
              "trainer.max_train_time_s": 0.001}
    overrides = tiny_overrides(tmp_path, demo_root, **budget)
    r = train_here(overrides, capfd)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    run_dir = load_config(TINY, overrides).run_dir
    assert [s for s, _ in ckpt_io.list_checkpoints(run_dir)] == [1]
    assert (ckpt_io.final_dir_for(run_dir, 1) / "policy" / "policy.json").is_file()  # the policy, exported there
    first = _seconds(run_dir)[1]
    assert first >= 0.001
    assert "done: 1 steps (trainer.max_train_time_s=0.001 spent:" in r.stdout + r.stderr
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert any("val/action_mse" in row for row in rows)  # the last step's evaluation, at the stop
    assert [row["train_time_s"] for row in rows if "total_loss" in row] == [pytest.approx(first, rel=0.5)]

    # The same budget again: already spent at its checkpoint, nothing trains
    r = train_here([*overrides, "trainer.resume=auto"], capfd)
    assert r.returncode == 0 and "done: 1 steps (trainer.max_train_time_s=0.001 spent" in r.stdout + r.stderr
    assert [s for s, _ in ckpt_io.list_checkpoints(run_dir)] == [1]

    # No budget, a time checkpoint at every step (each takes over a millisecond), to step 3: the
    # count goes on from the first run's
    more = tiny_overrides(tmp_path, demo_root, **{**budget, "trainer.max_train_time_s": "null",
                                                   "trainer.save_every_s": 0.001, "trainer.max_train_steps": 3,
                                                   "trainer.resume": "auto"})
    run_training(more)
    seconds = _seconds(run_dir)
    assert sorted(seconds) == [1, 2, 3] and seconds[1] == first
    assert first < seconds[2] < seconds[3]


@pytest.mark.slow
def test_a_budget_refuses_a_checkpoint_without_its_training_time(tmp_path, demo_root, capfd):
    overrides = tiny_overrides(tmp_path, demo_root, **{"trainer.max_train_steps": 2})
    run_dir = run_training(overrides)
    # a checkpoint as an older version saved it: no train_time_s (its manifest made anew to match)
    ckpt = ckpt_io.final_dir_for(run_dir, 2)
    state = ckpt_io.read_trainer_state(ckpt)
    del state["train_time_s"]
    torch.save(state, ckpt / ckpt_io.TRAINER_STATE)
    ckpt_io.write_manifest(ckpt)
    before = json.loads((ckpt / ckpt_io.MANIFEST).read_text())
    r = train_here([*tiny_overrides(tmp_path, demo_root, **{"trainer.max_train_steps": 4}), "trainer.resume=auto",
                    "trainer.max_train_time_s=600"], capfd)
    line = one_line_error(r)
    assert f"{ckpt} does not record its training time" in line and "trainer.max_train_time_s" in line, line
    assert [s for s, _ in ckpt_io.list_checkpoints(run_dir)] == [2]  # nothing written
    assert json.loads((ckpt / ckpt_io.MANIFEST).read_text()) == before
