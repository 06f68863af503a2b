"""Training runs shared by the training tests (test_train, test_ema, test_lora, test_end_to_end,
test_reliability_train, test_eval): the tiny config's overrides, a real training process, the same entry
point run in this process, and the runs several test modules read (session fixtures, so each is
trained once per test session).

Why some runs are real processes and others are not: a fresh interpreter spends ~10 s importing
torch, diffusers and DeepSpeed before the first step (a 4-step tiny run itself takes ~2 s), so a
run goes through ``python -m dit4dit_npu.train`` only where a process boundary is what is
tested (an exit code, a kill, a file-size limit, an injected crash's traceback, ``accelerate
launch``) or where process-wide state would leak (a ZeRO-3 accelerator registers its config with
transformers). Everything else calls the console script's function here (``train_here``), in a
world of one that outlives the runs (``world_of_one``), DeepSpeed ZeRO-2 engines included."""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, which pytest itself requires there
    import tomli as tomllib

from dit4dit_npu.config import load_config

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs/robotwin/dit4dit_robotwin_tiny.yaml"
RUN = "dit4dit_robotwin_tiny"  # the tiny config's run_id: runs land in <run_root_dir>/RUN
LOSS_KEYS = ("action_loss", "video_loss", "total_loss")
EMA_ON = {"trainer.ema.decay": 0.5, "trainer.ema.start_step": 1}
# The tiny config trains one-frame clips (the embedded default's recipe: no future frame, the action
# loss into the backbone); tests of the video loss, the latent cache of multi-frame clips or the
# frozen-feature path use its former 5-frame joint clips instead.
VIDEO_CLIPS = {
    "datasets.vla_data.video_delta_indices": "[0, 1, 2, 3, 4, 5, 6, 7, 8]",
    "datasets.vla_data.action_video_freq_ratio": "2",
    "framework.cosmos25.backprop_action_to_backbone": "false",
}
TRAIN_ENTRY = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["dit4dit-train"]

# Training processes here are CPU runs on every host, said explicitly rather than inherited: the
# resume checks are bit-exact (a CPU fact, not a GPU/NPU one), and the 2-rank runs use gloo and
# DeepSpeed's CPU accelerator, which need no cards.
ENV = {
    **os.environ, "DIT4DIT_DEVICE": "cpu", "DS_ACCELERATOR": "cpu",
    "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
}

# Crash injection: the second policy export (the step-4 save) dies half-way.
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


def tiny_overrides(run_root: Path, demo_root: Path, **extra) -> list[str]:
    """4 steps of batch 2 on the demo data, a checkpoint and a held-out evaluation every 2 steps."""
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


def run_train(overrides: list[str], expect_ok: bool = True, inject_crash: bool = False,
              **popen) -> subprocess.CompletedProcess:
    """A real training process (``python -m dit4dit_npu.train``)."""
    entry = ["-c", CRASHING_SAVE] if inject_crash else ["-m", "dit4dit_npu.train"]
    r = subprocess.run(
        [sys.executable, *entry, "--config", str(TINY), *overrides],
        env=ENV, capture_output=True, text=True, cwd=ROOT, timeout=600, **popen,
    )
    if expect_ok:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def run_training(overrides: list[str]) -> Path:
    """A training run that must succeed, in this process (``train_here``); returns the run folder."""
    r = train_here(overrides)
    assert r.returncode == 0, f"training exited with {r.returncode}"
    return load_config(TINY, overrides).run_dir


def train_here(overrides: list[str], capfd: pytest.CaptureFixture[str] | None = None) -> subprocess.CompletedProcess:
    """``python -m dit4dit_npu.train --config TINY ...`` in this process (``train_cli_here``)."""
    return train_cli_here(["--config", str(TINY), *overrides], capfd)


def train_cli_here(argv: list[str], capfd: pytest.CaptureFixture[str] | None = None) -> subprocess.CompletedProcess:
    """``python -m dit4dit_npu.train ARGV`` in this process: the console script's function, its
    return code (or SystemExit code) and what it printed (with ``capfd``), in the session's world of
    one (``world_of_one``: DeepSpeed ZeRO-2 engines too, not ZeRO-3). Afterwards the environment the trainer fills for a world of one (RANK, MASTER_PORT, ...) and
    accelerate's process-wide state are put back, so later runs and subprocesses start clean."""
    from accelerate.state import AcceleratorState

    module, func = TRAIN_ENTRY.split(":")
    entry = getattr(importlib.import_module(module), func)
    saved = dict(os.environ)
    os.environ.update(world_of_one())
    if capfd is not None:
        capfd.readouterr()
    try:
        code = entry(argv)
    except SystemExit as e:
        code = e.code
    finally:
        os.environ.clear()
        os.environ.update(saved)
        AcceleratorState._reset_state(True)
    out, err = capfd.readouterr() if capfd is not None else ("", "")
    return subprocess.CompletedProcess(argv, code, out, err)


_world: dict[str, str] = {}


def world_of_one() -> dict[str, str]:
    """The environment of a world of one (rank 0 of 1) whose gloo process group this test process
    creates once and keeps: DeepSpeed holds on to the groups of the first engine it builds, and a
    run leaves a caller's process group alone (``train.loop.train``), so every in-process run,
    DeepSpeed or not, trains in the same world, as a process of its own would."""
    import torch.distributed as dist

    if not _world:
        with socket.socket() as s:  # a free port for the group's store
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        _world.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
            atexit.register(dist.destroy_process_group)  # else gloo complains at interpreter exit
    return dict(_world)


def one_line_error(r: subprocess.CompletedProcess) -> str:
    """The last stderr line of a refused run (exit code 2, no traceback)."""
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    return r.stderr.strip().splitlines()[-1]


def cut_at(run_dir: Path, into: Path, step: int) -> Path:
    """A copy of ``run_dir`` as if the run had died right after its checkpoint ``step``."""
    cut = into / run_dir.name
    shutil.copytree(run_dir, cut)
    for later in (cut / "checkpoints").glob("step_*"):
        if int(later.name.removeprefix("step_")) > step:
            shutil.rmtree(later)
    return cut


# -- runs shared by several test modules (trained once per session) --------------------------------


@pytest.fixture(scope="session")
def demo_root() -> Path:
    """The demo dataset every training test reads (read-only use)."""
    from policy_fixtures import shared_demo_root

    return shared_demo_root()


@pytest.fixture(scope="session")
def full_run(tmp_path_factory, demo_root) -> Path:
    """The tiny config's default path (accelerate + DeepSpeed ZeRO-2, one process, in-process
    loading): 4 steps, checkpoints at steps 2 and 4."""
    return run_training(tiny_overrides(tmp_path_factory.mktemp("full_run"), demo_root))


@dataclass
class ResumedPair:
    full: Path  # the uninterrupted run
    cut: Path  # the same run cut after step 2 and resumed to step 4


@pytest.fixture(scope="session")
def ema_workers_runs(tmp_path_factory, demo_root) -> ResumedPair:
    """DeepSpeed ZeRO-2, one process, prefetching loader workers, EMA on: 4 steps, and the same
    run cut after its step-2 checkpoint and resumed (test_train: the losses; test_ema: the average)."""
    root = tmp_path_factory.mktemp("ema_workers")
    extra = {"datasets.vla_data.num_workers": 2, **EMA_ON}
    full = run_training(tiny_overrides(root / "full", demo_root, **extra))
    # With workers the loader has prefetched past step 2: the saved cursor must not count that.
    cut = cut_at(full, root / "cut", 2)
    run_training(tiny_overrides(root / "cut", demo_root, **{"trainer.resume": "auto", **extra}))
    return ResumedPair(full, cut)


@dataclass
class TwoRankRuns:
    full: Path  # launched by scripts/train_8p.sh: 2 ranks, ZeRO-2, EMA on, 4 steps
    log_dir: Path  # the script's per-rank logs
    cut: Path  # the same run cut after step 2 and resumed to step 4 by `accelerate launch`
    resume_output: str


def launch_two_ranks(overrides: list[str]) -> subprocess.CompletedProcess:
    launch = [
        sys.executable, "-m", "accelerate.commands.launch", "--use_deepspeed", "--zero_stage", "2",
        "--num_processes", "2", "--main_process_port", "0", "-m", "dit4dit_npu.train", "--config", str(TINY),
    ]
    r = subprocess.run([*launch, *overrides], env=ENV, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="session")
def two_rank_runs(tmp_path_factory, demo_root) -> TwoRankRuns:
    """The 8-card launch script on 2 CPU ranks (DeepSpeed ZeRO-2, each rank averaging its shard of
    the EMA), then the run cut after step 2 and resumed on 2 ranks."""
    root = tmp_path_factory.mktemp("two_ranks")
    logs = root / "logs"
    env = {**ENV, "LOG_DIR": str(logs), "PYTHON": sys.executable}
    args = [
        "--num_processes=2", "--max_train_steps=4", "--per_device_batch_size=2", f"--config={TINY}",
        "--main_process_port=0", *tiny_overrides(root / "full", demo_root, **EMA_ON),
    ]
    r = subprocess.run(["bash", "scripts/train_8p.sh", *args], env=env, capture_output=True, text=True,
                       cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    full = root / "full" / RUN
    cut = cut_at(full, root / "cut", 2)
    resumed = launch_two_ranks(tiny_overrides(root / "cut", demo_root, **{"trainer.resume": "auto", **EMA_ON}))
    return TwoRankRuns(full, logs, cut, resumed.stdout + resumed.stderr)


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    """The embedded default (the tiny config as a user runs it, DeepSpeed ZeRO-2) shortened to 500
    of its 1000 steps, from an empty working folder, so the demo data is generated at its default
    location (demo_data/robotwin_demo) as for a user; returns the run folder (its checkpoint at step
    500). The only run long enough to learn: a test that needs a trained policy reads this one
    (from test_eval.py, or from a file joined to its unit in tests/conftest.py, so that it is
    trained once)."""
    cwd = tmp_path_factory.mktemp("demo_run")
    here = os.getcwd()
    os.chdir(cwd)  # the config's relative data_root_dir (demo_data) is under the working folder
    try:
        r = train_here(["run_id=t", f"run_root_dir={cwd}/runs", "trainer.max_train_steps=500"])
    finally:
        os.chdir(here)
    assert r.returncode == 0, f"the demo run exited with {r.returncode}"
    assert (cwd / "demo_data" / "robotwin_demo" / "meta" / "info.json").is_file()
    return cwd / "runs" / "t"
