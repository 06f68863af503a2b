"""What the files of one policy folder must agree on, checked before a policy may act.

A policy folder is several files written together (``folder.py``). Copied, hand-edited or
mixed with files of another run, each can still parse while the whole is wrong; these checks
say which file disagrees with which, so the policy (not the dataset or the robot) is blamed:

- ``config.yaml`` vs ``policy_io.json``: cameras, image size and tiling, clip offsets, chunk
  length, state/action encodings and padded widths;
- ``policy.json`` vs ``model.safetensors``: the step (weights of another checkpoint);
- statistics and weights must be finite: a single NaN makes every action NaN.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dit4dit_npu.config import Config
from dit4dit_npu.transforms.policy_io import PolicyIO
from dit4dit_npu.transforms.stats import STAT_FIELDS
from dit4dit_npu.transforms.vector import Normalize, Pad, SinCos, VectorPipeline


def _config_mode(pipe: VectorPipeline) -> str | None:
    """The ``state_norm`` / ``action_norm`` value a standard pipeline was built from, or None when
    the pipeline holds steps the run config cannot express (the conventions of a policy imported
    from DiT4DiT: grouped sin/cos, masked or clipped min-max, binarized grippers, reordering): then
    policy_io.json alone defines the transform and there is nothing in config.yaml to compare."""
    steps = [s for s in pipe.steps if not isinstance(s, Pad)]
    if not steps:
        return "none"
    if len(steps) > 1:
        return None
    step = steps[0]
    if isinstance(step, SinCos) and step.groups is None:
        return "sincos"
    if isinstance(step, Normalize) and step.dims is None and not step.clip:
        return step.mode
    return None


def config_io_problems(cfg: Config, io: PolicyIO) -> list[str]:
    """Settings where the training config and the PolicyIO saved with it disagree."""
    d = cfg.datasets.vla_data
    pairs = [
        ("datasets.vla_data.camera_keys", list(d.camera_keys), "camera_keys", list(io.camera_keys)),
        ("datasets.vla_data.image_size", list(d.image_size), "image_size", list(io.image_size)),
        ("datasets.vla_data.view_layout", d.view_layout, "view_layout", io.view_layout),
        (
            "datasets.vla_data.video_delta_indices[::action_video_freq_ratio]",
            d.clip_offsets, "clip_offsets", list(io.clip_offsets),
        ),
        ("framework.action_model chunk (future_action_window_size + 1)", cfg.framework.action_model.chunk_length,
         "chunk_length", io.chunk_length),
    ]
    for key, value, pipe, what in (
        ("state_norm", d.state_norm, io.state, "state encoding"),
        ("action_norm", d.action_norm, io.action, "action normalization"),
    ):
        mode = _config_mode(pipe)
        if mode is not None:
            pairs.append((f"datasets.vla_data.{key}", value, what, mode))
    if d.max_state_dim is not None:
        pairs.append(("datasets.vla_data.max_state_dim", d.max_state_dim, "state width", io.state.out_dim))
    if d.max_action_dim is not None:
        pairs.append(("datasets.vla_data.max_action_dim", d.max_action_dim, "action width", io.action.out_dim))
    return [
        f"config.yaml {ck} is {cv!r} but policy_io.json {ik} is {iv!r}" for ck, cv, ik, iv in pairs if cv != iv
    ]


def nonfinite_stats(io: PolicyIO) -> str | None:
    for feature, stats in sorted(io.stats.items()):
        for name in STAT_FIELDS:
            bad = np.flatnonzero(~np.isfinite(getattr(stats, name)))
            if len(bad):
                return f"{feature} statistic {name!r} is NaN/inf in dims {bad[:5].tolist()}"
    return None


def nonfinite_weights(weights: dict[str, Any]) -> str | None:
    """The first tensor holding NaN/inf (checked tensor by tensor: no second copy of the model)."""
    import torch

    for name, t in weights.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            n = int((~torch.isfinite(t)).sum())
            return f"tensor {name!r} has {n} NaN/inf value(s)"
    return None


def feature_names(dataset_paths: Sequence[str | Path], key: str, dim: int) -> list[str] | None:
    """Names of a vector feature's dims from the first dataset's info.json (None when absent);
    warnings about live states name joints with them."""
    for root in dataset_paths:
        try:
            names = json.loads((Path(root) / "meta" / "info.json").read_text())["features"][key].get("names")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if isinstance(names, dict):  # lerobot's {"motors": [...]} form
            names = next(iter(names.values()), None)
        if isinstance(names, list) and len(names) == dim and all(isinstance(n, str) for n in names):
            return names
    return None


def read_weights(file: Path, step: Any, policy_json: Path, what: str) -> tuple[dict[str, Any] | None, str | None]:
    """(weights, None), or (None, one line saying what is wrong): ``file`` is a readable
    safetensors file of the step ``policy_json`` records, and every tensor in it is finite.
    ``what`` names its content in the message ("weights", "adapter")."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            meta = f.metadata() or {}
            weights = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for a truncated/damaged file
        return None, f"{file}: not a readable safetensors file ({e})"
    saved_step = meta.get("step")
    if saved_step is not None and str(saved_step) != str(step):
        return None, (
            f"{file} holds the {what} of step {saved_step} but {policy_json} records step {step!r} "
            "(files of different checkpoints mixed?)"
        )
    bad = nonfinite_weights(weights)
    if bad:
        return None, f"{file}: {bad}; refusing a policy whose actions would be non-finite"
    return weights, None
