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

# scripts/test.sh runs the suite on pytest-xdist workers with --dist loadgroup: each test file is
# one group, so its module fixtures (a training run, a 2-rank encode) are built once, on one worker;
# the files that read the same session runs share a group (and so those runs are trained once).
SHARED_RUNS_GROUP = {"test_train.py": "train_runs", "test_ema.py": "train_runs"}


# Files whose tests share nothing and each take minutes: one group per test, so they spread over
# the workers instead of queueing on one.
ONE_GROUP_PER_TEST = {"test_bench_smoke.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        name = item.path.name
        group = item.nodeid if name in ONE_GROUP_PER_TEST else SHARED_RUNS_GROUP.get(name, name)
        item.add_marker(pytest.mark.xdist_group(group))
