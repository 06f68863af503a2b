"""Episode-level train/validation split and the weighted, sharded, resumable mixture sampler.

Sampling follows the original's mixture: dataset weights are normalised and dataset size does
not change them; an epoch has ``max_i(size_i / weight_i)`` samples. Two things differ on purpose:
within a dataset, indices are drawn from fresh random permutations (every frame once before any
repeats) instead of i.i.d. uniform steps, and the sequence is a pure function of
(seed, epoch), so it can be sharded across ranks and resumed exactly from a saved cursor.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dit4dit_npu.config import DatasetEntry, VLADataConfig
from dit4dit_npu.data.errors import DatasetError

# What marks a folder as a LeRobot dataset (v2.1 and v3.0 both keep it).
DATASET_MARKER = Path("meta") / "info.json"


def mixture_entries(d: VLADataConfig) -> list[DatasetEntry]:
    """The datasets a run trains on: ``data_mix`` as listed or, when it is empty, every LeRobot
    dataset folder directly under ``data_root_dir`` (by name, weight 1.0 each), or
    ``data_root_dir`` itself when it is one. So one's own data needs only ``data_root_dir``, and a
    shipped config's list of task folders is emptied with ``datasets.vla_data.data_mix=[]``."""
    if d.data_mix:
        return list(d.data_mix)
    root = Path(d.data_root_dir)
    how = ("datasets.vla_data.data_mix is empty, so data_root_dir must be a LeRobot dataset folder (with "
           f"{DATASET_MARKER}) or a folder of them")
    if not root.is_dir():
        raise DatasetError(f"datasets.vla_data.data_root_dir: {root} is not a folder ({how})")
    if (root / DATASET_MARKER).is_file():
        return [DatasetEntry(path=".", weight=1.0)]
    found = sorted(c.name for c in root.iterdir() if (c / DATASET_MARKER).is_file())
    if not found:
        raise DatasetError(f"datasets.vla_data.data_root_dir: {root} holds no LeRobot dataset folder ({how})")
    return [DatasetEntry(path=name, weight=1.0) for name in found]


def split_episodes(
    episode_indices: Sequence[int], val: float | Sequence[int] = 0.0, seed: int = 0
) -> tuple[list[int], list[int]]:
    """Deterministic episode-level split -> (train, val), both sorted.

    ``val`` is a fraction of the episodes (at least one when > 0 and there are >= 2 episodes, and
    always leaving one for training) or an explicit list of validation episode indices.
    """
    episodes = sorted(int(e) for e in episode_indices)
    if isinstance(val, (int, float)) and not isinstance(val, bool):
        if not 0.0 <= val < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {val}")
        n_val = round(val * len(episodes))
        if val > 0 and n_val == 0 and len(episodes) >= 2:
            n_val = 1
        n_val = min(n_val, max(len(episodes) - 1, 0))
        perm = np.random.default_rng(seed).permutation(len(episodes))
        val_set = {episodes[i] for i in perm[:n_val]}
    else:
        val_set = {int(e) for e in val}
        unknown = sorted(val_set - set(episodes))
        if unknown:
            raise DatasetError(
                f"validation episodes {unknown} do not exist (episodes: {episodes[0]}..{episodes[-1]})"
            )
    train = [e for e in episodes if e not in val_set]
    if not train:
        raise DatasetError("the validation split leaves no training episodes")
    return train, sorted(val_set)


def _next_permutation(prev: np.ndarray, rng: np.random.Generator, k: int) -> np.ndarray:
    """A fresh permutation whose first k items avoid the last k of ``prev``.

    So an index recurs at least k + 1 draws later when a (small) dataset's permutation wraps,
    and a step of <= k + 1 consecutive positions never holds the same sample twice.
    """
    perm = rng.permutation(len(prev))
    if k <= 0:
        return perm
    recent = np.isin(perm, prev[-k:])
    fresh = perm[~recent]
    tail = np.sort(np.concatenate([np.flatnonzero(~recent)[k:], np.flatnonzero(recent)]))
    return np.concatenate([fresh[:k], perm[tail]])


class MixtureSampler(torch.utils.data.Sampler[int]):
    """Global indices into a concatenation of datasets (sizes ``dataset_sizes``), by weight.

    Every rank builds the same global sequence for an epoch from ``(seed, epoch)`` and takes
    positions ``rank, rank + world_size, ...``: ranks never share a position, and a dataset's
    indices only repeat once its permutation is exhausted. The epoch length is rounded up to a
    multiple of ``world_size`` so every rank yields the same number of indices.

    Resume: ``state_dict(consumed)`` records (epoch, position). Because a multi-worker DataLoader
    prefetches indices, pass ``consumed`` = samples this rank has actually trained on since the
    current ``iter()`` began; without it the count of indices yielded so far is used (exact only
    without prefetching). After ``load_state_dict`` the next ``iter()`` yields exactly the
    remaining indices of that epoch; later epochs start from position 0. ``set_epoch(e)`` with
    the epoch already set keeps a restored cursor.
    """

    def __init__(
        self,
        dataset_sizes: Sequence[int],
        weights: Sequence[float] | None = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        num_samples: int | None = None,
        batch_size: int = 1,
    ) -> None:
        self.sizes = [int(s) for s in dataset_sizes]
        w = np.ones(len(self.sizes)) if weights is None else np.asarray(weights, dtype=np.float64)
        if len(w) != len(self.sizes) or not self.sizes:
            raise ValueError(f"{len(self.sizes)} dataset sizes but {len(w)} weights")
        if (w < 0).any() or w.sum() <= 0:
            raise ValueError(f"mixture weights must be >= 0 with a positive sum, got {list(w)}")
        empty = [i for i, (s, wi) in enumerate(zip(self.sizes, w)) if wi > 0 and s == 0]
        if empty:
            raise DatasetError(f"datasets {empty} of the mixture have a positive weight but no samples")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} not in [0, {world_size})")
        self.weights = w / w.sum()
        self.seed, self.rank, self.world_size = int(seed), int(rank), int(world_size)
        # One training step takes this many consecutive positions of the global sequence.
        self.window = int(world_size) * max(int(batch_size), 1)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        if num_samples is None:
            num_samples = max(math.ceil(s / wi) for s, wi in zip(self.sizes, self.weights) if wi > 0)
        self.total = math.ceil(num_samples / world_size) * world_size
        self.per_rank = self.total // world_size
        self.epoch = 0  # epoch of the next iter()
        self._start = 0  # position in this rank's sequence where the next iter() begins
        # The latest (or upcoming) pass, for state_dict: its epoch, start and indices yielded.
        self._iter_epoch, self._iter_start, self._yielded = 0, 0, 0

    # -- the sequence -----------------------------------------------------------------------

    def global_indices(self, epoch: int) -> np.ndarray:
        """The whole epoch's sequence of global indices (same on every rank)."""
        rng = np.random.default_rng([self.seed, epoch])
        choice = rng.choice(len(self.sizes), size=self.total, p=self.weights)
        out = np.empty(self.total, dtype=np.int64)
        for i, size in enumerate(self.sizes):
            where = np.flatnonzero(choice == i)
            if not len(where):
                continue
            drng = np.random.default_rng([self.seed, epoch, i])
            perms = [drng.permutation(size)]
            while sum(len(p) for p in perms) < len(where):
                perms.append(_next_permutation(perms[-1], drng, min(self.window, size // 2)))
            out[where] = self.offsets[i] + np.concatenate(perms)[: len(where)]
        return out

    def rank_indices(self, epoch: int) -> np.ndarray:
        return self.global_indices(epoch)[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[int]:
        seq = self.rank_indices(self.epoch)
        self._iter_epoch, self._iter_start, self._yielded = self.epoch, self._start, 0
        for pos in range(self._start, self.per_rank):
            self._yielded += 1
            yield int(seq[pos])
        # A finished pass: the next iter() is the next epoch from its beginning (the _iter_*
        # fields stay, so a prefetching loader's not-yet-consumed tail can still be saved).
        self.epoch += 1
        self._start = 0

    def __len__(self) -> int:
        return self.per_rank - self._start

    def set_epoch(self, epoch: int) -> None:
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self._start = 0
            self._iter_epoch, self._iter_start, self._yielded = self.epoch, 0, 0

    # -- resume -----------------------------------------------------------------------------

    def _fingerprint(self) -> dict[str, Any]:
        return {
            "sizes": self.sizes,
            "weights": [float(w) for w in self.weights],
            "seed": self.seed,
            "world_size": self.world_size,
            "window": self.window,
            "total": self.total,
        }

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        used = self._yielded if consumed is None else int(consumed)
        position = self._iter_start + used
        epoch = self._iter_epoch
        if position >= self.per_rank:
            epoch, position = epoch + 1, 0
        return {"epoch": epoch, "position": position, "rank": self.rank, **self._fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = self._fingerprint()
        diff = [k for k in mine if state.get(k) != mine[k]]
        if diff:
            raise ValueError(
                "sampler state does not match this data/run (differs in "
                + ", ".join(f"{k}: saved {state.get(k)!r} vs now {mine[k]!r}" for k in diff)
                + "); exact resume needs the same datasets, split, weights, seed and world size"
            )
        self.epoch = int(state["epoch"])
        self._start = int(state["position"])
        self._iter_epoch, self._iter_start, self._yielded = self.epoch, self._start, 0
