"""DiT4DiT's ``dataset_statistics.json`` and robot-type conventions -> a PolicyIO.

The statistics file is ``{tag: {"action": {mean, std, max, min, q01, q99, mask}, "state": {...},
"num_transitions", "num_trajectories"}}``, per-dim lists in DiT4DiT's model order. The PolicyIO
built here reproduces, step by step, what DiT4DiT's data config and client did for that robot
type (``config/original_data.py``), in the robot's own dim order:

- state: sin/cos per state key (``SinCos(groups)``; LIBERO interleaves [sin x0, cos x0, ...]), or
  min-max on the joints and a binary threshold on the grippers (RoboTwin), then DiT4DiT's order
  (``Reorder``) and zero padding to the head's width;
- action: min-max on the dims its statistics mask marks (``Normalize(dims=..., clip=...)``; the
  others, grippers, pass through), its grippers binarized (``Binarize``), reordered, padded. On
  the way back: what its client did, clip to [-1, 1], binarize, un-normalize the masked dims.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from dit4dit_npu.config import Config
from dit4dit_npu.config.original_data import ROBOT_TYPES, RobotType
from dit4dit_npu.convert.checkpoint import ConversionError
from dit4dit_npu.transforms.feature_stats import STAT_FIELDS, FeatureStats
from dit4dit_npu.transforms.policy_io import PolicyIO
from dit4dit_npu.transforms.vector import Binarize, Normalize, Reorder, SinCos, Step, TooNarrowError, padded


def read_statistics(path: Path, tag: str | None) -> tuple[str, dict[str, Any]]:
    """-> (embodiment tag, its entry). With several tags in the file, ``tag`` must choose."""
    if not path.is_file():
        raise ConversionError(f"statistics file not found: {path} (DiT4DiT writes dataset_statistics.json in the run folder)")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConversionError(f"{path}: unreadable JSON ({e})") from None
    if not isinstance(data, dict) or not data or not all(
        isinstance(v, dict) and isinstance(v.get("action"), dict) for v in data.values()
    ):
        raise ConversionError(f"{path}: expected DiT4DiT's {{embodiment tag: {{action, state, ...}}}} statistics")
    if tag is None:
        if len(data) > 1:
            raise ConversionError(f"{path} has statistics for {sorted(data)}: choose one with --tag")
        tag = next(iter(data))
    if tag not in data:
        raise ConversionError(f"{path} has no statistics for tag {tag!r} (it has {sorted(data)})")
    return tag, data[tag]


def choose_robot(name: str | None, data_mix: Any, tag: str, entry: dict[str, Any], stats_path: Path) -> RobotType:
    """The robot type: given, else the config's named mixture's, else the one whose tag and widths
    the statistics have."""
    from dit4dit_npu.config.original_data import NAMED_MIXTURES

    if name is None and isinstance(data_mix, str) and data_mix in NAMED_MIXTURES:
        name = NAMED_MIXTURES[data_mix][0]
    if name is None:
        dims = (_width(entry.get("state")), _width(entry["action"]))
        fits = [r for r in ROBOT_TYPES.values() if r.tag == tag and (r.state_dim, r.action_dim) == dims]
        if len(fits) != 1:
            raise ConversionError(
                f"{stats_path}: cannot tell the robot type from tag {tag!r} with (state, action) widths {dims}; "
                f"pass --embodiment ({', '.join(ROBOT_TYPES)})"
            )
        return fits[0]
    if name not in ROBOT_TYPES:
        raise ConversionError(f"--embodiment {name!r}: expected one of {list(ROBOT_TYPES)}")
    return ROBOT_TYPES[name]


def _width(block: Any) -> int:
    """The dims a statistics block has (0 when it is malformed: ``_feature`` then says how)."""
    values = block.get("min") if isinstance(block, dict) else None
    return len(values) if isinstance(values, list) else 0


def _feature(entry: dict[str, Any], feature: str, dim: int, count: int, where: str) -> FeatureStats:
    block = entry.get(feature)
    if not isinstance(block, dict):
        raise ConversionError(f"{where}: no {feature!r} statistics")
    missing = [f for f in STAT_FIELDS if f not in block]
    if missing:
        raise ConversionError(f"{where}: {feature} statistics lack {missing}")
    values = {}
    for f in STAT_FIELDS:  # null entries become NaN, refused below with the other non-finite values
        try:
            values[f] = np.asarray([np.nan if v is None else v for v in block[f]], dtype=np.float64)
        except (TypeError, ValueError):
            values[f] = None
        if values[f] is None or values[f].ndim != 1 or isinstance(block[f], str | dict):
            raise ConversionError(f"{where}: {feature}.{f}: expected a list of numbers, got {block[f]!r:.60}")
    lengths = {f: len(v) for f, v in values.items()}
    if set(lengths.values()) != {dim}:
        raise ConversionError(
            f"{where}: {feature} statistics have {sorted(set(lengths.values()))} dims, this robot type has {dim} "
            "(statistics for another embodiment?)"
        )
    stats = FeatureStats(**values, count=count)
    if not stats.is_finite():
        raise ConversionError(f"{where}: {feature} statistics contain NaN or inf")
    flipped = np.flatnonzero(stats.min > stats.max).tolist()
    if flipped:
        raise ConversionError(f"{where}: {feature} statistics have min > max in dims {flipped}")
    return stats


def _robot_order(stats: FeatureStats, order: tuple[int, ...] | None) -> FeatureStats:
    """Stats in DiT4DiT's model order -> the robot's order (model = native[order])."""
    if order is None:
        return stats
    inv = np.argsort(order)
    return FeatureStats(**{f: getattr(stats, f)[inv] for f in STAT_FIELDS}, count=stats.count)


def build_policy_io(robot: RobotType, tag: str, entry: dict[str, Any], cfg: Config, where: str) -> PolicyIO:
    if tag != robot.tag:
        raise ConversionError(
            f"{where}: statistics of embodiment {tag!r}, but robot type {robot.name} is {robot.tag!r} "
            "(statistics for another embodiment?)"
        )
    count = entry.get("num_transitions", 0) or 0
    if not isinstance(count, int | float) or isinstance(count, bool) or count < 0:
        raise ConversionError(f"{where}: num_transitions: expected a count, got {count!r:.60}")
    count = int(count)
    state = _robot_order(_feature(entry, "state", robot.state_dim, count, where), robot.model_order)
    action = _robot_order(_feature(entry, "action", robot.action_dim, count, where), robot.model_order)
    mask = entry["action"].get("mask")
    if not isinstance(mask, list) or len(mask) != robot.action_dim or not all(isinstance(m, bool) for m in mask):
        raise ConversionError(f"{where}: action statistics need a 'mask' of {robot.action_dim} booleans")
    order = robot.model_order
    mask_native = np.asarray(mask)[np.argsort(order)] if order else np.asarray(mask)
    binary = set(robot.binary_dims)
    reorder: list[Step] = [Reorder(order)] if order else []

    if robot.state_sincos_groups is not None:
        state_steps: list[Step] = [SinCos(robot.state_sincos_groups)]
    else:
        joints = [i for i in range(robot.state_dim) if i not in binary]
        state_steps = [Normalize("min_max", state, dims=joints)]
        state_steps += [Binarize(tuple(sorted(binary)))] if binary else []
    action_steps: list[Step] = [Normalize("min_max", action, dims=np.flatnonzero(mask_native).tolist(), clip=robot.client_clip)]
    if binary:
        action_steps.append(Binarize(tuple(sorted(binary))))
    if robot.client_binary_dims:
        action_steps.append(Binarize(robot.client_binary_dims, inclusive=True, encode=False))

    d = cfg.datasets.vla_data
    try:
        state_pipe = padded(state_steps + reorder, robot.state_dim, d.max_state_dim, "state")
        action_pipe = padded(action_steps + reorder, robot.action_dim, d.max_action_dim, "action")
    except TooNarrowError as e:
        raise ConversionError(
            f"{where}: the encoded {e.name} has {e.encoded} dims but the checkpoint's head takes {e.width} "
            "(statistics for another embodiment?)"
        ) from None
    return PolicyIO(
        camera_keys=list(robot.cameras),
        image_size=tuple(d.image_size),
        view_layout="width",  # primary | wrist views side by side, as DiT4DiT concatenated them
        clip_offsets=d.clip_offsets,
        chunk_length=cfg.framework.action_model.chunk_length,
        stats={"state": state, "action": action},
        state=state_pipe,
        action=action_pipe,
        resize_method="torch_bilinear",
    )



def latent_clip(offsets: list[int]) -> list[int]:
    """DiT4DiT's VAE dropped trailing frames that do not fill a 4-frame latent (T_lat =
    (T - 1) // 4 + 1): keep the 1 + 4k frames it used (this project pads instead)."""
    keep = (len(offsets) - 1) // 4 * 4 + 1
    return offsets[:keep] if keep >= 1 else offsets
