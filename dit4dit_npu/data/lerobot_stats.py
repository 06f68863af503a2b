"""Dataset statistics in lerobot's layout: what the writer stores in ``meta/stats.json`` and per episode.

lerobot (``compute_stats.compute_episode_stats`` and ``aggregate_stats``) keeps, for every feature
that is not a string: ``min``, ``max``, ``mean``, ``std``, ``count``, ``q01``, ``q10``, ``q50``,
``q90``, ``q99``.

- numeric columns (state, action, timestamp, frame_index, ...): per dimension, shape (D,) and (1,)
  for scalar columns; ``count`` = [frames];
- cameras: per RGB channel scaled to [0, 1], shape (3, 1, 1), over a sample of the episode's frames
  (``sample_indices``: 100 evenly spaced frames, more for long episodes; frames of 300 px or more
  strided down to about 150 px); ``count`` = [sampled frames]. ``lerobot-train`` normalizes
  images with these, and refuses a dataset without them.

lerobot aggregates episodes by averaging their quantiles, which is not the quantile of the union
(lerobot#4156). Here they stay exact: numeric columns are small and pooled whole, and camera pixels
are uint8, so a 256-bin histogram per channel (``PixelHistogram``) holds everything the statistics
need, in bounded memory however many episodes are written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_NAMES = tuple(f"q{round(q * 100):02d}" for q in QUANTILES)
STAT_NAMES = ("min", "max", "mean", "std", "count", *QUANTILE_NAMES)


def vector_stats(x: np.ndarray) -> dict[str, np.ndarray]:
    """Stats of a numeric column (T,) or (T, D) over its T frames; min/max keep the column's dtype."""
    x = np.asarray(x)
    x = x.reshape(len(x), -1)
    xf = x.astype(np.float64)
    out = {"min": x.min(0), "max": x.max(0), "mean": xf.mean(0), "std": xf.std(0), "count": np.array([len(x)])}
    for name, q in zip(QUANTILE_NAMES, QUANTILES):
        out[name] = np.quantile(xf, q, axis=0)
    return out


def sample_indices(length: int) -> list[int]:
    """The frames lerobot samples for an episode's image statistics (``compute_stats.sample_indices``)."""
    wanted = max(min(100, length), min(int(length**0.75), 10_000))
    return np.round(np.linspace(0, length - 1, wanted)).astype(int).tolist()


def downsample(frames: np.ndarray) -> np.ndarray:
    """lerobot's ``auto_downsample_height_width`` on (N, H, W, 3): frames >= 300 px strided to ~150 px."""
    h, w = frames.shape[1:3]
    if max(h, w) < 300:
        return frames
    step = int(w / 150) if w > h else int(h / 150)
    return frames[:, ::step, ::step]


@dataclass
class PixelHistogram:
    """Per-channel histogram of uint8 RGB values (3, 256) and how many frames went into it."""

    counts: np.ndarray
    frames: int

    @classmethod
    def of_episode(cls, frames: np.ndarray) -> PixelHistogram:
        """The histogram of the frames lerobot samples from one episode's uint8 (T, H, W, 3) frames."""
        picked = downsample(np.asarray(frames)[sample_indices(len(frames))])
        flat = picked.reshape(-1, 3)
        counts = np.stack([np.bincount(flat[:, c], minlength=256) for c in range(3)]).astype(np.int64)
        return cls(counts, len(picked))

    def __add__(self, other: PixelHistogram) -> PixelHistogram:
        return PixelHistogram(self.counts + other.counts, self.frames + other.frames)

    def stats(self) -> dict[str, np.ndarray]:
        """Per-channel stats in [0, 1], each (3, 1, 1); quantiles as ``np.quantile`` (linear) would give."""
        values = np.arange(256, dtype=np.float64) / 255.0
        n = self.counts.sum(1).astype(np.float64)  # pixels per channel
        mean = (self.counts * values).sum(1) / n
        var = (self.counts * (values - mean[:, None]) ** 2).sum(1) / n
        present = self.counts > 0
        out = {
            "min": np.array([values[p][0] for p in present]),
            "max": np.array([values[p][-1] for p in present]),
            "mean": mean,
            "std": np.sqrt(var),
        }
        for name, q in zip(QUANTILE_NAMES, QUANTILES):
            out[name] = np.array([_hist_quantile(c, q) for c in self.counts]) / 255.0
        out = {k: v.reshape(3, 1, 1) for k, v in out.items()}
        return out | {"count": np.array([self.frames])}


def _hist_quantile(counts: np.ndarray, q: float) -> float:
    """``np.quantile(values, q)`` (linear interpolation) of the integers whose histogram is ``counts``."""
    cum = np.cumsum(counts)
    pos = q * (cum[-1] - 1)  # position in the sorted values
    lo = int(np.floor(pos))
    v_lo = int(np.searchsorted(cum, lo, side="right"))  # the value at sorted position lo
    v_hi = int(np.searchsorted(cum, min(lo + 1, cum[-1] - 1), side="right"))
    return v_lo + (pos - lo) * (v_hi - v_lo)


def to_json(stats: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, Any]]:
    """Nested lists, as lerobot serializes stats (``{feature: {stat: list}}``)."""
    return {feat: {name: np.asarray(v).tolist() for name, v in per.items()} for feat, per in stats.items()}
