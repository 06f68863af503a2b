"""Test-session defaults: one CPU thread (tiny ops are 10-40x slower with 2 contending threads on
a 2-core box), never touch a model hub, never pick up an accelerator by accident (CPU unless
DIT4DIT_DEVICE is set), and write the tiny base model folders (weights/tiny_cache.py) into a
per-session temp dir, never the user's cache."""

import atexit
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The suite runs on CPU unless DIT4DIT_DEVICE says otherwise, on every host: its numbers are CPU
# facts (bit-exact resume, parity with references computed on CPU, multi-rank runs on gloo with
# DeepSpeed's CPU accelerator, which need no cards), and an NPU/CUDA host must pass the same
# suite. tests/test_device.py clears this to check detection on the real host.
# `DIT4DIT_DEVICE=npu pytest ...` runs the in-process tests on the accelerator instead.
os.environ.setdefault("DIT4DIT_DEVICE", "cpu")
os.environ.setdefault("DS_ACCELERATOR", os.environ["DIT4DIT_DEVICE"])
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
# Always a fresh one (subprocesses of the tests inherit it): tests exercise writing the folder too.
os.environ["DIT4DIT_TINY_CACHE"] = _TINY_CACHE = tempfile.mkdtemp(prefix="dit4dit-tiny-")
atexit.register(shutil.rmtree, _TINY_CACHE, ignore_errors=True)

import torch  # noqa: E402

torch.set_num_threads(1)

# Training runs several test modules read, trained once per session (tests/train_runs.py).
from train_runs import demo_root, demo_run, ema_workers_runs, full_run, two_rank_runs  # noqa: E402,F401

# scripts/test.sh runs the suite on pytest-xdist workers, and this file decides what runs where
# (pytest_xdist_make_scheduler below): each test file is one unit, so its module fixtures (a
# training run, a 2-rank encode) are built once, on one worker; the files that read the same
# session runs are one unit (and so those runs are trained once). Why not xdist's own
# `--dist loadgroup` and `xdist_group` marks: xdist 3.8 marks a group by rewriting `item._nodeid`,
# which pytest 9 no longer reads, so the marks were silently ignored and every file's tests were
# spread over both workers (each worker then trained the shared runs again).
SHARED_RUNS_GROUP = {"test_train.py": "train_runs", "test_ema.py": "train_runs", "test_faults_distributed.py": "train_runs"}

# Files whose tests share nothing and each take minutes: one unit per test, so they spread over
# the workers instead of queueing on one.
ONE_GROUP_PER_TEST = {"test_bench_smoke.py", "test_aloha_recipe.py", "test_compile.py", "test_equal_time.py"}

# The longest units (measured, tens of seconds to minutes each) start first, so that no worker is
# left with one of them while the other has run dry.
LONGEST_FIRST = ("test_aloha_recipe.py", "test_equal_time.py", "test_eval.py", "train_runs", "test_compile.py",
                 "test_bench_smoke.py", "test_sim_training.py", "test_lora.py")


def unit_of(nodeid: str) -> str:
    """The scheduling unit of a test: ``tests/test_x.py::test_y[p]`` -> its file's group."""
    name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return nodeid if name in ONE_GROUP_PER_TEST else SHARED_RUNS_GROUP.get(name, name)


def _rank(nodeid: str) -> int:
    unit = unit_of(nodeid)
    group = unit.split("::", 1)[0].rsplit("/", 1)[-1]
    return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every worker collects the same order; the scheduler hands the units out in it.
    items.sort(key=lambda item: _rank(item.nodeid))  # stable: file order within a rank


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        """xdist's scope scheduling (a unit's tests all go to one worker), with our units."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # keep the collection order (longest first)
    return UnitScheduling(config, log)
