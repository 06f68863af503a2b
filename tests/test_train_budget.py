"""The wall-time budget (trainer.max_train_time_s) and time checkpoints (trainer.save_every_s):
the clock's arithmetic on a clock the test moves (no timed test), the config's refusals, and the
real trainer (in this process, DeepSpeed ZeRO-2) stopping at its first step past a budget, saving
and exporting there, recording its training seconds per checkpoint, and a resume continuing them.
And the LR schedule on the training-time clock (trainer.lr_schedule_clock=train_time): its
position's arithmetic, its refusal without a budget, a run whose budget ends first annealing to
the floor, a resume that continues it without a false warning."""

from __future__ import annotations

import json
import re
import time

import pytest
import torch
from train_runs import TINY, cut_at, one_line_error, run_training, tiny_overrides, train_here

from dit4dit_npu.config import ConfigError, SchedulerKwargs, TrainerConfig, load_config
from dit4dit_npu.train import checkpoint as ckpt_io
from dit4dit_npu.train.budget import TrainClock
from dit4dit_npu.train.metrics import read_metrics
from dit4dit_npu.train.optim import build_scheduler, place_schedule, schedule_position

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
    config = (run_dir / "config.yaml").read_text()
    r = train_here([*tiny_overrides(tmp_path, demo_root, **{"trainer.max_train_steps": 4}), "trainer.resume=auto",
                    "trainer.max_train_time_s=600"], capfd)
    line = one_line_error(r)
    assert f"{ckpt} does not record its training time" in line and "trainer.max_train_time_s" in line, line
    assert [s for s, _ in ckpt_io.list_checkpoints(run_dir)] == [2]  # nothing written
    assert json.loads((ckpt / ckpt_io.MANIFEST).read_text()) == before
    assert (run_dir / "config.yaml").read_text() == config  # the refused config is not recorded as the run's


@pytest.mark.slow
def test_a_budget_refuses_a_checkpoint_counted_by_another_clock(tmp_path, demo_root, capfd):
    # seconds of CPU time continued as wall seconds (or back) would end the budget where neither
    # count says: refused before anything loads; the same clock resumes
    overrides = tiny_overrides(tmp_path, demo_root, **{"trainer.max_train_steps": 2, "trainer.max_train_time_s": 600,
                                                       "trainer.train_time_clock": "process_cpu"})
    run_dir = run_training(overrides)
    ckpt = ckpt_io.final_dir_for(run_dir, 2)
    assert ckpt_io.read_trainer_state(ckpt)["train_time_clock"] == "process_cpu"
    more = tiny_overrides(tmp_path, demo_root, **{"trainer.max_train_steps": 3, "trainer.max_train_time_s": 600,
                                                  "trainer.resume": "auto"})
    config = (run_dir / "config.yaml").read_text()
    line = one_line_error(train_here(more, capfd))
    assert line.endswith(f"{ckpt} counted its training seconds by trainer.train_time_clock=process_cpu, this run by "
                         "wall: resume it with trainer.train_time_clock=process_cpu, or start a new run (another run_id)"), line
    assert [s for s, _ in ckpt_io.list_checkpoints(run_dir)] == [2]  # nothing written
    assert (run_dir / "config.yaml").read_text() == config  # the refused config is not recorded as the run's
    r = train_here([*more, "trainer.train_time_clock=process_cpu"], capfd)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert [s for s, _ in ckpt_io.list_checkpoints(run_dir)] == [2, 3]
    # a checkpoint of a version that had both clocks but recorded neither may have counted on either:
    # its run continues on the clock it names (the process_cpu runs of those versions included)
    ckpt = ckpt_io.final_dir_for(run_dir, 3)
    state = ckpt_io.read_trainer_state(ckpt)
    del state["train_time_clock"]
    torch.save(state, ckpt / ckpt_io.TRAINER_STATE)
    ckpt_io.write_manifest(ckpt)
    r = train_here([*more, "trainer.max_train_steps=4", "trainer.train_time_clock=process_cpu"], capfd)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert [s for s, _ in ckpt_io.list_checkpoints(run_dir)] == [2, 3, 4]


# -- the LR schedule on the training-time clock (trainer.lr_schedule_clock=train_time) ---------------


def test_the_schedule_position_is_the_further_bound_capped_at_max_steps() -> None:
    # steps ahead of the budget's share: the step count (600 of 1000 steps, 30 % of the time)
    assert schedule_position(600, 30.0, 1000, 100.0) == 600.0
    # the budget's share ahead: a virtual step (100 steps, half the time: step 500 of 1000)
    assert schedule_position(100, 50.0, 1000, 100.0) == 500.0
    # past the budget, or every step done: never past the schedule's end
    assert schedule_position(100, 150.0, 1000, 100.0) == 1000.0
    assert schedule_position(1000, 10.0, 1000, 100.0) == 1000.0
    assert schedule_position(0, 0.0, 1000, 100.0) == 0.0


def _schedule(warmup: int) -> torch.optim.lr_scheduler.LambdaLR:
    cfg = TrainerConfig(max_train_steps=1000, num_warmup_steps=warmup, learning_rate={"base": 1e-3},
                        scheduler_specific_kwargs=SchedulerKwargs(min_lr=5e-5))
    return build_scheduler(torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=1e-3), cfg)


def test_placing_the_schedule_runs_its_warmup_and_decay_on_the_budget() -> None:
    sched = _schedule(warmup=100)
    sched.optimizer.step()
    sched.step()
    # 1 step but 5 % of the budget: half-way through the 100-step warmup, not 1 % of it
    place_schedule(sched, schedule_position(1, 5.0, 1000, 100.0))
    lr = sched.optimizer.param_groups[0]["lr"]
    assert lr == pytest.approx(0.5e-3) and sched.get_last_lr() == [lr]
    assert sched.last_epoch == 1  # it still counts optimizer steps (what a resume continues from)
    # half the budget: the middle of the cosine after the warmup
    place_schedule(sched, schedule_position(1, 55.0, 1000, 100.0))
    assert sched.optimizer.param_groups[0]["lr"] == pytest.approx(5e-5 + (1e-3 - 5e-5) / 2)
    # the budget spent: the floor, whatever the step count
    place_schedule(sched, schedule_position(1, 100.0, 1000, 100.0))
    assert sched.optimizer.param_groups[0]["lr"] == pytest.approx(5e-5)


def test_a_time_clocked_schedule_without_a_budget_is_one_line_naming_both_keys() -> None:
    with pytest.raises(ConfigError, match=r"^trainer\.lr_schedule_clock: train_time needs trainer\.max_train_time_s"):
        load_config(CONFIG, ["trainer.lr_schedule_clock=train_time"])
    cfg = load_config(CONFIG, ["trainer.lr_schedule_clock=train_time", "trainer.max_train_time_s=60"])
    assert cfg.trainer.lr_schedule_clock == "train_time"
    assert load_config(CONFIG, []).trainer.lr_schedule_clock == "steps"  # today's schedule, by default


def _lrs_at(run_dir, step: int) -> dict[str, float]:
    row = next(r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] == step and "total_loss" in r)
    return {k: v for k, v in row.items() if k.startswith("lr/")}


@pytest.mark.slow
@pytest.mark.parametrize("clock", ["steps", "train_time"])
def test_a_budget_that_ends_first_anneals_the_schedule_only_on_the_time_clock(tmp_path, demo_root, capfd, clock):
    # Any step of the tiny model takes far more than a millisecond: the budget ends at step 1, of 50.
    overrides = tiny_overrides(tmp_path, demo_root, **{
        "trainer.max_train_steps": 50, "trainer.save_interval": 100, "trainer.eval_interval": 100,
        "trainer.max_train_time_s": 0.001, "trainer.lr_schedule_clock": clock})
    r = train_here(overrides, capfd)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    run_dir = load_config(TINY, overrides).run_dir
    assert [s for s, _ in ckpt_io.list_checkpoints(run_dir)] == [1]
    lrs = _lrs_at(run_dir, 1)  # each group with parameters: 1e-3 at its peak, the floor 5e-5 (min_lr)
    assert lrs
    if clock == "train_time":  # 1 step of 50, the whole budget: the schedule's end
        assert lrs == {k: pytest.approx(5e-5) for k in lrs}
    else:  # the 50-step cosine has barely started
        assert lrs == {k: pytest.approx(1e-3, rel=0.01) for k in lrs}


@pytest.mark.slow
def test_a_time_clocked_resume_continues_without_a_warning_unless_the_budget_changed(tmp_path, demo_root, capfd):
    # A 1000-step schedule and a budget of 3 s, a checkpoint at every step: the run stops at its
    # budget, and its step-1 checkpoint stands at a position set by its seconds (1000 * s / 3), not
    # by its step, so the seconds' drift between the step boundary (where the LR was set) and the
    # save (where the seconds were recorded) would move the LR a little and warn, falsely.
    clocked = {"trainer.lr_schedule_clock": "train_time", "trainer.max_train_time_s": 3, "trainer.max_train_steps": 1000,
               "trainer.save_interval": 1, "trainer.eval_interval": 1000, "trainer.keep_last_checkpoints": 1000}
    full = run_training(tiny_overrides(tmp_path / "full", demo_root, **clocked))
    assert 1 < _seconds(full)[1] * 1000 / 3 < 1000  # the step-1 checkpoint is where the time clock decides
    cut_at(full, tmp_path / "cut", 1)
    r = train_here(tiny_overrides(tmp_path / "cut", demo_root, **{**clocked, "trainer.resume": "auto"}), capfd)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "resumed from" in r.stdout + r.stderr and "moves from" not in r.stdout + r.stderr

    # another budget: the schedule stands elsewhere at the same seconds, and the resume says so
    again = cut_at(full, tmp_path / "again", 1)
    r = train_here(tiny_overrides(tmp_path / "again", demo_root, **{
        **clocked, "trainer.max_train_time_s": 6, "trainer.resume": "auto"}), capfd)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert re.search(
        rf"warning: {re.escape(str(again))}/checkpoints/step_000001 was trained on a schedule by "
        r"trainer\.lr_schedule_clock=train_time \(max_train_time_s=3\.0\), this run's is by train_time "
        r"\(max_train_time_s=6\.0\) \(cosine_with_min_lr\): the learning rate \([\w.]+\) at step 1 "
        r"\(schedule position [\d.]+, by its training seconds\) moves from", r.stdout + r.stderr), r.stdout[-2000:]


def test_the_process_cpu_clock_counts_compute_not_waiting() -> None:
    # trainer.train_time_clock=process_cpu: runs that share cores with other work get the same compute
    from dit4dit_npu.train.trainer import CLOCKS

    cfg = load_config(CONFIG, ["trainer.max_train_time_s=60", "trainer.train_time_clock=process_cpu"])
    clock = TrainClock(cfg.trainer.max_train_time_s, None, CLOCKS[cfg.trainer.train_time_clock])
    clock.start()
    time.sleep(0.3)  # waiting: no CPU time
    waited = clock.seconds
    end = time.process_time() + 0.3
    while time.process_time() < end:  # computing
        pass
    assert waited < 0.1 <= 0.3 <= clock.seconds
    assert load_config(CONFIG).trainer.train_time_clock == "wall"
    with pytest.raises(ConfigError, match="train_time_clock"):
        load_config(CONFIG, ["trainer.train_time_clock=cpu"])
