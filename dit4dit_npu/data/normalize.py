"""Normalization statistics and the ``Normalizer`` that travels with a checkpoint.

Statistics come from the parquet columns of the *training* episodes (never from video, never
from lerobot's stats files, which may be stale), over the whole mixture:

- min = min of mins, max = max of maxes, mean/std pooled exactly by frame counts;
- q01/q99 recomputed from the concatenated data (averaging per-dataset quantiles is wrong for a
  mixture, lerobot#4156).

Modes (config ``action_norm`` / ``state_norm``): ``min_max`` -> [-1, 1] (the original),
``q99`` (q01/q99 -> [-1, 1], not clipped, so it inverts), ``mean_std``, state ``sincos`` (the
original: [sin(x), cos(x)] of the raw joints) and ``none``. Every mode is ``(x - center) * inv``:
a degenerate dim (range or std below ``DEGENERATE_EPS``) gets ``inv = 0``, so it maps to 0
(with a warning) and unnormalizes to the constant; nothing ever divides by zero (openpi#814,
lerobot#211).

``Normalizer.to_dict()/from_dict()`` (and ``to_json``/``from_json``) round-trip exactly: float64
values are written with Python's shortest exact repr.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)

MODES = ("min_max", "mean_std", "q99", "sincos", "none")
DEGENERATE_EPS = 1e-6  # in data units (rad, m): a range this small carries no signal
_STAT_FIELDS = ("min", "max", "mean", "std", "q01", "q99")


@dataclass
class FeatureStats:
    """Per-dimension statistics of one feature (float64 arrays of shape (D,))."""

    min: np.ndarray
    max: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    q01: np.ndarray
    q99: np.ndarray
    count: int

    def __post_init__(self) -> None:
        for f in _STAT_FIELDS:
            setattr(self, f, np.asarray(getattr(self, f), dtype=np.float64).reshape(-1))
        self.count = int(self.count)

    @property
    def dim(self) -> int:
        return len(self.min)

    @classmethod
    def from_data(cls, x: np.ndarray) -> FeatureStats:
        x = np.asarray(x, dtype=np.float64)
        x = x.reshape(len(x), -1)
        if len(x) == 0:
            raise ValueError("cannot compute statistics of an empty array")
        q = np.quantile(x, [0.01, 0.99], axis=0)
        return cls(x.min(0), x.max(0), x.mean(0), x.std(0), q[0], q[1], len(x))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {f: [float(v) for v in getattr(self, f)] for f in _STAT_FIELDS}
        d["count"] = self.count
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FeatureStats:
        missing = [f for f in (*_STAT_FIELDS, "count") if f not in d]
        if missing:
            raise ValueError(f"normalization stats lack {missing}")
        return cls(**{f: d[f] for f in _STAT_FIELDS}, count=d["count"])


def merge_stats(parts: Sequence[FeatureStats], data: np.ndarray | None = None) -> FeatureStats:
    """Pool statistics of disjoint parts exactly (min/max/mean/std).

    Quantiles cannot be pooled: pass the concatenated ``data`` to recompute them; without it the
    result keeps the conservative bounds min(q01) / max(q99), never an average.
    """
    if not parts:
        raise ValueError("merge_stats needs at least one part")
    n = np.array([p.count for p in parts], dtype=np.float64)
    w = (n / n.sum())[:, None]
    means = np.stack([p.mean for p in parts])
    mean = (w * means).sum(0)
    var = (w * (np.stack([p.std for p in parts]) ** 2 + (means - mean) ** 2)).sum(0)
    if data is not None:
        q01, q99 = np.quantile(np.asarray(data, np.float64).reshape(len(data), -1), [0.01, 0.99], axis=0)
    else:
        q01, q99 = np.min([p.q01 for p in parts], 0), np.max([p.q99 for p in parts], 0)
    return FeatureStats(
        np.min([p.min for p in parts], 0),
        np.max([p.max for p in parts], 0),
        mean,
        np.sqrt(var),
        q01,
        q99,
        int(n.sum()),
    )


def compute_stats(
    datasets: Sequence[Any],
    keys: Sequence[str],
    episodes: Sequence[Sequence[int] | None] | None = None,
) -> dict[str, FeatureStats]:
    """Stats of parquet columns ``keys`` over the given episodes of several ``LeRobotDataset``s.

    Reads only the loaded numeric columns (no video decode). ``episodes[i]`` restricts dataset i
    (None = all its loaded episodes), so validation episodes never leak into the statistics.
    """
    episodes = episodes if episodes is not None else [None] * len(datasets)
    out: dict[str, FeatureStats] = {}
    for key in keys:
        chunks = []
        for ds, eps in zip(datasets, episodes):
            col = ds.column(key)
            eps = ds.selected_episodes if eps is None else eps
            chunks += [col[slice(*ds.episode_bounds(e))] for e in eps]
        if not chunks:
            raise ValueError(f"compute_stats: no episodes selected for {key!r}")
        data = np.concatenate(chunks).reshape(sum(len(c) for c in chunks), -1)
        parts = [FeatureStats.from_data(c.reshape(len(c), -1)) for c in chunks if len(c)]
        out[key] = merge_stats(parts, data)
    return out


def pad_to(x: ArrayT, dim: int) -> ArrayT:
    """Zero-pad the last axis of ``x`` to ``dim`` (error if it is already larger)."""
    d = x.shape[-1]
    if d > dim:
        raise ValueError(f"cannot pad a last axis of {d} to {dim}: it is larger")
    if d == dim:
        return x
    if isinstance(x, torch.Tensor):
        return torch.nn.functional.pad(x, (0, dim - d))
    return np.concatenate([x, np.zeros(x.shape[:-1] + (dim - d,), dtype=x.dtype)], axis=-1)


def _center_inv(stats: FeatureStats, mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(center, half_range, inv) with inv = 1/half_range, or 0 where the dim is degenerate."""
    if mode == "min_max":
        lo, hi = stats.min, stats.max
        center, half = (lo + hi) / 2, (hi - lo) / 2
    elif mode == "q99":
        lo, hi = stats.q01, stats.q99
        center, half = (lo + hi) / 2, (hi - lo) / 2
    elif mode == "mean_std":
        center, half = stats.mean, stats.std
    else:  # sincos / none: identity
        return np.zeros(stats.dim), np.ones(stats.dim), np.ones(stats.dim)
    degenerate = half <= DEGENERATE_EPS / 2
    half = np.where(degenerate, 0.0, half)
    inv = np.divide(1.0, half, out=np.zeros_like(half), where=~degenerate)
    return center, half, inv


def _float(x: ArrayT) -> ArrayT:
    if isinstance(x, torch.Tensor):
        return x if x.dtype in (torch.float32, torch.float64) else x.float()
    x = np.asarray(x)
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)


def _affine(x: ArrayT, sub: np.ndarray, mul: np.ndarray, add: np.ndarray) -> ArrayT:
    """(x - sub) * mul + add on the last axis, in x's float dtype (float64 math for numpy)."""
    x = _float(x)
    if isinstance(x, torch.Tensor):
        t = [torch.as_tensor(a, dtype=x.dtype, device=x.device) for a in (sub, mul, add)]
        return (x - t[0]) * t[1] + t[2]
    return ((x.astype(np.float64) - sub) * mul + add).astype(x.dtype)


class Normalizer:
    """Action normalization and state encoding from ``FeatureStats`` and config modes."""

    def __init__(
        self,
        action_stats: FeatureStats,
        state_stats: FeatureStats,
        action_mode: str = "min_max",
        state_mode: str = "min_max",
        warn: bool = True,
    ) -> None:
        if action_mode not in ("min_max", "mean_std", "q99"):
            raise ValueError(f"action_norm: got {action_mode!r}, expected min_max, mean_std or q99")
        if state_mode not in MODES:
            raise ValueError(f"state_norm: got {state_mode!r}, expected one of {list(MODES)}")
        self.action_stats, self.state_stats = action_stats, state_stats
        self.action_mode, self.state_mode = action_mode, state_mode
        self._a_center, self._a_half, self._a_inv = _center_inv(action_stats, action_mode)
        self._s_center, _, self._s_inv = _center_inv(state_stats, state_mode)
        if warn:
            for name, inv, mode in (("action", self._a_inv, action_mode), ("state", self._s_inv, state_mode)):
                bad = np.flatnonzero(inv == 0).tolist()
                if bad:
                    warnings.warn(
                        f"{name} dims {bad} are constant in the data ({mode}): they normalize to 0 "
                        "and unnormalize to their constant value",
                        stacklevel=2,
                    )

    @property
    def action_dim(self) -> int:
        return self.action_stats.dim

    @property
    def state_dim(self) -> int:
        return self.state_stats.dim

    @property
    def encoded_state_dim(self) -> int:
        return 2 * self.state_dim if self.state_mode == "sincos" else self.state_dim

    @property
    def degenerate_action_dims(self) -> list[int]:
        return np.flatnonzero(self._a_inv == 0).tolist()

    def _check(self, x: Any, dim: int, what: str) -> None:
        if x.shape[-1] != dim:
            raise ValueError(f"{what}: last axis is {x.shape[-1]}, expected {dim} (raw, unpadded dims)")

    def normalize_action(self, x: ArrayT) -> ArrayT:
        self._check(x, self.action_dim, "normalize_action")
        return _affine(x, self._a_center, self._a_inv, np.zeros(self.action_dim))

    def unnormalize_action(self, x: ArrayT) -> ArrayT:
        """Model output (raw dims, any leading axes) -> robot units; degenerate dims -> constant."""
        self._check(x, self.action_dim, "unnormalize_action")
        return _affine(x, np.zeros(self.action_dim), self._a_half, self._a_center)

    def encode_state(self, x: ArrayT) -> ArrayT:
        """Raw state -> model input (before padding): normalized, raw, or [sin(x), cos(x)]."""
        self._check(x, self.state_dim, "encode_state")
        if self.state_mode == "sincos":
            x = _float(x)
            if isinstance(x, torch.Tensor):
                return torch.cat([torch.sin(x), torch.cos(x)], dim=-1)
            return np.concatenate([np.sin(x), np.cos(x)], axis=-1)
        return _affine(x, self._s_center, self._s_inv, np.zeros(self.state_dim))

    # -- serialization ----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "dit4dit_npu.normalizer/1",
            "action_mode": self.action_mode,
            "state_mode": self.state_mode,
            "action": self.action_stats.to_dict(),
            "state": self.state_stats.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], warn: bool = False) -> Normalizer:
        if d.get("format") != "dit4dit_npu.normalizer/1":
            raise ValueError(f"not a dit4dit_npu normalizer (format {d.get('format')!r})")
        return cls(
            FeatureStats.from_dict(d["action"]),
            FeatureStats.from_dict(d["state"]),
            d["action_mode"],
            d["state_mode"],
            warn=warn,
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Normalizer:
        return cls.from_dict(json.loads(text))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Normalizer:
        return cls.from_json(Path(path).read_text())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Normalizer) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return (
            f"Normalizer(action={self.action_mode} dim {self.action_dim}, "
            f"state={self.state_mode} dim {self.state_dim}->{self.encoded_state_dim})"
        )
