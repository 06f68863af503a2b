"""RoboTwin training samples from LeRobot datasets, and ``collate`` to the batch of batch.py.

One sample, anchored at frame t of an episode:

- ``frames`` uint8 (T, V, 3, H, W): the clip at ``video_delta_indices[::action_video_freq_ratio]``
  frame offsets, views in config order, resized to ``image_size`` while converting to RGB. Only
  those T frames are converted (the original decoded every delta frame, SPEC B8). Offsets past
  the episode end are clamped to its last frame and flagged in ``frames_is_pad``.
- ``state`` float32 (max_state_dim,): raw state at t, encoded by the Normalizer, zero-padded.
- ``action`` float32 (H_a, max_action_dim): absolute joint actions a[t : t + H_a] in the
  dataset's native order ([L6, Lgrip, R6, Rgrip] for RoboTwin; starVLA's reorder is not copied),
  normalized and zero-padded; steps past the episode end repeat the last action (lerobot's
  clamp; like the original, they are not masked). ``action_mask`` is True on the real dims.
- ``instruction`` str: the episode's task text.

Offsets are in frames of each dataset (its own fps): an offset d is the row d frames later, whose
parquet ``timestamp`` (plus the video's ``from_timestamp`` in v3.0) is the decode time, so fps and
image size are never assumed. With ``raw=True`` a sample also carries ``raw_state``/``raw_action``
in robot units and its provenance (dataset/episode/frame), for offline evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dit4dit_npu import batch as B
from dit4dit_npu.config import VLADataConfig
from dit4dit_npu.data.errors import DatasetError
from dit4dit_npu.data.lerobot import LeRobotDataset
from dit4dit_npu.data.normalize import Normalizer, pad_to

RAW_KEYS = ("raw_state", "raw_action", "dataset_index", "episode_index", "frame_index")


def feature_dim(ds: LeRobotDataset, key: str, what: str) -> int:
    """Size of a 1-d feature, or an error naming the dataset, the key and what exists."""
    feat = ds.meta.features.get(key)
    if feat is None:
        raise DatasetError(f"{ds.root}: {what} key {key!r} not found (features: {sorted(ds.meta.features)})")
    shape = feat.get("shape") or [1]
    if len(shape) != 1:
        raise DatasetError(f"{ds.root}: {what} key {key!r} has shape {shape}, expected a vector")
    return int(shape[0])


def check_cameras(ds: LeRobotDataset, camera_keys: Sequence[str]) -> None:
    missing = [k for k in camera_keys if k not in ds.meta.video_keys]
    if missing:
        raise DatasetError(
            f"{ds.root}: camera key(s) {missing} not found; the dataset's video keys are {ds.meta.video_keys}"
        )


class RoboTwinDataset(torch.utils.data.Dataset):
    """Samples over the allowed episodes of several LeRobotDatasets, indexed globally.

    Global index i belongs to dataset k when ``offsets[k] <= i < offsets[k + 1]``
    (``dataset_sizes`` feeds the MixtureSampler); within a dataset, samples are every frame of
    every allowed episode, in episode order.
    """

    def __init__(
        self,
        datasets: Sequence[LeRobotDataset],
        data_cfg: VLADataConfig,
        chunk_length: int,
        normalizer: Normalizer,
        episodes: Sequence[Sequence[int] | None] | None = None,
        raw: bool = False,
    ) -> None:
        if not datasets:
            raise ValueError("RoboTwinDataset needs at least one dataset")
        if chunk_length < 1:
            raise ValueError(f"chunk_length must be >= 1, got {chunk_length}")
        self.datasets = list(datasets)
        self.cfg = data_cfg
        self.chunk_length = int(chunk_length)
        self.normalizer = normalizer
        self.raw = raw
        self.camera_keys = list(data_cfg.camera_keys)
        self.image_size = (int(data_cfg.image_size[0]), int(data_cfg.image_size[1]))
        self.clip_offsets = np.asarray(data_cfg.video_delta_indices, dtype=np.int64)[
            :: data_cfg.action_video_freq_ratio
        ]
        if normalizer.encoded_state_dim > data_cfg.max_state_dim:
            raise DatasetError(
                f"encoded state has {normalizer.encoded_state_dim} dims (state_norm={normalizer.state_mode}) "
                f"but datasets.vla_data.max_state_dim is {data_cfg.max_state_dim}"
            )
        if normalizer.action_dim > data_cfg.max_action_dim:
            raise DatasetError(
                f"actions have {normalizer.action_dim} dims but datasets.vla_data.max_action_dim is "
                f"{data_cfg.max_action_dim}"
            )
        episodes = list(episodes) if episodes is not None else [None] * len(self.datasets)
        if len(episodes) != len(self.datasets):
            raise ValueError(f"{len(self.datasets)} datasets but {len(episodes)} episode lists")
        self._rows: list[np.ndarray] = []
        for ds, eps in zip(self.datasets, episodes):
            check_cameras(ds, self.camera_keys)
            for key, what, dim in (
                (data_cfg.state_key, "state", normalizer.state_dim),
                (data_cfg.action_key, "action", normalizer.action_dim),
            ):
                if feature_dim(ds, key, what) != dim:
                    raise DatasetError(
                        f"{ds.root}: {what} {key!r} has {feature_dim(ds, key, what)} dims, "
                        f"expected {dim} (normalizer / config)"
                    )
            eps = ds.selected_episodes if eps is None else list(eps)
            rows = [np.arange(*ds.episode_bounds(e), dtype=np.int64) for e in eps]
            self._rows.append(np.concatenate(rows) if rows else np.zeros(0, np.int64))
        self.dataset_sizes = [len(r) for r in self._rows]
        self.offsets = np.concatenate([[0], np.cumsum(self.dataset_sizes)]).astype(np.int64)

    @property
    def num_frames(self) -> int:
        """T of ``frames``: clip length after subsampling by ``action_video_freq_ratio``."""
        return len(self.clip_offsets)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """Global sample index -> (dataset number, local row in that LeRobotDataset)."""
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for {len(self)} samples")
        k = int(np.searchsorted(self.offsets, index, side="right") - 1)
        return k, int(self._rows[k][index - self.offsets[k]])

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.get_sample(index, raw=self.raw)

    def get_sample(self, index: int, raw: bool = False) -> dict[str, Any]:
        k, row = self.locate(int(index))
        ds = self.datasets[k]
        ep = int(ds.column("episode_index")[row])
        start, end = ds.episode_bounds(ep)

        clip = row + self.clip_offsets
        frames_is_pad = (clip < start) | (clip >= end)
        clip = np.clip(clip, start, end - 1)
        frames = np.empty((len(clip), len(self.camera_keys), 3, *self.image_size), dtype=np.uint8)
        for v, key in enumerate(self.camera_keys):
            hwc = ds.frames_at(clip, key, self.image_size)  # (T, H, W, 3)
            for c in range(3):  # per-channel copies: ~10x faster than a permuted torch copy of uint8
                frames[:, v, c] = hwc[..., c]

        raw_state = ds.column(self.cfg.state_key)[row]
        raw_action = ds.column(self.cfg.action_key)[np.minimum(row + np.arange(self.chunk_length), end - 1)]
        state = pad_to(self.normalizer.encode_state(raw_state), self.cfg.max_state_dim)
        action = pad_to(self.normalizer.normalize_action(raw_action), self.cfg.max_action_dim)
        action_mask = np.zeros((self.chunk_length, self.cfg.max_action_dim), dtype=bool)
        action_mask[:, : self.normalizer.action_dim] = True

        sample: dict[str, Any] = {
            B.FRAMES: torch.from_numpy(frames),
            B.INSTRUCTION: ds.task_text(int(ds.column("task_index")[row])),
            B.STATE: torch.from_numpy(np.asarray(state, dtype=np.float32)),
            B.ACTION: torch.from_numpy(np.asarray(action, dtype=np.float32)),
            B.ACTION_MASK: torch.from_numpy(action_mask),
            B.FRAMES_IS_PAD: torch.from_numpy(frames_is_pad),
        }
        if raw:
            sample["raw_state"] = torch.from_numpy(np.array(raw_state, dtype=np.float32))
            sample["raw_action"] = torch.from_numpy(np.array(raw_action, dtype=np.float32))
            sample["dataset_index"] = torch.tensor(k)
            sample["episode_index"] = torch.tensor(ep)
            sample["frame_index"] = torch.tensor(int(ds.column("frame_index")[row]))
        return sample


def collate(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """List of samples -> the batch dict of ``dit4dit_npu.batch`` (plus raw keys if present)."""
    if not samples:
        raise ValueError("collate: empty batch")
    out: dict[str, Any] = {B.INSTRUCTION: [s[B.INSTRUCTION] for s in samples]}
    for key in (B.FRAMES, B.STATE, B.ACTION, B.ACTION_MASK, B.FRAMES_IS_PAD, *RAW_KEYS):
        if key in samples[0]:
            out[key] = torch.stack([s[key] for s in samples])
    return out
