"""The run config's encoding conventions (``datasets.vla_data``: parts, dim order, grippers, clip)
-> the vector steps of a PolicyIO. The one place they become steps, for this project's runs and
for imported DiT4DiT runs alike (``dit4dit_npu/convert`` only chooses the values).

State, in the robot's dim order: each normalization mode on its parts' dims (``Normalize(dims=)``),
binary parts thresholded (``Binarize``), the model's dim order (``Reorder``), then sin/cos of the
sincos parts in place (``SinCos(groups, keep)``). Action: the same without sin/cos; then the
gripper dims binarized on the way back only (its LIBERO client), and the clip policy: "normalized"
clips the normalized dims inside ``Normalize``, "all" clips every dim first on the way back
(``Clip``, last step before padding). A part with norm ``none`` passes in robot units.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.transforms.feature_stats import FeatureStats
from dit4dit_npu.transforms.vector import NORM_MODES, Binarize, Clip, Normalize, Reorder, SinCos, Step

CLIP_POLICIES = ("none", "normalized", "all")


class EncodingError(DiT4DiTError, ValueError):
    """Conventions that do not fit the vector (one line naming the datasets.vla_data key)."""


def parts_of(parts: Sequence[Any], default: str, dim: int, key: str) -> list[tuple[int, str]]:
    """Parts as (size, mode): VectorPart-like objects, mappings or pairs; none given = one part,
    the whole vector, in ``default``; a part's null norm = ``default``. Sizes must sum to ``dim``."""
    out = []
    for p in parts:
        size, norm = (p["size"], p.get("norm")) if isinstance(p, dict) else (
            (p.size, p.norm) if hasattr(p, "size") else p)
        out.append((int(size), norm or default))
    out = out or [(dim, default)]
    total = sum(s for s, _ in out)
    if total != dim:
        raise EncodingError(f"datasets.vla_data.{key}: parts of {[s for s, _ in out]} dims sum to {total}, "
                            f"the vector has {dim}")
    return out


def _dims(parts: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """(dim, mode) for every dim, in order."""
    out, start = [], 0
    for size, mode in parts:
        out += [(d, mode) for d in range(start, start + size)]
        start += size
    return out


def _normalize_and_binarize(parts, stats: FeatureStats, threshold: float, clip: bool) -> list[Step]:
    dims = _dims(parts)
    steps: list[Step] = []
    for mode in NORM_MODES:
        mine = [d for d, m in dims if m == mode]
        if mine:  # the whole vector: no dims list (the policy_io.json of a plain run stays as it was)
            steps.append(Normalize(mode, stats, dims=None if len(mine) == len(dims) else mine, clip=clip))
    binary = tuple(d for d, m in dims if m == "binary")
    if binary:
        steps.append(Binarize(binary, threshold=threshold))
    return steps


def _order(order: Sequence[int] | None, dim: int, key: str) -> list[Step]:
    if order is None:
        return []
    if len(order) != dim:
        raise EncodingError(f"datasets.vla_data.{key}: {len(order)} entries, the vector has {dim} dims")
    return [Reorder(tuple(order))]


def state_steps(
    parts: Sequence[Any], default: str, stats: FeatureStats, order: Sequence[int] | None, threshold: float
) -> list[Step]:
    pairs = parts_of(parts, default, stats.dim, "state_parts")
    steps = _normalize_and_binarize(pairs, stats, threshold, clip=False) + _order(order, stats.dim, "state_order")
    sincos = [i for i, (_, m) in enumerate(pairs) if m == "sincos"]
    if len(pairs) == 1 and sincos:
        steps.append(SinCos())  # the whole vector: all sines, then all cosines
    elif sincos:
        keep = tuple(i for i in range(len(pairs)) if i not in sincos)
        steps.append(SinCos(groups=tuple(s for s, _ in pairs), keep=keep))
    return steps


def action_steps(
    parts: Sequence[Any],
    default: str,
    stats: FeatureStats,
    order: Sequence[int] | None,
    threshold: float,
    gripper_dims: Sequence[int],
    clip: str,
) -> list[Step]:
    if clip not in CLIP_POLICIES:
        raise EncodingError(f"datasets.vla_data.action_clip: got {clip!r}, expected one of {list(CLIP_POLICIES)}")
    pairs = parts_of(parts, default, stats.dim, "action_parts")
    if any(m == "sincos" for _, m in pairs):
        raise EncodingError("datasets.vla_data.action_parts: sincos is a state encoding, not an action's")
    steps = _normalize_and_binarize(pairs, stats, threshold, clip=clip == "normalized")
    if gripper_dims:
        if max(gripper_dims) >= stats.dim:
            raise EncodingError(f"datasets.vla_data.gripper_dims: dim {max(gripper_dims)} does not exist in a "
                                f"{stats.dim}-dim action")
        steps.append(Binarize(tuple(gripper_dims), threshold=threshold, inclusive=True, encode=False))
    steps += _order(order, stats.dim, "action_order")
    if clip == "all":
        steps.append(Clip())
    return steps
