"""lerobot's batch -> a dit4dit-npu observation dict, named by the policy's own PolicyIO.

lerobot (after ``preprocess_observation`` and the policy's preprocessor) sends

    {"observation.image" or "observation.images.<cam>": float32 (B, 3, H, W) in [0, 1],
     "observation.state": float32 (B, D), "task": list[str]}

and a dit4dit-npu policy takes ``{<camera key>: uint8 (B, H, W, 3), "state": (B, D),
"instruction": list[str]}`` with the camera keys of its training config. A camera is found by its
own key; names that differ are mapped with lerobot's own ``--rename_map`` (the preprocessor's
rename step), so nothing here guesses. Sizes, the aspect ratio and the state width are checked by
the policy's PolicyIO when it parses the dict (one line each).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from lerobot_policy_dit4dit.configuration_dit4dit import LeRobotPluginError

STATE_KEY = "observation.state"  # lerobot's OBS_STATE
TASK_KEY = "task"


def to_uint8_hwc(key: str, images: torch.Tensor) -> np.ndarray:
    """lerobot's float (B, 3, H, W) in [0, 1] -> uint8 (B, H, W, 3), as the camera delivered it."""
    if images.ndim != 4 or images.shape[1] != 3:
        raise LeRobotPluginError(f"{key}: expected a (B, 3, H, W) image batch from lerobot, got shape {tuple(images.shape)}")
    if images.dtype == torch.uint8:
        return images.permute(0, 2, 3, 1).cpu().numpy()
    return (images.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


def instructions(batch: dict[str, Any], rows: int, fallback: str | None, replace: bool = False) -> list[str]:
    """One instruction per row: the environment's task text, or the config's ``instruction`` where
    that is empty (``replace``: everywhere)."""
    if replace and fallback:
        return [fallback] * rows
    tasks = batch.get(TASK_KEY)
    if isinstance(tasks, str):
        tasks = [tasks] * rows
    texts = [str(t) for t in tasks] if tasks is not None else [""] * rows
    if fallback is not None:
        texts = [t or fallback for t in texts]
    if len(texts) != rows or not all(texts):
        raise LeRobotPluginError(
            f"task: {len(texts)} instruction(s), {sum(not t for t in texts)} empty, for {rows} observation(s); "
            "this environment gives no task text: set --policy.instruction='<what to do>'"
        )
    return texts


def observation(batch: dict[str, Any], camera_keys: Sequence[str], fallback: str | None,
                replace: bool = False) -> dict[str, Any]:
    """The policy's observation dict (batched) from lerobot's ``batch``."""
    images = {k: v for k, v in batch.items() if k.startswith("observation.image")}
    missing = [k for k in camera_keys if k not in images]
    if missing:
        raise LeRobotPluginError(
            f"lerobot sends camera(s) {sorted(images)}, the policy takes {list(camera_keys)}: map them with "
            f"--rename_map='{{\"<lerobot key>\": \"<policy key>\"}}' (missing {missing})"
        )
    if STATE_KEY not in batch:
        raise LeRobotPluginError(
            f"lerobot sends no {STATE_KEY} (keys {sorted(batch)}): the policy needs the robot state "
            "(e.g. --env.obs_type=pixels_agent_pos)"
        )
    views = {k: to_uint8_hwc(k, images[k]) for k in camera_keys}
    state = batch[STATE_KEY]
    state = state.double().cpu().numpy() if isinstance(state, torch.Tensor) else np.asarray(state, np.float64)
    if state.ndim == 1:
        state = state[None]
    rows = len(next(iter(views.values())))
    return {**views, "state": state, "instruction": instructions(batch, rows, fallback, replace)}
