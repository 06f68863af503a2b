"""scripts/metaworld_recipe.sh: every setting is checked before anything runs (one line, exit code 2,
nothing written; a setting the run does not read is refused, not ignored), the extra training
overrides through train --dry-run; and, where the lerobot 0.6 side venv is built (the interop tier:
.lerobot06/, bash scripts/lerobot_check.sh --build-only), the whole recipe at SMOKE=1: one reach-v3
demo recorded through lerobot's env, the latent statistics and cache, 2 training steps, the policy
prepared for lerobot, one lerobot-eval episode in the lean env scored per task, and the language
test's path (--policy.replace_instruction). 4.5 min here under load 3.5 (2026-12-06). The same for
lerobot's own ACT and Diffusion Policy (POLICY=act|diffusion): 2 lerobot-train steps through
scripts/lerobot06/train_budget.py (the CPU-time budget's watcher, whose stop at the budget is checked
here in every tier with a stand-in trainer: the real one lives only in the side venv), then the same
lerobot-eval and score: ACT 2 min here, Diffusion 17.5 min with its default 100 denoising steps
(2026-12-07, load ~3), so its test asks for 10 (4 min)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIDE = ROOT / ".lerobot06"


def recipe(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/metaworld_recipe.sh", *args], cwd=ROOT, capture_output=True, text=True, timeout=1200,
        env={**os.environ, "PY": sys.executable, "DATA_ROOT": str(tmp_path / "data"), "OMP_NUM_THREADS": "1",
             "LEROBOT06_DIR": str(tmp_path / "side"), **env},
    )


def assert_refused(r: subprocess.CompletedProcess, tmp_path: Path, message: str) -> None:
    """One line on stderr starting with ``message``, exit code 2, and no data or side venv written."""
    assert r.returncode == 2 and r.stderr.startswith(message) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "side").exists()


@pytest.mark.parametrize(("env", "message"), [
    ({"SMOKE": "2"}, "error: SMOKE=2: expected 0 or 1"),
    ({"SMOKE": "1", "TASKS": "easy"}, "error: TASKS=easy: SMOKE=1 sets it"),
    ({"DEMOS": "0"}, "error: DEMOS=0: expected a positive integer"),
    ({"EPISODES": "20x"}, "error: EPISODES=20x: expected a positive integer"),
    ({"EPISODES": "99999999999999999999"}, "error: EPISODES=99999999999999999999: expected a positive integer below 10**9"),
    ({"WORKERS": "0"}, "error: WORKERS=0: expected a positive integer"),
    ({"SIZE": "100"}, "error: SIZE=100: expected a multiple of 16"),
    ({"TASKS": "reach v3"}, "error: TASKS=reach v3: expected mt10 or comma-separated"),
    ({"OBJECTIVE": "video"}, "error: OBJECTIVE=video: expected no_video or joint"),
    ({"VIDEO_WEIGHT": "0.2"}, "error: VIDEO_WEIGHT=0.2: applies only to OBJECTIVE=joint"),
    ({"OBJECTIVE": "joint", "VIDEO_WEIGHT": "-1"}, "error: VIDEO_WEIGHT=-1: expected a number > 0"),
    ({"OBJECTIVE": "joint", "VIDEO_WEIGHT": "nan"}, "error: VIDEO_WEIGHT=nan: expected a number > 0"),
    ({"TRAIN_MINUTES": "forty"}, "error: TRAIN_MINUTES=forty: expected a number of minutes > 0"),
    ({"TRAIN_MINUTES": "0"}, "error: TRAIN_MINUTES=0: expected a number of minutes > 0"),
    ({"RUN_ID": "a/b"}, "error: RUN_ID=a/b: expected a run folder name"),
    ({"PY": "/nonexistent/python"}, "error: PY=/nonexistent/python: expected a Python executable"),
    ({"DEMOS": "1001"}, "error: DEMOS=1001: expected at most 1000"),
    ({"SWAP": "drawer-open-v3"}, "error: SWAP=drawer-open-v3: expected comma-separated pairs"),
    ({"POLICY": "smolvla"}, "error: POLICY=smolvla: expected dit4dit, act or diffusion"),
    ({"POLICY": "act", "OBJECTIVE": "joint"}, "error: OBJECTIVE=joint: POLICY=act trains no video loss"),
    ({"POLICY": "diffusion", "VIDEO_WEIGHT": "0.2"}, "error: VIDEO_WEIGHT=0.2: POLICY=diffusion trains no video loss"),
    ({"POLICY": "act", "SWAP": "drawer-open-v3:drawer-close-v3"}, "error: SWAP=drawer-open-v3:drawer-close-v3: POLICY=act reads no instruction"),
    ({"POLICY": "act", "SWAP": ""}, "error: SWAP=: POLICY=act reads no instruction"),
    ({"RUN_ROOT": "/tmp/runs"}, "error: RUN_ROOT=/tmp/runs: applies only to POLICY=act or diffusion"),
    ({"POLICY": "act", "RUN_ROOT": ""}, "error: RUN_ROOT=: expected a folder"),
    # set but empty: refused, not taken as the default (LEROBOT06_DIR= would have built under /venv)
    ({"DEMOS": ""}, "error: DEMOS=: expected a value (unset it for the default, 10)"),
    ({"TRAIN_MINUTES": ""}, "error: TRAIN_MINUTES=: expected a value (unset it for the default, 40)"),
    ({"OBJECTIVE": "joint", "VIDEO_WEIGHT": ""}, "error: VIDEO_WEIGHT=: expected a value (unset it for the default, 0.2)"),
    ({"PY": ""}, "error: PY=: expected a value"),
    ({"RUN_ID": ""}, "error: RUN_ID=: expected a value (unset it for the default, metaworld_recipe_mt10_128_10demos_40min)"),
    ({"LEROBOT06_DIR": ""}, "error: LEROBOT06_DIR=: expected a value"),
])
def test_a_bad_setting_is_one_line_before_anything_runs(tmp_path: Path, env: dict, message: str) -> None:
    assert_refused(recipe(tmp_path, **env), tmp_path, message)


@pytest.mark.parametrize("name", ["LEROBOT06_DIR", "PROJECT_PYTHON", "PYTHON312", "METAWORLD_TASK"])
def test_the_lerobot_check_refuses_a_setting_set_but_empty(tmp_path: Path, name: str) -> None:
    r = subprocess.run(["bash", "scripts/lerobot_check.sh", "--build-only"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env={**os.environ, "LEROBOT06_DIR": str(tmp_path / "side"), name: ""})
    assert r.returncode == 2 and r.stderr == f"error: {name}=: expected a value (unset it for the default)\n", r.stderr
    assert not (tmp_path / "side").exists()


def test_a_bad_training_override_is_refused_by_the_runs_config_check(tmp_path: Path) -> None:
    r = recipe(tmp_path, "trainer.no_such_key=1")
    assert_refused(r, tmp_path, "error: the run's config")
    assert "no_such_key" in r.stderr, r.stderr


@pytest.mark.parametrize("override", ["datasets.vla_data.image_size=[64, 64]", "run_id=x",
                                      "datasets.vla_data.latent_cache=/tmp/c"])
def test_an_override_of_what_the_recipe_sets_is_refused(tmp_path: Path, override: str) -> None:
    assert_refused(recipe(tmp_path, override), tmp_path, f"error: {override}: the recipe sets it")


@pytest.mark.parametrize(("flag", "owner"), [
    ("--dataset.root=/elsewhere", "the demos"), ("--dataset.repo_id=lerobot/pusht", "the demos"),
    ("--output_dir=/tmp/o", "the run"), ("--steps=100", "the stop at TRAIN_MINUTES"),
    ("--save_freq=1000", "the stop at TRAIN_MINUTES"), ("--policy.type=diffusion", "POLICY"),
    ("--policy.device=cuda", "the budget is one process's CPU time"),
    ("--num_workers=4", "the budget is one process's CPU time"),
])
def test_a_lerobot_train_flag_the_recipe_sets_is_refused(tmp_path: Path, flag: str, owner: str) -> None:
    r = recipe(tmp_path, "--policy.dim_model=256", flag, POLICY="act")
    assert_refused(r, tmp_path, f"error: {flag}: the recipe sets it ({owner}")


@pytest.mark.parametrize("arg", ["trainer.max_train_steps=5", "--policy.dim_model", "policy.dim_model=256"])
def test_an_extra_argument_of_act_must_be_a_lerobot_train_flag(tmp_path: Path, arg: str) -> None:
    assert_refused(recipe(tmp_path, arg, POLICY="diffusion"), tmp_path, f"error: {arg}: expected a lerobot-train flag --key=value")


def budget(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/lerobot06/train_budget.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, **kw)


@pytest.mark.parametrize(("args", "message"), [
    (["--cpu-seconds", "-1", "--", "--policy.type=act"], "error: --cpu-seconds -1: expected a number of CPU seconds > 0"),
    (["--cpu-seconds", "inf", "--", "--policy.type=act"], "error: --cpu-seconds inf: expected a number of CPU seconds > 0"),
    (["--cpu-seconds", "60"], "error: expected `-- <lerobot-train flags>`"),
    (["--cpu-seconds", "60", "--"], "error: expected lerobot-train's flags after --"),
    (["--", "--policy.type=act"], "error: the following arguments are required: --cpu-seconds"),
    (["--cpu-seconds", "60", "--steps=5", "--", "--policy.type=act"], "error: --steps=5: not a flag of train_budget.py"),
    (["--cpu-seconds", "60", "--", "--output_dir=/tmp/x"], "error: --output_dir=/tmp/x: train_budget.py sets it (--out)"),
    (["--cpu-seconds", "60", "--lerobot-train", "/nonexistent/lerobot-train", "--", "--policy.type=act"],
     "error: --lerobot-train /nonexistent/lerobot-train: expected the side venv's lerobot-train"),
])
def test_train_budget_refuses_its_own_bad_flags_in_one_line(tmp_path: Path, args: list, message: str) -> None:
    out = tmp_path / "out"
    r = budget("--out", str(out), *args)
    assert r.returncode == 2 and r.stderr.startswith(message) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not out.exists() and not out.with_name("out.log").exists()


# A stand-in for lerobot-train (the real one lives only in the side venv): it spends CPU and writes
# checkpoints as lerobot 0.6 does, each step folder whole before ``last`` points at it.
TRAINER = """#!{python}
import os, sys, time
flags = dict(a.split("=", 1) for a in sys.argv[1:])
if "--fail" in flags:
    sys.exit("ValueError: no such policy")
ckpts = os.path.join(flags["--output_dir"], "checkpoints")
os.makedirs(ckpts)
parent = os.getppid()
for step in range(1, int(flags["--steps"]) + 1):
    if os.getppid() != parent:  # the budget script was killed (a test timeout): do not spin on for hours
        sys.exit("orphaned")
    t = time.process_time()
    while time.process_time() - t < 0.25:
        pass
    os.makedirs(os.path.join(ckpts, "%06d" % step, "pretrained_model"))
    if os.path.islink(os.path.join(ckpts, "last")):
        os.unlink(os.path.join(ckpts, "last"))
    os.symlink("%06d" % step, os.path.join(ckpts, "last"))
"""


@pytest.mark.slow  # over 4 s of one core: the full tier (the fast tier keeps to 3 minutes)
def test_train_budget_stops_the_trainer_at_the_budget_and_keeps_the_newest_checkpoint_within_it(tmp_path: Path) -> None:
    trainer = tmp_path / "lerobot-train"
    trainer.write_text(TRAINER.format(python=sys.executable))
    trainer.chmod(trainer.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "run" / "train"
    r = budget("--cpu-seconds", "3", "--out", str(out), "--lerobot-train", str(trainer), "--", "--steps=100000")
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads((out / "budget.json").read_text())
    assert result["stopped_by"] == "budget" and result["checkpoint_cpu_s"] <= 3 <= result["cpu_s"], result
    assert Path(result["pretrained_model"]) == out / "checkpoints" / f"{result['step']:06d}" / "pretrained_model"
    kept = sorted(d.name for d in (out / "checkpoints").iterdir() if d.name.isdigit())
    assert kept[-1] == f"{result['step']:06d}" and len(kept) <= 2, kept  # the newest 2 at most, none past the budget
    assert r.stdout.startswith(f"train_budget: step {result['step']} ") and r.stdout.strip().endswith(result["pretrained_model"])
    again = budget("--cpu-seconds", "3", "--out", str(out), "--lerobot-train", str(trainer), "--", "--steps=100000")
    assert again.returncode == 0 and again.stdout.startswith(f"reusing {out / 'budget.json'}: "), again.stdout + again.stderr
    failed = budget("--cpu-seconds", "3", "--out", str(tmp_path / "f"), "--lerobot-train", str(trainer), "--", "--fail=1")
    assert failed.returncode == 1 and failed.stderr.startswith("error: lerobot-train exited with code 1 before the budget: "
                                                                "ValueError: no such policy (log: "), failed.stderr
    assert not (tmp_path / "f" / "budget.json").exists()


needs_side = pytest.mark.skipif(not (SIDE / "venv" / "bin" / "python").is_file(),
                                reason="no lerobot 0.6 side venv: bash scripts/lerobot_check.sh --build-only builds it")


def score(*files: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(SIDE / "venv" / "bin" / "python"), "scripts/lerobot06/metaworld_side.py", "score", *map(str, files)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "client")])})


@pytest.mark.slow
@pytest.mark.interop
@needs_side
def test_score_counts_lerobots_episodes_per_task_and_refuses_what_is_not_them(tmp_path: Path) -> None:
    def info(name: str, group: str, tid: object, successes: object) -> Path:
        path = tmp_path / name
        path.write_text(json.dumps({"per_task": [{"task_group": group, "task_id": tid, "metrics": {"successes": successes}}]}))
        return path

    reach, push = info("a.json", "reach-v3", 0, [True, False, True]), info("b.json", "easy", 1, [False])
    r = score(reach, push)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("reach-v3: success 2/3 = 66.7% (95% Wilson CI ") and lines[1].startswith("button-press-topdown-v3: success 0/1")
    assert lines[2].startswith("average over 2 task(s): 33.3% (all episodes: 2/4 = 50.0%")
    for bad, words in [(info("c.json", "easy", -1, [True]), "task_id -1"), (info("d.json", "reach-v3", 0, []), "non-empty"),
                       (info("e.json", "reach-v3", 0, ["false"]), "true/false"), (info("f.json", "bogus-v9", 0, [True]), "bogus-v9")]:
        r = score(bad)
        assert r.returncode == 1 and r.stdout.startswith("FAIL score: ") and words in r.stdout, r.stdout + r.stderr
    r = score(reach, reach)
    assert r.returncode == 1 and "reach-v3 is in two of the files" in r.stdout, r.stdout


@pytest.mark.slow
@pytest.mark.interop
@needs_side
def test_the_recipe_runs_end_to_end_at_smoke_size_judged_by_lerobot_eval(tmp_path: Path) -> None:
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "client")]), "LEROBOT06_DIR": str(SIDE),
           "SMOKE": "1", "RUN_ID": f"metaworld_recipe_smoke_{tmp_path.name}"}
    r = recipe(tmp_path, f"run_root_dir={tmp_path / 'runs'}", **env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("reach-v3: success ") and "/1 = " in lines[0], r.stdout
    assert any(line.startswith("language: reach-v3's scene with reach-v3's instruction") for line in lines), r.stdout
    assert lines[-1].startswith("average over 1 task(s): "), r.stdout
    assert (tmp_path / "data" / "reach-v3_128_1demos_smoke").is_dir()


@pytest.mark.slow
@pytest.mark.interop
@needs_side
@pytest.mark.parametrize("policy", ["act", "diffusion"])
def test_lerobots_own_policy_runs_the_recipe_end_to_end_at_smoke_size(tmp_path: Path, policy: str) -> None:
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "client")]), "LEROBOT06_DIR": str(SIDE),
           "SMOKE": "1", "POLICY": policy, "RUN_ROOT": str(tmp_path / "runs")}
    # Diffusion's default 100 denoising steps per chunk made its one 500-step episode 17 min here;
    # 10 check the same path (and an extra lerobot-train flag reaching the policy lerobot-eval loads).
    extra = ["--policy.num_inference_steps=10"] if policy == "diffusion" else []
    r = recipe(tmp_path, *extra, **env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("reach-v3: success ") and "/1 = " in lines[0], r.stdout
    assert not any(line.startswith("language: ") for line in lines), r.stdout
    assert lines[-1].startswith("average over 1 task(s): "), r.stdout
    run, = (tmp_path / "runs").glob(f"metaworld_{policy}_reach-v3_128_1demos_smoke*")  # (+ the extra flags' hash)
    result = json.loads((run / "train" / "budget.json").read_text())
    if extra:
        config = json.loads((Path(result["pretrained_model"]) / "config.json").read_text())
        assert config["num_inference_steps"] == 10, config
    assert result["step"] == 2 and result["stopped_by"] == "lerobot-train's --steps", result
    assert (Path(result["pretrained_model"]) / "model.safetensors").is_file()
    assert (run / "lerobot_eval" / "step_2_1eps" / "reach-v3" / "eval_info.json").is_file()
