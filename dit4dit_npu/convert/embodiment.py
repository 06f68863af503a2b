"""DiT4DiT's ``dataset_statistics.json`` -> FeatureStats in the robot's order, and the PolicyIO of
the conventions an import chose (``conventions.py``, as ``datasets.vla_data`` keys).

The statistics file is ``{tag: {"action": {mean, std, max, min, q01, q99, mask}, "state": {...},
"num_transitions", "num_trajectories"}}``, per-dim lists in DiT4DiT's model order. The PolicyIO
reproduces, step by step, what DiT4DiT's data config and client did (``transforms/encodings.py``):
state keys encoded sin/cos, min-max, binary or raw, reordered, zero-padded to the head's width;
actions min-max on the dims its statistics mask marks (the others raw, or binary), its client's
gripper threshold, reordered, padded; on the way back its clients' clip to [-1, 1] of every dim.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np

from dit4dit_npu.config import Config
from dit4dit_npu.config.original_data import RobotType
from dit4dit_npu.convert.checkpoint import ConversionError
from dit4dit_npu.convert.conventions import width
from dit4dit_npu.transforms.feature_stats import STAT_FIELDS, FeatureStats
from dit4dit_npu.transforms.policy_io import PolicyIO, PolicyIOError
from dit4dit_npu.transforms.vector import Normalize


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


def _robot_order(stats: FeatureStats, order: list[int] | None) -> FeatureStats:
    """Stats in DiT4DiT's model order -> the robot's order (model = native[order])."""
    if order is None:
        return stats
    inv = np.argsort(order)
    return FeatureStats(**{f: getattr(stats, f)[inv] for f in STAT_FIELDS}, count=stats.count)


def build_policy_io(robot: RobotType | None, tag: str, entry: dict[str, Any], cfg: Config, where: str,
                    notices: list[str], allow_constant_dims: bool = False) -> PolicyIO:
    """The statistics in the robot's order, and the PolicyIO of the run config's conventions
    (``cfg.datasets.vla_data``, decided by ``conventions.decide``) with DiT4DiT's image resize.
    ``allow_constant_dims``: statistics with min == max on normalized dims are a notice, not a refusal."""
    if robot is not None and tag != robot.tag:
        raise ConversionError(
            f"{where}: statistics of embodiment {tag!r}, but robot type {robot.name} is {robot.tag!r} "
            "(statistics for another embodiment?)"
        )
    count = entry.get("num_transitions", 0) or 0
    if not isinstance(count, int | float) or isinstance(count, bool) or count < 0:
        raise ConversionError(f"{where}: num_transitions: expected a count, got {count!r:.60}")
    count = int(count)
    d = cfg.datasets.vla_data
    state_dim = robot.state_dim if robot else width(entry.get("state"))
    action_dim = robot.action_dim if robot else width(entry.get("action"))
    state = _robot_order(_feature(entry, "state", state_dim, count, where), d.state_order)
    action = _robot_order(_feature(entry, "action", action_dim, count, where), d.action_order)
    # the encoded widths against the checkpoint's head first: a mismatch means other statistics
    unpadded = copy.deepcopy(cfg)
    unpadded.datasets.vla_data.max_state_dim = unpadded.datasets.vla_data.max_action_dim = None
    try:
        spec = PolicyIO.from_config(unpadded, state, action, warn=False).spec
        for name, encoded, head in (("state", spec.state_width, d.max_state_dim),
                                    ("action", spec.action_width, d.max_action_dim)):
            if head is not None and encoded > head:
                raise ConversionError(
                    f"{where}: the encoded {name} has {encoded} dims but the checkpoint's head takes {head} "
                    "(statistics for another embodiment?)"
                )
            if head is not None and encoded < head:
                notices.append(f"{name}: its {encoded} encoded dims are zero-padded to the head's {head} "
                               f"(datasets.vla_data.max_{name}_dim)")
        io = PolicyIO.from_config(cfg, state, action, resize_method="torch_bilinear", warn=False)
    except PolicyIOError as e:
        raise ConversionError(f"{where}: {e}") from None
    _check_constant(io, where, allow_constant_dims, notices)
    return io


def _check_constant(io: PolicyIO, where: str, allow: bool, notices: list[str]) -> None:
    """Dims the policy normalizes whose statistics have min == max: a state dim the model then
    never sees move, an action dim it always commands to one value. Statistics of one frame, or a
    joint that never moved: refused unless allowed, with a notice then."""
    found = []
    for feature, pipe in (("state", io.state), ("action", io.action)):
        for step in pipe.steps:
            if isinstance(step, Normalize) and step.degenerate_dims:
                found.append(f"{feature} dims {step.degenerate_dims}")
    if not found:
        return
    what = (f"{where}: {' and '.join(found)} have min == max among the dims the policy normalizes: it would "
            "always output (or see) their constant value")
    if not allow:
        raise ConversionError(
            f"{what} (statistics of a single frame, or a joint that never moved?); pass --allow-constant-dims to "
            "convert anyway"
        )
    notices.append(f"{what} (--allow-constant-dims)")


def latent_clip(offsets: list[int]) -> list[int]:
    """DiT4DiT's VAE dropped trailing frames that do not fill a 4-frame latent (T_lat =
    (T - 1) // 4 + 1): keep the 1 + 4k frames it used (this project pads instead)."""
    keep = (len(offsets) - 1) // 4 * 4 + 1
    return offsets[:keep] if keep >= 1 else offsets
