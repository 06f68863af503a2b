"""Training samples from LeRobot datasets: raw assembly here, every transform in PolicyIO.

A sample is anchored at frame t of an episode. ``raw_sample`` assembles it in robot units:

- ``views`` uint8 (T, V, H, W, 3): the camera frames at the PolicyIO's clip offsets, cameras in
  its order, decoded straight to its image size (one swscale pass; only these T frames are
  converted; the original converted the whole clip). Offsets past the episode end are clamped to its last frame.
- ``state`` (S,): the raw state at t; ``actions`` (H_a, A): absolute actions a[t : t + H_a] in
  the dataset's native order; steps past the episode end repeat the last action (lerobot's
  clamp; like the original they are not masked) and are flagged False in ``valid``.
- ``instruction``: the episode's task text; ``dataset``/``episode``/``frame``: provenance.

``__getitem__`` returns ``io.encode_sample(...)`` of it: the dict ``Batch.collate`` stacks. With a
latent cache (``use_latent_cache``) it decodes no video: the sample brings the clip's cached VAE
latents instead of frames.
Offsets are in frames of each dataset (its own fps): the row d frames later, whose parquet
``timestamp`` (plus the video's ``from_timestamp`` in v3.0) is the decode time, so fps and image
size are never assumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dit4dit_npu.data.latents import LatentCache
from dit4dit_npu.data.lerobot import LeRobotDataset
from dit4dit_npu.data.validate import feature_problems, raise_first
from dit4dit_npu.transforms.policy_io import PolicyIO


@dataclass
class RawSample:
    views: np.ndarray | None  # uint8 (T, V, H, W, 3); None when not decoded
    state: np.ndarray  # (S,) robot units
    actions: np.ndarray  # (H_a, A) robot units
    valid: np.ndarray  # (H_a,) bool: the step exists in the episode
    instruction: str
    dataset: int
    episode: int
    frame: int


class RoboTwinDataset(torch.utils.data.Dataset):
    """Samples over the allowed episodes of several LeRobotDatasets, indexed globally.

    Global index i belongs to dataset k when ``offsets[k] <= i < offsets[k + 1]``
    (``dataset_sizes`` feeds the MixtureSampler); within a dataset, samples are every frame of
    every allowed episode, in episode order.
    """

    def __init__(
        self,
        datasets: Sequence[LeRobotDataset],
        io: PolicyIO,
        state_key: str = "observation.state",
        action_key: str = "action",
        episodes: Sequence[Sequence[int] | None] | None = None,
    ) -> None:
        if not datasets:
            raise ValueError("RoboTwinDataset needs at least one dataset")
        self.datasets = list(datasets)
        self.io = io
        self.state_key, self.action_key = state_key, action_key
        self.clip_offsets = np.asarray(io.clip_offsets, dtype=np.int64)
        problems = feature_problems(self.datasets, io.camera_keys, [state_key, action_key])
        for ds in self.datasets:  # the policy's raw widths, not only one width per mixture
            for key, want, what in ((state_key, io.state_dim, "state"), (action_key, io.action_dim, "action")):
                have = ds.column(key).reshape(ds.num_frames, -1).shape[1] if ds.num_frames else want
                if have != want:
                    problems.append(f"{ds.root}: {what} {key!r} has {have} dims, the policy takes {want}")
        raise_first(problems)
        episodes = list(episodes) if episodes is not None else [None] * len(self.datasets)
        if len(episodes) != len(self.datasets):
            raise ValueError(f"{len(self.datasets)} datasets but {len(episodes)} episode lists")
        self._rows: list[np.ndarray] = []
        for ds, eps in zip(self.datasets, episodes):
            eps = ds.selected_episodes if eps is None else list(eps)
            rows = [np.arange(*ds.episode_bounds(e), dtype=np.int64) for e in eps]
            self._rows.append(np.concatenate(rows) if rows else np.zeros(0, np.int64))
        self.dataset_sizes = [len(r) for r in self._rows]
        self.offsets = np.concatenate([[0], np.cumsum(self.dataset_sizes)]).astype(np.int64)
        self.latents: LatentCache | None = None

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """Global sample index -> (dataset number, local row in that LeRobotDataset)."""
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for {len(self)} samples")
        k = int(np.searchsorted(self.offsets, index, side="right") - 1)
        return k, int(self._rows[k][index - self.offsets[k]])

    def raw_sample(self, index: int, decode_views: bool = True) -> RawSample:
        """The sample in robot units; ``decode_views=False`` leaves ``views`` None (no video read)."""
        k, row = self.locate(int(index))
        ds = self.datasets[k]
        ep = int(ds.column("episode_index")[row])
        start, end = ds.episode_bounds(ep)
        clip = clip_rows(row, self.clip_offsets, start, end)
        views = None
        if decode_views:
            views = self.io.camera_views(ds.frame_source(clip))
        steps = row + np.arange(self.io.chunk_length)
        return RawSample(
            views=views,
            state=ds.column(self.state_key)[row],
            actions=ds.column(self.action_key)[np.minimum(steps, end - 1)],
            valid=steps < end,
            instruction=ds.task_text(int(ds.column("task_index")[row])),
            dataset=k,
            episode=ep,
            frame=int(ds.column("frame_index")[row]),
        )

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self.latents is not None:
            return self.cached_sample(index)
        s = self.raw_sample(index)
        return self.io.encode_sample(s.views, s.state, s.actions, s.instruction)

    # ------------------------------------------------------------------ latent cache

    def episodes(self, k: int) -> list[int]:
        """The episodes of dataset ``k`` this dataset samples from, in order."""
        return list(dict.fromkeys(self.datasets[k].column("episode_index")[self._rows[k]].tolist()))

    def episode_clips(self, k: int, episode: int) -> np.ndarray:
        """(n, T) frame rows of the clip of each of the episode's n samples, in row order."""
        start, end = self.datasets[k].episode_bounds(episode)
        return clip_rows(np.arange(start, end), self.clip_offsets, start, end)

    def use_latent_cache(self, cache: LatentCache) -> None:
        """Read every sample's clip latents from ``cache`` (checked to cover every episode, for the
        same frames) instead of decoding video."""
        for k, ds in enumerate(self.datasets):
            cache.check_episodes(k, ds, self.episodes(k), lambda e, k=k: self.episode_clips(k, e))
        self.latents = cache

    def cached_sample(self, index: int) -> dict[str, Any]:
        """``__getitem__`` with a latent cache: state, actions, instruction, and the cached latents
        (the VAE's posterior mean of exactly the clip ``raw_sample`` would decode) for frames."""
        s = self.raw_sample(index, decode_views=False)
        k, row = self.locate(int(index))
        start, _ = self.datasets[k].episode_bounds(s.episode)
        item = self.io.encode_sample(None, s.state, s.actions, s.instruction)
        item["latents"] = self.latents.read(k, s.episode, row - start)
        return item


def clip_rows(rows: int | np.ndarray, offsets: np.ndarray, start: int, end: int) -> np.ndarray:
    """Frame rows of the clip anchored at each of ``rows`` (one episode [start, end)): offsets past
    the episode end are clamped to its last frame. (T,) for one row, (n, T) for n rows."""
    return np.clip(np.asarray(rows)[..., None] + offsets, start, end - 1)
