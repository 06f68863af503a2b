"""Test-session defaults: one CPU thread (tiny ops are 10-40x slower with 2 contending threads on
a 2-core box), never touch a model hub, never pick up an accelerator by accident."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

import torch  # noqa: E402

torch.set_num_threads(1)
