"""Test-session defaults: one CPU thread (tiny ops are 10-40x slower with 2 contending threads on
a 2-core box), never touch a model hub, never pick up an accelerator by accident, and write the
tiny base model folders (models/build.py) into a per-session temp dir, never the user's cache."""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
# Always a fresh one (subprocesses of the tests inherit it): tests exercise writing the folder too.
os.environ["DIT4DIT_TINY_CACHE"] = _TINY_CACHE = tempfile.mkdtemp(prefix="dit4dit-tiny-")
atexit.register(shutil.rmtree, _TINY_CACHE, ignore_errors=True)

import torch  # noqa: E402

torch.set_num_threads(1)
