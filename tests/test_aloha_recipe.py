"""scripts/aloha_recipe.sh's settings: every variable it reads is checked before anything runs (one line,
exit code 2, nothing written; a variable the chosen run does not read is refused, not ignored), the
run's config with the extra training overrides through train --dry-run before the first stage, and
each task runs end to end at SMOKE=1,
each from its own one tiny demo (1 expert episode at 32x48, in a temp folder): transfer cube with
the joint objective and the fitted VAE after video pretraining (the fit's smoke, 5-frame latent
cache, a video-only run, joint training started from its transformer, the closed loop with the
fitted VAE loaded from the exported policy), insertion with the defaults
(no_video, the random VAE: its own config, crop and state noise, demos, and eval scene). Between
them both objectives and both VAEs run. Each smoke is a subprocess (the script is what users run);
the insertion one took 264 s and 399 s in two runs here (2026-12-03, the shared 2-core machine at
load average 8-11; a 300-step expert demo, then five stages that each start Python and torch)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def recipe(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/aloha_recipe.sh", *args], cwd=ROOT, capture_output=True, text=True, timeout=1200,
        env={**os.environ, "PY": sys.executable, "DATA_ROOT": str(tmp_path / "data"), "OMP_NUM_THREADS": "1", **env},
    )


@pytest.mark.parametrize(("env", "message"), [
    ({"TASK": "stack"}, "error: TASK=stack: expected transfer_cube or insertion"),
    ({"OBJECTIVE": "video"}, "error: OBJECTIVE=video: expected no_video or joint"),
    ({"VAE": "real"}, "error: VAE=real: expected random or fitted"),
    ({"OBJECTIVE": "joint", "BACKPROP": "yes"}, "error: BACKPROP=yes: expected 0 or 1"),
    ({"BACKPROP": "0"}, "error: BACKPROP=0 with OBJECTIVE=no_video"),
    ({"EPISODES": "100x"}, "error: EPISODES=100x: expected a positive integer"),
    ({"DEMOS": "0"}, "error: DEMOS=0: expected a positive integer"),
    ({"STEPS": "8k"}, "error: STEPS=8k: expected a positive integer"),
    ({"PRETRAIN": "10k"}, "error: PRETRAIN=10k: expected a number of steps (0 = none)"),
    ({"PRETRAIN": "100", "PRETRAIN_DEMOS": "-5"}, "error: PRETRAIN_DEMOS=-5: expected a positive integer"),
    # each of these started 50 demos before
    ({"OBJECTIVE": "joint", "VIDEO_WEIGHT": "abc"}, "error: VIDEO_WEIGHT=abc: expected a number >= 0"),
    ({"OBJECTIVE": "joint", "VIDEO_WEIGHT": "-1"}, "error: VIDEO_WEIGHT=-1: expected a number >= 0"),
    ({"OBJECTIVE": "joint", "VIDEO_WEIGHT": "nan"}, "error: VIDEO_WEIGHT=nan: expected a number >= 0"),
    ({"OBJECTIVE": "joint", "VIDEO_WEIGHT": "1e400"}, "error: VIDEO_WEIGHT=1e400: expected a number >= 0"),
    ({"WORKERS": "0"}, "error: WORKERS=0: expected a positive integer"),
    ({"WORKERS": "abc"}, "error: WORKERS=abc: expected a positive integer"),
    ({"WORKERS": str(len(os.sched_getaffinity(0)) + 1)},
     f"error: WORKERS={len(os.sched_getaffinity(0)) + 1}: expected at most {len(os.sched_getaffinity(0))}, the CPUs"),
    ({"ENCODE_RANKS": "0"}, "error: ENCODE_RANKS=0: expected a positive integer"),
    ({"ENCODE_RANKS": "100000"}, f"error: ENCODE_RANKS=100000: expected at most {len(os.sched_getaffinity(0))}, the CPUs"),
    ({"ENCODE_RANKS": str(len(os.sched_getaffinity(0)) + 1)},
     f"error: ENCODE_RANKS={len(os.sched_getaffinity(0)) + 1}: expected at most {len(os.sched_getaffinity(0))}, the CPUs"),
    ({"SMOKE": "2"}, "error: SMOKE=2: expected 0 or 1"),
    ({"OMP_NUM_THREADS": "0"}, "error: OMP_NUM_THREADS=0: expected a positive integer"),
    ({"PY": "/nonexistent/python"}, "error: PY=/nonexistent/python: expected a Python executable"),
    ({"RUN_ID": "a/b"}, "error: RUN_ID=a/b: expected a run folder name"),
    ({"EPISODES": "4294967297"}, "error: EPISODES=4294967297: expected at most 2**32"),
    ({"INTERMEDIATE_EPISODES": "0"}, "error: INTERMEDIATE_EPISODES=0: expected a positive integer"),
    ({"EPISODES": "20", "INTERMEDIATE_EPISODES": "21"}, "error: INTERMEDIATE_EPISODES=21: expected at most EPISODES=20"),
    ({"SMOKE": "1", "INTERMEDIATE_EPISODES": "5"}, "error: INTERMEDIATE_EPISODES=5: SMOKE=1 sets its own"),
    ({"PREPARE_ONLY": "1", "INTERMEDIATE_EPISODES": "5"}, "error: INTERMEDIATE_EPISODES=5: PREPARE_ONLY=1 stops"),
    # an empty VAE_WEIGHTS took the default silently; a 23-digit STEPS wrapped in bash and went on to the demos
    ({"VAE": "fitted", "VAE_WEIGHTS": ""}, "error: VAE_WEIGHTS=: expected a tiny VAE's safetensors file"),
    ({"STEPS": "99999999999999999999999"}, "error: STEPS=99999999999999999999999: expected at most 18 digits"),
    # a setting the chosen run does not read: refused, not ignored
    ({"VIDEO_WEIGHT": "0.2"}, "error: VIDEO_WEIGHT=0.2: applies only to OBJECTIVE=joint"),
    ({"PRETRAIN_DEMOS": "10"}, "error: PRETRAIN_DEMOS=10: applies only with PRETRAIN > 0"),
    ({"VAE_WEIGHTS": "my.safetensors"}, "error: VAE_WEIGHTS=my.safetensors: applies only to VAE=fitted"),
    ({"SMOKE": "1", "DEMOS": "5"}, "error: DEMOS=5: SMOKE=1 sets its own"),
    ({"SMOKE": "1", "STEPS": "100"}, "error: STEPS=100: SMOKE=1 sets its own"),
    # the cheaper joint steps and the time budget (equal-time comparisons)
    ({"OBJECTIVE": "joint", "ONE_PASS": "yes"}, "error: ONE_PASS=yes: expected 0 or 1"),
    # set but empty: refused like any other bad value (it was taken as the default)
    ({"WORKERS": ""}, "error: WORKERS=: expected a positive integer"),
    ({"ENCODE_RANKS": ""}, "error: ENCODE_RANKS=: expected a positive integer"),
    ({"DEMOS": ""}, "error: DEMOS=: expected a positive integer"),
    ({"OBJECTIVE": ""}, "error: OBJECTIVE=: expected no_video or joint"),
    ({"OBJECTIVE": "joint", "VIDEO_SPAN": ""}, "error: VIDEO_SPAN=: expected a-b"),
    ({"OBJECTIVE": "joint", "VIDEO_EVERY": "0"}, "error: VIDEO_EVERY=0: expected a positive integer"),
    ({"OBJECTIVE": "joint", "VIDEO_EVERY": "2.5"}, "error: VIDEO_EVERY=2.5: expected a positive integer"),
    ({"ONE_PASS": "1"}, "error: ONE_PASS=1: applies only to OBJECTIVE=joint"),
    ({"VIDEO_EVERY": "4"}, "error: VIDEO_EVERY=4: applies only to OBJECTIVE=joint"),
    ({"OBJECTIVE": "joint", "VIDEO_SPAN": "0.5"}, "error: VIDEO_SPAN=0.5: expected a-b, the share of the training"),
    ({"OBJECTIVE": "joint", "VIDEO_SPAN": "-0.5"}, "error: VIDEO_SPAN=-0.5: expected a-b, the share of the training"),
    ({"VIDEO_SPAN": "0-0.5"}, "error: VIDEO_SPAN=0-0.5: applies only to OBJECTIVE=joint"),
    ({"TRAIN_MINUTES": "1h"}, "error: TRAIN_MINUTES=1h: expected a number of training minutes > 0"),
    ({"TRAIN_MINUTES": "0"}, "error: TRAIN_MINUTES=0: expected a number of training minutes > 0"),
    ({"TRAIN_MINUTES": "-3"}, "error: TRAIN_MINUTES=-3: expected a number of training minutes > 0"),
    ({"TRAIN_MINUTES": ""}, "error: TRAIN_MINUTES=: expected a number of training minutes > 0"),
    ({"PREPARE_ONLY": "2"}, "error: PREPARE_ONLY=2: expected 0 or 1"),
    ({"PREPARE_ONLY": "1", "EPISODES": "100"}, "error: EPISODES=100: PREPARE_ONLY=1 stops before the eval"),
    # joint with the video loss weighted 0 and detached features: nothing would train the backbone
    ({"OBJECTIVE": "joint", "VIDEO_WEIGHT": "0", "BACKPROP": "0"}, "error: VIDEO_WEIGHT=0 with BACKPROP=0: no loss"),
])
def test_a_bad_setting_is_one_line_before_anything_runs(tmp_path: Path, env: dict[str, str], message: str) -> None:
    r = recipe(tmp_path, **env)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith(message), r.stderr
    assert not (tmp_path / "data").exists()


def read_only_folder(tmp_path: Path) -> Path:
    """A folder this process cannot write to: a mode-555 one, or for root (who writes through modes)
    a read-only mount's."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    if not os.access(folder, os.W_OK):
        return folder
    for candidate in (Path("/proc/sys"), Path("/sys/fs/cgroup")):
        if candidate.is_dir() and not os.access(candidate, os.W_OK):
            return candidate
    pytest.skip("no folder here that this user cannot write to")


@pytest.mark.parametrize("where", ["missing", "read-only", "a-folder"])
def test_a_fitted_vae_path_the_fit_cannot_write_is_one_line_before_the_demos(tmp_path: Path, where: str) -> None:
    """VAE=fitted with a VAE_WEIGHTS file that is missing: the fit stage writes it after the demos,
    so a folder that is not there or not writable is refused first (it was found after the demos,
    or a typo'd folder was created anew); a folder given as the file too."""
    folder = {"missing": lambda: tmp_path / "nope", "read-only": lambda: read_only_folder(tmp_path),
              "a-folder": lambda: tmp_path}[where]()
    weights = tmp_path if where == "a-folder" else folder / "vae.safetensors"
    r = recipe(tmp_path, VAE="fitted", VAE_WEIGHTS=str(weights))
    expected = {"missing": f"no folder {folder} (the file is missing, so the fit stage would write it there)",
                "read-only": f"folder {folder} is not writable (the file is missing, so the fit stage would write it there)",
                "a-folder": "is a folder, expected a tiny VAE's safetensors file"}[where]
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"error: VAE_WEIGHTS={weights}: {expected}"], r.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "nope").exists()


@pytest.mark.parametrize(("env", "overrides", "message"), [
    ({}, ["trainer.max_train_step=5"], "unknown config key 'trainer.max_train_step' (did you mean trainer.max_train_steps?)"),
    ({}, ["trainer.learning_rate.action_model=abc"], "trainer.learning_rate.action_model: got 'abc', expected float"),
    ({"OBJECTIVE": "joint", "BACKPROP": "0"}, ["trainer.loss_scale.future_video=0"],
     "backbone.transformer gets no loss: the video loss is weighted 0"),
    ({"OBJECTIVE": "joint", "VIDEO_WEIGHT": "0", "PRETRAIN": "10"}, [],  # the pretraining run: the video loss alone
     "the video pretraining run's config (PRETRAIN=10 and the extra overrides): backbone.transformer gets no loss"),
    # ONE_PASS and VIDEO_EVERY reach the run's config: its own checks refuse what they rule out
    ({"OBJECTIVE": "joint", "ONE_PASS": "1"}, ["framework.cosmos25.video_loss_batch_fraction=0.5"],
     "framework.cosmos25.video_loss_batch_fraction: got 0.5, expected 1.0 with one_pass.enabled"),
    ({"OBJECTIVE": "joint", "VIDEO_EVERY": "4"}, ["framework.cosmos25.training=action"],
     "trainer.video_loss_interval: got 4, expected 1 unless framework.cosmos25.training is 'joint'"),
    ({"OBJECTIVE": "joint", "VIDEO_SPAN": "0.5-0.25"}, [],
     "trainer.video_loss_span: got [0.5, 0.25], expected [start, end] with 0 <= start < end <= 1"),
], ids=["typo", "bad-value", "untrained-backbone", "pretraining-weight-0", "one-pass", "video-every", "video-span"])
def test_the_training_overrides_are_checked_before_anything_runs(tmp_path: Path, env, overrides, message) -> None:
    """The run's config, with the settings and the extra overrides, through train --dry-run before
    the first stage (it used to be found after the demos, statistics and caches were built)."""
    r = recipe(tmp_path, *overrides, **env)
    assert r.returncode == 2 and r.stdout == ""
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the ") and message in err[0], r.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(("env", "argument", "message"), [
    ({}, "--help", "error: --help: expected a training override key=value (a.b=c)"),
    ({}, "trainer.max_train_steps=5", "error: trainer.max_train_steps=5: the recipe sets trainer.max_train_steps (from "),
    ({"TRAIN_MINUTES": "5"}, "trainer.lr_schedule_clock=steps", "error: trainer.lr_schedule_clock=steps: the recipe sets "),
    ({}, "run_id=mine", "error: run_id=mine: the recipe sets run_id (from "),
])
def test_an_argument_that_is_no_override_or_sets_what_the_recipe_sets_is_refused(tmp_path: Path, env, argument,
                                                                                   message) -> None:
    """--help reached the config check's own CLI, which printed its usage and passed; the schedule's
    keys were silently replaced by the recipe's (they come after the extra overrides)."""
    r = recipe(tmp_path, argument, **env)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.startswith(message), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "data").exists()


def test_the_curve_stage_takes_the_task_and_refuses_an_unknown_one(tmp_path: Path, capsys) -> None:
    """The recipe's eval stage (success_curve --task, passed on to sim.eval): a bad task is one line
    before any checkpoint is looked for."""
    from dit4dit_npu.train.ops_cli import success_curve_main as main

    assert main(["--run", str(tmp_path), "--task", "stack"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown task 'stack'" in err[0] and "insertion" in err[0], err


@pytest.mark.slow
def test_joint_with_the_fitted_vae_after_video_pretraining_smoke(tmp_path: Path) -> None:
    if importlib.util.find_spec("gym_aloha") is None:
        pytest.skip("simulation extra not installed (pip install -e '.[sim]')")
    # with an option of the joint step: the joint run's alone (the pretraining run refused it)
    r = recipe(tmp_path, f"run_root_dir={tmp_path / 'runs'}", SMOKE="1", OBJECTIVE="joint", VAE="fitted",
               PRETRAIN="2", VIDEO_SPAN="0-0.5", MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.fullmatch(r"success \d+/1.*", r.stdout.strip().splitlines()[-1]), r.stdout[-1000:]
    data = tmp_path / "data"
    assert (data / "transfer_cube_32x48_recipe_tiny_vae_smoke.safetensors").is_file()
    assert any(p.name.startswith("transfer_cube_32x48_recipe_latents_5frames_fitted") for p in data.iterdir())
    runs = tmp_path / "runs"
    pretrained = runs / "aloha_recipe_smoke_fittedvae_video_only_2"
    assert (pretrained / "checkpoints" / "step_000002" / "policy").is_dir()
    # the joint run started from the video-only run's transformer, with a fresh action head
    said = re.search(r"^trainer.init_from: backbone.transformer \(\d+ tensors\) from (\S+) \(step 2\); "
                     r"action_model at its initialization \(not in the policy\)$", r.stdout, re.M)
    assert said and Path(said.group(1)).resolve() == (pretrained / "checkpoints" / "step_000002" / "policy").resolve()
    # OBJECTIVE=joint's defaults: the action loss into the backbone, the video loss at weight 0.2
    joint = runs / "aloha_recipe_smoke_joint_bp1_vw0.2_vspan0-0.5_fittedvae_pretrain2x1"
    assert "video_loss_span:\n  - 0.0\n  - 0.5\n" in (joint / "config.yaml").read_text()
    assert "video_loss_span:\n  - 0.0\n  - 1.0\n" in (pretrained / "config.yaml").read_text()


@pytest.mark.slow
def test_insertion_smoke(tmp_path: Path) -> None:
    if importlib.util.find_spec("gym_aloha") is None:
        pytest.skip("simulation extra not installed (pip install -e '.[sim]')")
    r = recipe(tmp_path, f"run_root_dir={tmp_path / 'runs'}", SMOKE="1", TASK="insertion",
               MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.fullmatch(r"success \d+/1.*", r.stdout.strip().splitlines()[-1]), r.stdout[-1000:]
    data = tmp_path / "data"
    demos = json.loads((data / "insertion_32x48_recipe" / "meta" / "sim_demos.json").read_text())
    assert demos["task"] == "insertion" and demos["episodes"] == 1
    assert (data / "insertion_32x48_recipe_latents").is_dir()
    run = tmp_path / "runs" / "aloha_recipe_insertion_smoke"
    results = sorted((run / "sim_curve").glob("step_*/results.json"))
    assert len(results) == 2  # both checkpoints, each evaluated in the insertion scene
    assert all(json.loads(r.read_text())["summary"]["task"] == "insertion" for r in results)
