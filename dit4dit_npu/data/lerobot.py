"""``LeRobotDataset``: lerobot's dataset class, read natively (pyarrow + PyAV), never written.

``lerobot`` itself cannot be installed next to diffusers >= 0.37 (its releases pin diffusers < 0.36
and torch < 2.11), so this mirrors its
public API: ``LeRobotDataset(root, delta_timestamps=..., episodes=..., tolerance_s=...)``,
``len(ds)`` = frames, and ``ds[i]`` with the same keys, shapes and dtypes as lerobot:

- every numeric feature (float -> float32, int -> int64; a vector column gives (D,), a scalar
  column a 0-d tensor), plus ``timestamp``, ``frame_index``, ``episode_index``, ``index``,
  ``task_index`` and ``task`` (str);
- every camera as float32 (3, H, W) in [0, 1];
- a key with delta timestamps gets a leading time axis and a bool ``<key>_is_pad``: offsets
  outside the episode are clamped to its edge frame and flagged (lerobot's padding).

All numeric parquet columns of the selected episodes are loaded once into numpy arrays (they are
small next to the videos and shared copy-on-write by forked workers), so no sample re-reads a
parquet file (the original re-read one per sample). Videos are decoded frame-sparsely on demand
(``video.VideoDecoder``); ``image_size`` resizes during the conversion to RGB.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from dit4dit_npu.data.errors import DatasetError
from dit4dit_npu.data.meta import STANDARD_COLUMNS, LeRobotDatasetMetadata, read_parquet
from dit4dit_npu.data.validate import index_problems, raise_first, table_problems
from dit4dit_npu.data.video import VideoDecoder


def check_delta_timestamps(
    delta_timestamps: dict[str, Sequence[float]], fps: float, tolerance_s: float
) -> None:
    """Every offset must be a whole number of frames at ``fps`` (within ``tolerance_s``)."""
    for key, deltas in delta_timestamps.items():
        for d in deltas:
            off = abs(d * fps - round(d * fps)) / fps
            if off > tolerance_s:
                raise DatasetError(
                    f"delta_timestamps[{key!r}]: {d} s is {off:.2e} s off the 1/{fps:g} s frame grid "
                    f"(tolerance {tolerance_s:g} s); use multiples of 1/fps"
                )


def get_delta_indices(delta_timestamps: dict[str, Sequence[float]], fps: float) -> dict[str, np.ndarray]:
    return {k: np.array([round(d * fps) for d in v], dtype=np.int64) for k, v in delta_timestamps.items()}


def _column_to_numpy(col: pa.ChunkedArray, name: str, path: Path) -> np.ndarray:
    arr = col.combine_chunks()
    n = len(arr)
    if (
        pa.types.is_list(arr.type)
        or pa.types.is_large_list(arr.type)
        or pa.types.is_fixed_size_list(arr.type)
    ):
        values = arr.flatten()
        while pa.types.is_list(values.type) or pa.types.is_fixed_size_list(values.type):
            values = values.flatten()
        out = values.to_numpy(zero_copy_only=False)
        if n and out.size % n:
            raise DatasetError(f"{path}: column {name!r} has rows of different lengths")
        return out.reshape(n, -1) if n else out.reshape(0, 0)
    return arr.to_numpy(zero_copy_only=False)


class LeRobotDataset(torch.utils.data.Dataset):
    """A local LeRobot v2.0/v2.1/v3.0 dataset with lerobot's ``__getitem__`` semantics."""

    def __init__(
        self,
        root: str | Path,
        delta_timestamps: dict[str, list[float]] | None = None,
        episodes: Sequence[int] | None = None,
        tolerance_s: float = 1e-4,
        image_size: tuple[int, int] | None = None,
        decoder: VideoDecoder | None = None,
    ) -> None:
        self.root = Path(root)
        self.meta = LeRobotDatasetMetadata(self.root)
        raise_first(index_problems(self.meta))
        self.tolerance_s = tolerance_s
        self.image_size = tuple(int(s) for s in image_size) if image_size is not None else None
        self.decoder = decoder or VideoDecoder()
        if episodes is None:
            self.episodes: list[int] | None = None
            selected = list(self.meta.episodes)
        else:
            self.episodes = sorted({int(e) for e in episodes})
            for e in self.episodes:
                self.meta.episode(e)  # raises naming the dataset when absent
            selected = self.episodes
        self.delta_timestamps = delta_timestamps
        self.delta_indices: dict[str, np.ndarray] | None = None
        if delta_timestamps is not None:
            unknown = [k for k in delta_timestamps if k not in self.meta.features]
            if unknown:
                raise DatasetError(
                    f"{self.root}: delta_timestamps keys {unknown} are not features "
                    f"(available: {sorted(self.meta.features)})"
                )
            check_delta_timestamps(delta_timestamps, self.meta.fps, tolerance_s)
            self.delta_indices = get_delta_indices(delta_timestamps, self.meta.fps)
        if self.meta.image_keys:
            warnings.warn(
                f"{self.root}: image features stored in parquet ({self.meta.image_keys}) are not "
                "decoded by this reader; only video features are returned",
                stacklevel=2,
            )
        self._load_columns(selected)
        self._check_videos_exist(selected)

    # -- loading ----------------------------------------------------------------------------

    def _numeric_keys(self) -> list[str]:
        keys = [
            k for k, f in self.meta.features.items() if f.get("dtype") not in ("video", "image", "string")
        ]
        return keys + [k for k in STANDARD_COLUMNS if k not in keys]

    def _load_columns(self, selected: list[int]) -> None:
        keys = self._numeric_keys()
        by_file: dict[Path, list[int]] = {}
        for ep in selected:
            by_file.setdefault(self.meta.get_data_file_path(ep), []).append(ep)
        parts: dict[str, list[np.ndarray]] = {k: [] for k in keys}
        self._ep_bounds: dict[int, tuple[int, int]] = {}
        self._ep_file: dict[int, Path] = {}
        n = 0
        for rel, eps in by_file.items():
            path = self.root / rel
            table = read_parquet(path)
            missing = [k for k in keys if k not in table.column_names]
            if missing:
                raise DatasetError(f"{path}: missing columns {missing} (declared in meta/info.json)")
            cols = {k: _column_to_numpy(table.column(k), k, path) for k in keys}
            metas = [self.meta.episode(ep) for ep in eps]
            raise_first(
                table_problems(path, cols, metas, self.meta.fps, self.tolerance_s, self.meta.tasks, set(self.meta.episodes))
            )
            ep_col = cols["episode_index"]
            for ep in eps:
                rows = np.flatnonzero(ep_col == ep)
                length = len(rows)
                for k in keys:
                    parts[k].append(cols[k][rows])
                self._ep_bounds[ep] = (n, n + length)
                self._ep_file[ep] = path
                n += length
        self._columns: dict[str, np.ndarray] = {}
        for k in keys:
            arr = np.concatenate(parts[k]) if parts[k] else np.zeros((0,))
            if arr.dtype.kind == "f":
                arr = arr.astype(np.float32, copy=False)
            elif arr.dtype.kind in "iu":
                arr = arr.astype(np.int64, copy=False)
            self._columns[k] = np.ascontiguousarray(arr)

    def _check_videos_exist(self, selected: list[int]) -> None:
        """Fail at construction, not in a worker hours later (the original resampled forever, C5)."""
        paths = {
            self.root / self.meta.get_video_file_path(e, k) for e in selected for k in self.meta.video_keys
        }
        missing = sorted(str(p) for p in paths if not p.is_file())
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise DatasetError(f"video file(s) missing: {', '.join(missing[:3])}{more}")

    # -- lerobot-like API -------------------------------------------------------------------

    @property
    def fps(self) -> float:
        return self.meta.fps

    @property
    def features(self) -> dict[str, dict]:
        return self.meta.features

    @property
    def num_frames(self) -> int:
        return len(self._columns["index"])

    @property
    def num_episodes(self) -> int:
        return len(self._ep_bounds)

    @property
    def episode_data_index(self) -> dict[str, torch.Tensor]:
        """lerobot v2.x's {"from": ..., "to": ...} row ranges of the loaded episodes."""
        bounds = np.array(list(self._ep_bounds.values()), dtype=np.int64).reshape(-1, 2)
        return {"from": torch.from_numpy(bounds[:, 0].copy()), "to": torch.from_numpy(bounds[:, 1].copy())}

    def __len__(self) -> int:
        return self.num_frames

    def __repr__(self) -> str:
        return (
            f"LeRobotDataset(root={str(self.root)!r}, version={self.meta.codebase_version}, "
            f"episodes={self.num_episodes}, frames={self.num_frames}, fps={self.fps:g}, "
            f"cameras={self.meta.camera_keys})"
        )

    # -- lower-level access used by the RoboTwin sample assembly -----------------------------

    @property
    def selected_episodes(self) -> list[int]:
        return list(self._ep_bounds)

    def episode_bounds(self, episode_index: int) -> tuple[int, int]:
        """Local row range [start, end) of an episode in this (possibly filtered) dataset."""
        try:
            return self._ep_bounds[int(episode_index)]
        except KeyError:
            raise DatasetError(f"{self.root}: episode {episode_index} is not loaded") from None

    def column(self, key: str) -> np.ndarray:
        """All loaded rows of a numeric column (read-only view; float32 or int64)."""
        if key not in self._columns:
            raise DatasetError(f"{self.root}: no numeric column {key!r} (available: {sorted(self._columns)})")
        view = self._columns[key].view()
        view.flags.writeable = False
        return view

    def task_text(self, task_index: int) -> str:
        try:
            return self.meta.tasks[int(task_index)]
        except KeyError:
            raise DatasetError(f"{self.root}: task_index {task_index} not in the tasks metadata") from None

    def frames_at(
        self, rows: Sequence[int] | np.ndarray, key: str, size_hw: Sequence[int] | None = None, *,
        as_stored: bool = False,
    ) -> np.ndarray:
        """uint8 (N, H, W, 3) frames of camera ``key`` at local ``rows`` (all in one episode), at
        ``size_hw`` (None: the dataset's image_size; ``as_stored``: the size the video holds)."""
        if key not in self.meta.video_keys:
            raise DatasetError(
                f"{self.root}: camera key {key!r} not found (available: {self.meta.video_keys})"
            )
        rows = np.asarray(rows, dtype=np.int64)
        ep = int(self._columns["episode_index"][rows[0]])
        vid = self.meta.episode(ep)["videos"][key]
        ts = self._columns["timestamp"][rows].astype(np.float64) + vid["from_timestamp"]
        size = None if as_stored else size_hw if size_hw is not None else self.image_size
        return self.decoder.decode(self.root / vid["path"], ts.tolist(), self.tolerance_s, size)

    def frame_source(self, rows: Sequence[int] | np.ndarray) -> Callable[[str], np.ndarray]:
        """``frames_of(key)`` for ``PolicyIO.camera_views``: camera ``key``'s frames at ``rows``,
        decoded to RGB as stored (the dataset's own image_size must not resize them): the
        PolicyIO's crop and resize steps then treat them as a live camera's frames."""
        return lambda key: self.frames_at(rows, key, as_stored=True)

    # -- lerobot __getitem__ -----------------------------------------------------------------

    def __getitem__(self, idx: int) -> dict:
        if not -len(self) <= idx < len(self):
            raise IndexError(f"index {idx} out of range for {len(self)} frames")
        row = int(idx) % len(self)
        ep = int(self._columns["episode_index"][row])
        start, end = self._ep_bounds[ep]
        item: dict = {k: torch.from_numpy(np.array(v[row])) for k, v in self._columns.items()}
        video_rows: dict[str, np.ndarray] = {}
        for key, deltas in (self.delta_indices or {}).items():
            q = row + deltas
            item[f"{key}_is_pad"] = torch.from_numpy((q < start) | (q >= end))
            q = np.clip(q, start, end - 1)
            if key in self.meta.video_keys:
                video_rows[key] = q
            elif key in self._columns:
                item[key] = torch.from_numpy(self._columns[key][q].copy())
        for key in self.meta.video_keys:
            rows = video_rows.get(key, np.array([row]))
            frames = torch.from_numpy(self.frames_at(rows, key)).permute(0, 3, 1, 2).float().div_(255.0)
            item[key] = frames if key in video_rows else frames[0]
        item["task"] = self.task_text(int(self._columns["task_index"][row]))
        return item
