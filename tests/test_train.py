"""The trainer end to end on the tiny model: real accelerate + DeepSpeed ZeRO-2 on CPU (gloo)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dit4dit_npu.config import ConfigError, load_config
from dit4dit_npu.train import checkpoint as ckpt_io
from dit4dit_npu.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs/robotwin/dit4dit_robotwin_tiny.yaml"
LOSS_KEYS = ("action_loss", "video_loss", "total_loss")


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory) -> Path:
    """One generated demo dataset shared by every run of this module (read-only use)."""
    from dit4dit_npu.data.demo import write_demo_dataset

    root = tmp_path_factory.mktemp("data")
    write_demo_dataset(root / "robotwin_demo", version="v2.1")
    return root


def tiny_overrides(run_root: Path, demo_root: Path, **extra) -> list[str]:
    base = {
        "run_root_dir": str(run_root),
        "datasets.vla_data.data_root_dir": str(demo_root),
        "datasets.vla_data.generate_demo_if_missing": "false",
        "datasets.vla_data.per_device_batch_size": "2",
        "trainer.max_train_steps": "4",
        "trainer.save_interval": "2",
        "trainer.logging_frequency": "1",
        "trainer.eval_interval": "2",
        "trainer.eval_samples": "4",
        "trainer.num_warmup_steps": "1",
        "trainer.keep_last_checkpoints": "5",
    }
    base.update({k: str(v) for k, v in extra.items()})
    return [f"{k}={v}" for k, v in base.items()]


# Training runs here are CPU runs on every host, said explicitly rather than inherited: the
# resume checks are bit-exact (a CPU fact, not a GPU/NPU one), and the 2-rank runs use gloo and
# DeepSpeed's CPU accelerator, which need no cards.
ENV = {
    **os.environ, "DIT4DIT_DEVICE": "cpu", "DS_ACCELERATOR": "cpu",
    "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
}

# Crash injection for one test: the second policy export (the step-4 save) dies half-way.
CRASHING_SAVE = """
import sys
import dit4dit_npu.policy.folder as pf
real, calls = pf.export_policy, []
def export_then_crash(*a, **k):
    calls.append(1)
    if len(calls) == 2:
        raise OSError("disk full (injected)")
    return real(*a, **k)
pf.export_policy = export_then_crash
from dit4dit_npu.train.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_train(overrides: list[str], expect_ok: bool = True, inject_crash: bool = False) -> subprocess.CompletedProcess:
    """A real training process (DeepSpeed keeps process-global state, so one run per process)."""
    entry = ["-c", CRASHING_SAVE] if inject_crash else ["-m", "dit4dit_npu.train"]
    r = subprocess.run(
        [sys.executable, *entry, "--config", str(TINY), *overrides],
        env=ENV, capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    if expect_ok:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def run_training(overrides: list[str]) -> Path:
    """Run training in a subprocess; returns the run folder."""
    run_train(overrides)
    return load_config(TINY, overrides).run_dir


def test_single_process_run_writes_everything(tmp_path, demo_root):
    run_dir = run_training(tiny_overrides(tmp_path, demo_root))
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


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process-loading", "prefetching-workers"])
def test_resume_is_bit_exact(tmp_path, demo_root, workers):
    extra = {"datasets.vla_data.num_workers": workers}
    full = run_training(tiny_overrides(tmp_path / "full", demo_root, **extra))
    # Pretend the run died right after the step-2 checkpoint: copy it up to there and resume.
    # With workers the loader has prefetched past step 2: the saved cursor must not count that.
    cut = tmp_path / "cut" / full.name
    shutil.copytree(full, cut)
    shutil.rmtree(cut / "checkpoints/step_000004")
    run_training(tiny_overrides(tmp_path / "cut", demo_root, **{"trainer.resume": "auto", **extra}))

    def losses(run_dir):
        return {r["step"]: [r[k] for k in LOSS_KEYS] for r in read_metrics(run_dir / "metrics.jsonl") if "total_loss" in r}

    a, b = losses(full), losses(cut)
    assert sorted(b) == [1, 2, 3, 4]  # rows of the interrupted run after step 2 are not duplicated
    assert a[3] == b[3] and a[4] == b[4]


def test_crash_during_save_keeps_previous_checkpoint(tmp_path, demo_root):
    r = run_train(tiny_overrides(tmp_path, demo_root), expect_ok=False, inject_crash=True)
    # Not a full disk: an unknown failure stays a traceback (a bug), but the partial folder goes.
    assert r.returncode == 1 and "OSError: disk full (injected)" in r.stderr
    run_dir = tmp_path / "dit4dit_robotwin_tiny"
    assert [s for s, _ in ckpt_io.list_checkpoints(run_dir)] == [2]
    assert not (run_dir / "checkpoints/.tmp-step_000004").exists()
    run_train(tiny_overrides(tmp_path, demo_root, **{"trainer.resume": "auto"}))
    assert [s for s, _ in ckpt_io.list_checkpoints(run_dir)] == [2, 4]
    assert not (run_dir / "checkpoints/.tmp-step_000004").exists()


@pytest.mark.parametrize(
    "extra, zero_key",
    [
        ({"framework.cosmos25.training": "action"}, "video_loss"),
        ({"framework.cosmos25.training": "video"}, "action_loss"),
        ({"trainer.loss_scale.future_video": "0.0", "trainer.learning_rate": "{base: 0.001, action_model: 0.001}"}, None),
    ],
    ids=["action-mode", "video-mode", "lambda-0"],
)
def test_modes_and_lambda_zero_train(tmp_path, demo_root, extra, zero_key):
    extra = {"trainer.max_train_steps": 2, "trainer.eval_interval": 100, **extra}
    run_dir = run_training(tiny_overrides(tmp_path, demo_root, **extra))
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "total_loss" in r]
    assert len(rows) == 2 and all(r["total_loss"] is not None for r in rows)
    if zero_key:
        assert all(r[zero_key] == 0.0 for r in rows)
    else:  # λ = 0: the total is the action loss alone
        assert all(abs(r["total_loss"] - r["action_loss"]) < 1e-6 for r in rows)


def test_lr_groups_and_frozen_modules():
    from dit4dit_npu.models.testing import small_spec
    from dit4dit_npu.train.optim import build_optimizer, freeze_modules, group_lrs
    from dit4dit_npu.weights import build_dit4dit

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


def test_frozen_module_gets_no_update(tmp_path, demo_root):
    frozen = "action_model.state_encoder"
    run_dir = run_training(
        tiny_overrides(tmp_path, demo_root, **{"trainer.max_train_steps": 2, "trainer.freeze_modules": f"[{frozen}]"})
    )
    from safetensors.torch import load_file

    from dit4dit_npu.weights import build_dit4dit

    exported = load_file(run_dir / "checkpoints/step_000002/policy/model.safetensors")
    from dit4dit_npu.models.testing import small_spec

    tiny = load_config(TINY)
    fresh = build_dit4dit(tiny, small_spec(tiny, state_width=14, action_width=14, frame_size=(32, 96))).state_dict()
    moved = [k for k in exported if k.startswith("action_model.") and not torch.equal(exported[k], fresh[k])]
    assert moved, "trainable head parameters should have changed"
    frozen_keys = [k for k in fresh if k.startswith(frozen + ".")]
    assert frozen_keys
    for k in frozen_keys:
        if k in exported:
            assert torch.equal(exported[k], fresh[k]), k


def one_line_error(r: subprocess.CompletedProcess, pattern: str) -> None:
    import re

    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert re.search(pattern, last), last
    assert "Traceback" not in r.stderr


def test_bad_inputs_fail_with_one_clear_line(tmp_path, demo_root):
    one_line_error(
        run_train(tiny_overrides(tmp_path, tmp_path / "nowhere", **{"datasets.vla_data.data_mix": "[{path: missing_dataset}]"}), expect_ok=False),
        "dataset folder not found: .*missing_dataset",
    )
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    one_line_error(run_train(tiny_overrides(blocker / "sub", demo_root), expect_ok=False), "cannot write")
    one_line_error(
        run_train(tiny_overrides(tmp_path, demo_root, **{"framework.cosmos25.base_model": str(tmp_path / "no_such_model")}), expect_ok=False),
        "no_such_model",
    )


def test_existing_run_is_never_overwritten_and_config_must_match(tmp_path, demo_root):
    run_dir = run_training(tiny_overrides(tmp_path, demo_root, **{"trainer.max_train_steps": 2}))
    before = (run_dir / "config.yaml").read_text()
    one_line_error(
        run_train(tiny_overrides(tmp_path, demo_root, **{"trainer.max_train_steps": 2}), expect_ok=False),
        "already has checkpoints",
    )
    one_line_error(
        run_train(
            tiny_overrides(
                tmp_path, demo_root,
                **{"trainer.max_train_steps": 4, "trainer.resume": "auto", "framework.action_model.repeated_diffusion_steps": 2},
            ),
            expect_ok=False,
        ),
        "another config.*repeated_diffusion_steps",
    )
    assert (run_dir / "config.yaml").read_text() == before  # a refused run overwrote nothing


@pytest.mark.slow
def test_two_process_deepspeed_zero2_trains_saves_resumes(tmp_path, demo_root):
    env = ENV
    launch = [
        sys.executable, "-m", "accelerate.commands.launch", "--use_deepspeed", "--zero_stage", "2",
        "--num_processes", "2", "--main_process_port", "0", "-m", "dit4dit_npu.train", "--config", str(TINY),
    ]
    r = subprocess.run([*launch, *tiny_overrides(tmp_path, demo_root)], env=env, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = tmp_path / "dit4dit_robotwin_tiny"
    state = run_dir / "checkpoints/step_000004/state"
    shards = sorted(p.name for p in state.rglob("*optim_states.pt"))
    assert len(shards) == 2, shards  # ZeRO-2: the optimizer state is partitioned over both ranks
    rows = [x for x in read_metrics(run_dir / "metrics.jsonl") if "total_loss" in x]
    assert [x["step"] for x in rows] == [1, 2, 3, 4]
    assert rows[0]["samples_per_s"] > 0

    r = subprocess.run(
        [*launch, *tiny_overrides(tmp_path, demo_root, **{"trainer.max_train_steps": 6, "trainer.resume": "auto"})],
        env=env, capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resumed from" in r.stdout + r.stderr
    assert [s for s, _ in ckpt_io.list_checkpoints(run_dir)][-1] == 6
    assert json.loads((run_dir / "checkpoints/step_000006/policy/policy.json").read_text())["step"] == 6


def test_non_finite_loss_stops_without_saving(tmp_path, demo_root):
    # An absurd learning rate blows the weights up within a couple of Adam steps.
    r = run_train(
        tiny_overrides(
            tmp_path, demo_root,
            **{"trainer.learning_rate": "{base: 1.0e+30, backbone.transformer: 1.0e+30, action_model: 1.0e+30}",
               "trainer.num_warmup_steps": 0, "trainer.lr_scheduler_type": "constant"},
        ),
        expect_ok=False,
    )
    one_line_error(r, "non-finite loss")
    run_dir = tmp_path / "dit4dit_robotwin_tiny"
    assert ckpt_io.list_checkpoints(run_dir) == []
    assert not any((run_dir / "checkpoints").glob(".tmp-*"))


@pytest.mark.slow
def test_train_8p_script_launches_deepspeed_and_logs_to_a_file(tmp_path, demo_root):
    env = {**ENV, "LOG_DIR": str(tmp_path / "logs"), "PYTHON": sys.executable}
    args = [
        "--num_processes=2", "--max_train_steps=2", "--per_device_batch_size=2", f"--config={TINY}",
        "--main_process_port=0", *tiny_overrides(tmp_path, demo_root, **{"trainer.max_train_steps": 2}),
    ]
    r = subprocess.run(["bash", "scripts/train_8p.sh", *args], env=env, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    logs = list((tmp_path / "logs").glob("train_*_rank0.log"))
    assert len(logs) == 1 and "done: 2 steps" in logs[0].read_text()
    state = tmp_path / "dit4dit_robotwin_tiny/checkpoints/step_000002/state"
    assert len(list(state.rglob("*optim_states.pt"))) == 2  # two ranks, ZeRO-partitioned

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
    ],
)
def test_train_8p_script_refuses_bad_counts_with_one_line(tmp_path, args, message):
    r = run_script(args, tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [f"train_8p.sh: {message}"], r.stderr
    assert not (tmp_path / "logs").exists()  # refused before anything was started or written


def test_train_8p_script_checks_ranks_against_cards_via_the_device_layer(tmp_path):
    # DIT4DIT_DEVICE=cuda on this host: one card more than it shows (none on a CPU host).
    n = torch.cuda.device_count() + 1
    r = run_script([f"--num_processes={n}"], tmp_path, DIT4DIT_DEVICE="cuda")
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert re.match(rf"error: {n} process(es)? per node but (no|only {n - 1}) visible cuda card", r.stderr)
    assert not (tmp_path / "logs").exists()


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


def test_gradient_accumulation_steps(tmp_path, demo_root):
    run_dir = run_training(
        tiny_overrides(tmp_path, demo_root, **{"trainer.max_train_steps": 2, "trainer.gradient_accumulation_steps": 2})
    )
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "total_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    # 2 micro-batches of 2 per optimizer step: the data cursor advanced by 8 samples.
    state = ckpt_io.read_trainer_state(run_dir / "checkpoints/step_000002")
    assert state["sampler"]["position"] == 8
    assert rows[-1]["lr/action_model"] > 0


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
    from dit4dit_npu.models.testing import small_spec
    from dit4dit_npu.weights import build_dit4dit

    tiny = load_config(TINY)
    reference = build_dit4dit(tiny, small_spec(tiny, state_width=14, action_width=14, frame_size=(32, 96)))
    reference = reference.trainable_state_dict()
    # ZeRO-3 shards every weight; the export must hold whole tensors, not 0-sized placeholders.
    assert {k: tuple(v.shape) for k, v in exported.items()} == {k: tuple(v.shape) for k, v in reference.items()}
