"""Statistics of the training data, computed from parquet columns (never from video).

Computed over the *training* episodes of the whole mixture (never from lerobot's stats files,
which may be stale, and never from held-out episodes): min/max/mean/std pooled exactly, q01/q99
recomputed from the concatenated data (``transforms.feature_stats``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dit4dit_npu.transforms.feature_stats import FeatureStats, merge_stats


def compute_stats(
    datasets: Sequence[Any],
    keys: Sequence[str],
    episodes: Sequence[Sequence[int] | None] | None = None,
) -> dict[str, FeatureStats]:
    """Stats of parquet columns ``keys`` over the given episodes of several ``LeRobotDataset``s.

    ``episodes[i]`` restricts dataset i (None = all its loaded episodes), so validation episodes
    never leak into the statistics.
    """
    episodes = episodes if episodes is not None else [None] * len(datasets)
    out: dict[str, FeatureStats] = {}
    for key in keys:
        chunks = []
        for ds, eps in zip(datasets, episodes):
            col = ds.column(key)
            eps = ds.selected_episodes if eps is None else eps
            chunks += [col[slice(*ds.episode_bounds(e))] for e in eps]
        chunks = [c.reshape(len(c), -1) for c in chunks if len(c)]
        if not chunks:
            raise ValueError(f"compute_stats: no frames selected for {key!r}")
        out[key] = merge_stats([FeatureStats.from_data(c) for c in chunks], np.concatenate(chunks))
    return out
