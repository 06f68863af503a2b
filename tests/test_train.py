"""The trainer end to end on the tiny model: real accelerate + DeepSpeed ZeRO-2 on CPU (gloo).

The runs are shared (tests/train_runs.py): the default 4-step run (``full_run``), the 2-rank runs
(``two_rank_runs``) and the EMA + workers pair (``ema_workers_runs``) are trained once per session;
refused runs go through the trainer's console-script function in this process (no DeepSpeed
engine starts, so no fresh interpreter is needed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from train_runs import (
    ENV,
    LOSS_KEYS,
    ROOT,
    RUN,
    TINY,
    launch_two_ranks,
    run_train,
    run_training,
    tiny_overrides,
    train_here,
)

from dit4dit_npu.config import ConfigError, load_config
from dit4dit_npu.train import checkpoint as ckpt_io
from dit4dit_npu.train.metrics import read_metrics


def losses(run_dir: Path) -> dict[int, list[float]]:
    return {r["step"]: [r[k] for k in LOSS_KEYS] for r in read_metrics(run_dir / "metrics.jsonl") if "total_loss" in r}


def refused(r: subprocess.CompletedProcess, pattern: str) -> None:
    """Exit code 2, the last stderr line matches, no traceback."""
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert re.search(pattern, last), last
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_single_process_run_writes_everything(full_run):
    run_dir = full_run
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "total_loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        for key in (*LOSS_KEYS, "grad_norm", "data_time", "step_time", "samples_per_s"):
            assert r[key] is not None, key
        assert {"lr/backbone.transformer", "lr/action_model"} <= set(r)
    assert any("val/action_mse" in r for r in read_metrics(run_dir / "metrics.jsonl"))
    assert [s for s, _ in ckpt_io.list_checkpoints(run_dir)] == [2, 4]
    policy = run_dir / "checkpoints/step_000004/policy"
    assert (policy / "model.safetensors").is_file() and (policy / "policy_io.json").is_file()
    assert (run_dir / "config.yaml").is_file() and (run_dir / "loss.png").is_file()
    # Only trainable weights travel: no VAE or text encoder tensors in the exported policy.
    from safetensors import safe_open

    with safe_open(policy / "model.safetensors", "pt") as f:
        keys = list(f.keys())
    assert keys and not any("vae" in k or "text_encoder" in k for k in keys)


@dataclass
class CrashedRun:
    crash: subprocess.CompletedProcess  # the process that died in its step-4 save
    after_crash: list[int]  # the checkpoints it left
    partial_left: bool  # whether it left the partial step-4 folder
    run_dir: Path  # resumed to step 4 since


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory, demo_root) -> CrashedRun:
    """The default 4-step run (as ``full_run``) killed by an exception in its step-4 save, then
    resumed from its step-2 checkpoint."""
    root = tmp_path_factory.mktemp("crash")
    r = run_train(tiny_overrides(root, demo_root), expect_ok=False, inject_crash=True)  # a traceback: a process
    run_dir = root / RUN
    after = [s for s, _ in ckpt_io.list_checkpoints(run_dir)]
    partial = (run_dir / "checkpoints/.tmp-step_000004").exists()
    run_training(tiny_overrides(root, demo_root, **{"trainer.resume": "auto"}))
    return CrashedRun(r, after, partial, run_dir)


@pytest.mark.slow
def test_crash_during_save_keeps_previous_checkpoint(crashed_run):
    r = crashed_run.crash
    # Not a full disk: an unknown failure stays a traceback (a bug), but the partial folder goes.
    assert r.returncode == 1 and "OSError: disk full (injected)" in r.stderr
    assert crashed_run.after_crash == [2] and not crashed_run.partial_left
    # the resumed run (the fixture's second run) completed the checkpoints
    assert [s for s, _ in ckpt_io.list_checkpoints(crashed_run.run_dir)] == [2, 4]
    assert not (crashed_run.run_dir / "checkpoints/.tmp-step_000004").exists()


@pytest.mark.slow
def test_resume_is_bit_exact(full_run, crashed_run):
    """In-process loading: the run that died after its step-2 checkpoint, resumed, takes the same
    steps 3 and 4 as the uninterrupted one."""
    a, b = losses(full_run), losses(crashed_run.run_dir)
    assert sorted(b) == [1, 2, 3, 4]  # rows of the interrupted run after step 2 are not duplicated
    assert a[3] == b[3] and a[4] == b[4]


@pytest.mark.slow
def test_resume_is_bit_exact_with_prefetching_workers(ema_workers_runs):
    # With workers the loader has prefetched past step 2: the saved cursor must not count that.
    a, b = losses(ema_workers_runs.full), losses(ema_workers_runs.cut)
    assert sorted(b) == [1, 2, 3, 4]
    assert a[3] == b[3] and a[4] == b[4]


def test_lr_groups_and_frozen_modules():
    from dit4dit_npu.train.optim import build_optimizer, freeze_modules, group_lrs
    from dit4dit_npu.weights import build_dit4dit
    from dit4dit_npu.weights.testing import small_spec

    cfg = load_config(TINY, ["trainer.learning_rate={base: 0.1, backbone.transformer: 0.01, action_model: 0.001}"])
    model = build_dit4dit(cfg, small_spec(cfg, state_width=14, action_width=14, frame_size=(32, 96)))
    freeze_modules(model, ["backbone.transformer.transformer_blocks.0"])
    opt = build_optimizer(model, cfg.trainer)
    assert group_lrs(opt) == {"lr/backbone.transformer": 0.01, "lr/action_model": 0.001}
    in_groups = {id(p) for g in opt.param_groups for p in g["params"]}
    frozen = list(model.backbone.transformer.transformer_blocks[0].parameters())
    assert frozen and not any(id(p) in in_groups for p in frozen)
    assert not any(id(p) in in_groups for p in model.backbone.vae.parameters())

    with pytest.raises(ConfigError, match=r"action_modle.*did you mean 'action_model'"):
        build_optimizer(model, load_config(TINY, ["trainer.learning_rate={base: 0.1, action_modle: 0.1}"]).trainer)
    with pytest.raises(ConfigError, match="freeze_modules"):
        freeze_modules(model, ["backbone.transfomer"])


FROZEN = "action_model.state_encoder"


@pytest.fixture(scope="module")
def accumulated_frozen_run(tmp_path_factory, demo_root) -> Path:
    """2 optimizer steps of 2 accumulated micro-batches each, with one head module frozen."""
    return run_training(tiny_overrides(
        tmp_path_factory.mktemp("accumulated_frozen"), demo_root,
        **{"trainer.max_train_steps": 2, "trainer.gradient_accumulation_steps": 2, "trainer.freeze_modules": f"[{FROZEN}]"},
    ))


@pytest.mark.slow
def test_frozen_module_gets_no_update(accumulated_frozen_run):
    from safetensors.torch import load_file

    from dit4dit_npu.weights import build_dit4dit
    from dit4dit_npu.weights.testing import small_spec

    exported = load_file(accumulated_frozen_run / "checkpoints/step_000002/policy/model.safetensors")
    tiny = load_config(TINY)
    fresh = build_dit4dit(tiny, small_spec(tiny, state_width=14, action_width=14, frame_size=(32, 96))).state_dict()
    moved = [k for k in exported if k.startswith("action_model.") and not torch.equal(exported[k], fresh[k])]
    assert moved, "trainable head parameters should have changed"
    frozen_keys = [k for k in fresh if k.startswith(FROZEN + ".")]
    assert frozen_keys
    for k in frozen_keys:
        if k in exported:
            assert torch.equal(exported[k], fresh[k]), k


@pytest.mark.slow
def test_gradient_accumulation_steps(accumulated_frozen_run):
    run_dir = accumulated_frozen_run
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "total_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    # 2 micro-batches of 2 per optimizer step: the data cursor advanced by 8 samples.
    state = ckpt_io.read_trainer_state(run_dir / "checkpoints/step_000002")
    assert state["sampler"]["position"] == 8
    assert rows[-1]["lr/action_model"] > 0


def test_bad_inputs_fail_with_one_clear_line(tmp_path, demo_root, capfd):
    refused(
        train_here(tiny_overrides(tmp_path, tmp_path / "nowhere", **{"datasets.vla_data.data_mix": "[{path: missing_dataset}]"}), capfd),
        "dataset folder not found: .*missing_dataset",
    )
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    refused(train_here(tiny_overrides(blocker / "sub", demo_root), capfd), "cannot write")
    refused(
        train_here(tiny_overrides(tmp_path, demo_root, **{"framework.cosmos25.base_model": str(tmp_path / "no_such_model")}), capfd),
        "no_such_model",
    )


@pytest.mark.slow
def test_existing_run_is_never_overwritten_and_config_must_match(full_run, tmp_path, demo_root, capfd):
    run_dir = tmp_path / RUN
    shutil.copytree(full_run, run_dir)
    before = (run_dir / "config.yaml").read_text()
    refused(train_here(tiny_overrides(tmp_path, demo_root), capfd), "already has checkpoints")
    refused(
        train_here(
            tiny_overrides(
                tmp_path, demo_root,
                **{"trainer.max_train_steps": 6, "trainer.resume": "auto", "framework.action_model.repeated_diffusion_steps": 2},
            ),
            capfd,
        ),
        "another config.*repeated_diffusion_steps",
    )
    assert (run_dir / "config.yaml").read_text() == before  # a refused run overwrote nothing


@pytest.mark.slow
def test_two_process_deepspeed_zero2_trains_saves_resumes(two_rank_runs):
    run_dir = two_rank_runs.full
    state = run_dir / "checkpoints/step_000004/state"
    shards = sorted(p.name for p in state.rglob("*optim_states.pt"))
    assert len(shards) == 2, shards  # ZeRO-2: the optimizer state is partitioned over both ranks
    rows = [x for x in read_metrics(run_dir / "metrics.jsonl") if "total_loss" in x]
    assert [x["step"] for x in rows] == [1, 2, 3, 4]
    assert rows[0]["samples_per_s"] > 0
    # cut after step 2 and resumed on 2 ranks: the same steps 3 and 4
    assert "resumed from" in two_rank_runs.resume_output
    assert "moves from" not in two_rank_runs.resume_output  # the same schedule, mid-decay: nothing to warn of
    assert [s for s, _ in ckpt_io.list_checkpoints(two_rank_runs.cut)] == [2, 4]
    assert json.loads((two_rank_runs.cut / "checkpoints/step_000004/policy/policy.json").read_text())["step"] == 4
    a, b = losses(run_dir), losses(two_rank_runs.cut)
    assert sorted(b) == [1, 2, 3, 4] and a[3] == b[3] and a[4] == b[4]


@pytest.mark.slow
def test_two_process_resume_continues_to_a_larger_max_train_steps(two_rank_runs, tmp_path, demo_root):
    from train_runs import EMA_ON

    shutil.copytree(two_rank_runs.full, tmp_path / RUN)
    r = launch_two_ranks(tiny_overrides(tmp_path, demo_root, **{"trainer.max_train_steps": 6, "trainer.resume": "auto", **EMA_ON}))
    assert "resumed from" in r.stdout + r.stderr
    run_dir = tmp_path / RUN
    # The 4-step cosine had decayed to its floor at step 4; the 6-step one is at about a third of its
    # peak there: the learning rate jumps back up, and the resume says so, once (rank 0).
    assert len(re.findall(
        rf"warning: {re.escape(str(run_dir))}/checkpoints/step_000004 was trained on a 4-step schedule, this run's "
        r"has 6 steps \(cosine_with_min_lr\): the learning rate \([\w.]+\) at step 4 moves from 5\.00e-05 to "
        r"3\.78e-04; a new run_id", r.stdout + r.stderr,
    )) == 1, r.stdout[-2000:]
    assert [s for s, _ in ckpt_io.list_checkpoints(run_dir)][-1] == 6
    assert json.loads((run_dir / "checkpoints/step_000006/policy/policy.json").read_text())["step"] == 6


@pytest.mark.slow
def test_non_finite_loss_stops_without_saving(tmp_path, demo_root, capfd):
    # An absurd learning rate blows the weights up within a couple of Adam steps.
    r = train_here(
        tiny_overrides(
            tmp_path, demo_root,
            **{"trainer.learning_rate": "{base: 1.0e+30, backbone.transformer: 1.0e+30, action_model: 1.0e+30}",
               "trainer.num_warmup_steps": 0, "trainer.lr_scheduler_type": "constant"},
        ),
        capfd,
    )
    refused(r, "non-finite loss")
    run_dir = tmp_path / RUN
    assert ckpt_io.list_checkpoints(run_dir) == []
    assert not any((run_dir / "checkpoints").glob(".tmp-*"))


@pytest.mark.slow
def test_train_8p_script_launches_deepspeed_and_logs_to_a_file(two_rank_runs, tmp_path):
    logs = list(two_rank_runs.log_dir.glob("train_*_rank0.log"))
    assert len(logs) == 1 and "done: 4 steps" in logs[0].read_text()
    state = two_rank_runs.full / "checkpoints/step_000002/state"
    assert len(list(state.rglob("*optim_states.pt"))) == 2  # two ranks, ZeRO-partitioned

    env = {**ENV, "LOG_DIR": str(tmp_path / "logs"), "PYTHON": sys.executable}
    r = subprocess.run(["bash", "scripts/train_8p.sh", "--bogus=1"], env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "unknown flag --bogus=1" in r.stderr


def run_script(args: list[str], tmp_path: Path, **env) -> subprocess.CompletedProcess:
    env = {**ENV, "LOG_DIR": str(tmp_path / "logs"), "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", "scripts/train_8p.sh", *args], env=env, capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--num_processes=0"], "--num_processes=0: expected a positive integer"),
        (["--num_processes=two"], "--num_processes=two: expected a positive integer"),
        (["--num_processes=1.5"], "--num_processes=1.5: expected a positive integer"),
        (["--num_processes="], "--num_processes=: expected a positive integer"),
        (["--num_machines=0"], "--num_machines=0: expected a positive integer"),
        (["--num_machines=2", "--machine_rank=2"], "--machine_rank=2: expected an integer from 0 to 1"),
        # a switch's value was ignored: --dry-run=0 started a dry run
        (["--dry-run=0"], "--dry-run=0: --dry_run takes no value"),
    ],
)
def test_train_8p_script_refuses_bad_counts_with_one_line(tmp_path, args, message):
    r = run_script(args, tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [f"train_8p.sh: {message}"], r.stderr
    assert not (tmp_path / "logs").exists()  # refused before anything was started or written


@pytest.mark.parametrize("args", [["--num-processes", "0"], ["--num_processes", "0"], ["--num-processes=0"]])
def test_train_8p_script_takes_both_spellings_of_a_flag(tmp_path, args):
    # the doctor's spelling (--num-processes N) reaches the same check as --num_processes=N
    r = run_script(args, tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == "train_8p.sh: --num_processes=0: expected a positive integer"
    r = run_script(["--num-processes"], tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "train_8p.sh: --num-processes: expected a value (--num-processes VALUE or --num-processes=VALUE)"]
    assert not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_train_8p_script_dry_run_reads_dashed_flags_and_values_after_a_space(tmp_path):
    r = run_script(["--dry-run", "--num-processes", "1", "--num-machines", "2", "--machine-rank=1",
                    "--config", "configs/robotwin/dit4dit_robotwin_tiny.yaml", "a.b=c"], tmp_path)
    assert r.returncode == 0, r.stderr
    command = r.stdout.strip().splitlines()[-1]
    assert "--num_processes 2 --num_machines 2 --machine_rank 1" in command
    assert command.endswith("--config configs/robotwin/dit4dit_robotwin_tiny.yaml a.b=c")


@pytest.mark.slow
def test_train_8p_script_checks_ranks_against_cards_via_the_device_layer(tmp_path):
    # DIT4DIT_DEVICE=cuda on this host: one card more than it shows (none on a CPU host).
    n = torch.cuda.device_count() + 1
    r = run_script([f"--num_processes={n}"], tmp_path, DIT4DIT_DEVICE="cuda")
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert re.match(rf"error: {n} process(es)? per node but (no|only {n - 1}) visible cuda card", r.stderr)
    assert not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_train_8p_script_dry_run_takes_the_host_env_from_the_device_layer(tmp_path):
    cores = len(os.sched_getaffinity(0))
    env = {"TASK_QUEUE_ENABLE": "7", "LD_LIBRARY_PATH": "/opt/mine"}
    r = run_script(["--dry_run", f"--num_processes={cores + 1}", "--num_machines=2", "a.b=c"], tmp_path, **env)
    assert r.returncode == 0, r.stderr
    # More CPU ranks than cores: a warning, not an error.
    assert f"warning: {cores + 1} CPU ranks per node but {cores} core(s)" in r.stderr
    exports, command = r.stdout.strip().splitlines()[:-1], r.stdout.strip().splitlines()[-1]
    torch_lib = str(Path(torch.__file__).parent / "lib")
    assert exports == [f"export LD_LIBRARY_PATH={torch_lib}:/opt/mine"]  # no Ascend variables on CPU
    assert f"--num_processes {2 * (cores + 1)} --num_machines 2" in command and command.endswith("a.b=c")
    assert not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_two_process_zero3_exports_whole_weights(tmp_path, demo_root):
    from safetensors.torch import load_file

    launch = [
        sys.executable, "-m", "accelerate.commands.launch", "--use_deepspeed", "--num_processes", "2",
        "--main_process_port", "0", "-m", "dit4dit_npu.train", "--config", str(TINY),
    ]
    overrides = tiny_overrides(
        tmp_path, demo_root, **{"trainer.max_train_steps": 2, "trainer.deepspeed_config": "configs/deepspeed/zero3.json"}
    )
    r = subprocess.run([*launch, *overrides], env=ENV, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    policy = tmp_path / "dit4dit_robotwin_tiny/checkpoints/step_000002/policy"
    exported = load_file(policy / "model.safetensors")
    from dit4dit_npu.weights import build_dit4dit
    from dit4dit_npu.weights.testing import small_spec

    tiny = load_config(TINY)
    reference = build_dit4dit(tiny, small_spec(tiny, state_width=14, action_width=14, frame_size=(32, 96)))
    reference = reference.trainable_state_dict()
    # ZeRO-3 shards every weight; the export must hold whole tensors, not 0-sized placeholders.
    assert {k: tuple(v.shape) for k, v in exported.items()} == {k: tuple(v.shape) for k, v in reference.items()}
