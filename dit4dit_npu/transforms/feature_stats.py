"""Per-dimension feature statistics: what normalization is computed from, and travels with a policy.

Pooling is exact for min/max/mean/std (``pool_moments`` is the one implementation, also used
for lerobot's per-episode stats); quantiles cannot be pooled, so a mixture's q01/q99 are
recomputed from the concatenated data (averaging per-dataset quantiles is wrong, lerobot#4156).
Values round-trip exactly through ``to_dict``/``from_dict`` (float64, shortest repr in JSON).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

STAT_FIELDS = ("min", "max", "mean", "std", "q01", "q99")


def pool_moments(
    counts: np.ndarray, means: np.ndarray, stds: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) of the union of disjoint parts, from each part's count, mean and std (axis 0)."""
    counts = np.asarray(counts, dtype=np.float64)
    w = (counts / counts.sum()).reshape((-1,) + (1,) * (np.ndim(means) - 1))
    mean = (w * means).sum(0)
    var = (w * (np.asarray(stds) ** 2 + (np.asarray(means) - mean) ** 2)).sum(0)
    return mean, np.sqrt(var)


@dataclass
class FeatureStats:
    """Statistics of one vector feature: float64 arrays of shape (D,), and the frame count."""

    min: np.ndarray
    max: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    q01: np.ndarray
    q99: np.ndarray
    count: int

    def __post_init__(self) -> None:
        for f in STAT_FIELDS:
            setattr(self, f, np.asarray(getattr(self, f), dtype=np.float64).reshape(-1))
        dims = {len(getattr(self, f)) for f in STAT_FIELDS}
        if len(dims) != 1:
            raise ValueError(f"statistics fields have different lengths {sorted(dims)}")
        self.count = int(self.count)

    @property
    def dim(self) -> int:
        return len(self.min)

    def is_finite(self) -> bool:
        return all(np.isfinite(getattr(self, f)).all() for f in STAT_FIELDS)

    @classmethod
    def from_data(cls, x: np.ndarray) -> FeatureStats:
        x = np.asarray(x, dtype=np.float64)
        if len(x) == 0:
            raise ValueError("cannot compute statistics of an empty array")
        x = x.reshape(len(x), -1)
        q = np.quantile(x, [0.01, 0.99], axis=0)
        return cls(x.min(0), x.max(0), x.mean(0), x.std(0), q[0], q[1], len(x))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {f: [float(v) for v in getattr(self, f)] for f in STAT_FIELDS}
        d["count"] = self.count
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FeatureStats:
        missing = [f for f in (*STAT_FIELDS, "count") if f not in d]
        if missing:
            raise ValueError(f"statistics lack {missing}")
        return cls(**{f: d[f] for f in STAT_FIELDS}, count=d["count"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FeatureStats) and self.to_dict() == other.to_dict()


def merge_stats(parts: Sequence[FeatureStats], data: np.ndarray | None = None) -> FeatureStats:
    """Statistics of the union of disjoint parts (exact min/max/mean/std).

    Pass the concatenated ``data`` to recompute the quantiles; without it the result keeps the
    conservative bounds min(q01) / max(q99), never an average.
    """
    if not parts:
        raise ValueError("merge_stats needs at least one part")
    counts = np.array([p.count for p in parts], dtype=np.float64)
    mean, std = pool_moments(counts, np.stack([p.mean for p in parts]), np.stack([p.std for p in parts]))
    if data is not None:
        q01, q99 = np.quantile(np.asarray(data, np.float64).reshape(len(data), -1), [0.01, 0.99], axis=0)
    else:
        q01, q99 = np.min([p.q01 for p in parts], 0), np.max([p.q99 for p in parts], 0)
    return FeatureStats(
        np.min([p.min for p in parts], 0), np.max([p.max for p in parts], 0), mean, std, q01, q99, int(counts.sum())
    )
