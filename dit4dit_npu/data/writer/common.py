"""What both LeRobot format versions share: the episode and dataset description, an episode's
parquet rows, ``info.json``'s common part, the statistics of every feature (``lerobot_stats``), and
``LeRobotWriter``, the episode-at-a-time writer whose file layout each version's subclass owns
(``v21.py``, ``v30.py``). ``LeRobotWriter(root, version, spec)`` makes the writer of that version.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from dit4dit_npu.data.lerobot_stats import PixelHistogram, vector_stats
from dit4dit_npu.data.meta import STANDARD_COLUMNS

CODEC_NAMES = {"libx264": "h264", "libsvtav1": "av1", "libaom-av1": "av1", "mpeg4": "mpeg4"}


def aloha_modality(video_keys: Sequence[str]) -> dict:
    """starVLA/GR00T's ``modality.json`` for the 14-d bimanual layout (RoboTwin's aloha-agilex and
    gym-aloha alike: [left 6, left gripper, right 6, right gripper]), so those loaders accept the
    datasets written here too. ``video_keys``: full keys, ``observation.images.<name>``."""
    parts = {"left_joints": (0, 6), "left_gripper": (6, 7), "right_joints": (7, 13), "right_gripper": (13, 14)}
    return {
        "state": {k: {"start": s, "end": e} for k, (s, e) in parts.items()},
        "action": {k: {"start": s, "end": e} for k, (s, e) in parts.items()},
        "video": {k.split(".")[-1]: {"original_key": k} for k in video_keys},
        "annotation": {"human.action.task_description": {"original_key": "task_index"}},
    }


@dataclass
class Episode:
    states: np.ndarray  # (T, D) float32
    actions: np.ndarray  # (T, A) float32
    task_index: int


@dataclass
class DatasetSpec:
    fps: int
    tasks: Sequence[str]
    video_keys: Sequence[str]
    motors: Sequence[str]
    robot_type: str = "aloha-agilex"
    codec: str = "libx264"
    gop: int = 8
    extra_meta: dict[str, Any] = field(default_factory=dict)  # file name in meta/ -> JSON content


def features(spec: DatasetSpec, size_hw: tuple[int, int], sd: int, ad: int) -> dict:
    """``info.json``'s features as both versions write them (v3.0 adds ``fps`` to the non-video ones)."""
    h, w = size_hw
    feats: dict = {
        "observation.state": {"dtype": "float32", "shape": [sd], "names": list(spec.motors[:sd])},
        "action": {"dtype": "float32", "shape": [ad], "names": list(spec.motors[:ad])},
    }
    for key in spec.video_keys:
        feats[key] = {
            "dtype": "video",
            "shape": [h, w, 3],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": h,
                "video.width": w,
                "video.codec": CODEC_NAMES.get(spec.codec, spec.codec),
                "video.pix_fmt": "yuv420p",
                "video.is_depth_map": False,
                "video.fps": spec.fps,
                "video.channels": 3,
                "has_audio": False,
            },
        }
    feats["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for k in ("frame_index", "episode_index", "index", "task_index"):
        feats[k] = {"dtype": "int64", "shape": [1], "names": None}
    return feats


def frame_columns(ep: Episode, episode_index: int, start: int, fps: int) -> dict[str, np.ndarray]:
    """The parquet columns of one episode, in lerobot's order and dtypes."""
    n = len(ep.states)
    return {
        "observation.state": np.asarray(ep.states, np.float32),
        "action": np.asarray(ep.actions, np.float32),
        "timestamp": (np.arange(n) / fps).astype(np.float32),
        "frame_index": np.arange(n, dtype=np.int64),
        "episode_index": np.full(n, episode_index, np.int64),
        "index": np.arange(start, start + n, dtype=np.int64),
        "task_index": np.full(n, ep.task_index, np.int64),
    }


def frame_table(cols: dict[str, np.ndarray]) -> pa.Table:
    vec = pa.list_(pa.float32())
    return pa.table(
        {k: pa.array(list(v), type=vec) if v.ndim == 2 else pa.array(v) for k, v in cols.items()}
    )


def info_common(spec: DatasetSpec, version: str, lengths: Sequence[int], chunks_size: int, feats: dict) -> dict:
    """The keys of ``info.json`` both versions have, in lerobot's order (each version appends its own)."""
    return {
        "codebase_version": version,
        "robot_type": spec.robot_type,
        "total_episodes": len(lengths),
        "total_frames": int(sum(lengths)),
        "total_tasks": len(spec.tasks),
        "chunks_size": chunks_size,
        "fps": spec.fps,
        "splits": {"train": f"0:{len(lengths)}"},
        "features": feats,
    }


class LeRobotWriter:
    """Writes a dataset one episode at a time, so memory stays bounded by one episode's frames
    (50 episodes x 400 frames x 3 cameras at 240x320 would need 13.8 GB held at once).

    ``add_episode`` writes an episode's parquet rows and encodes its frames right away (v3.0: into
    the data/video files it shares with its neighbours, which stay open until full); ``finish``
    writes the metadata. Use as a context manager or call ``finish()`` yourself; a writer that
    never finishes leaves a folder without ``meta/info.json``, which no reader accepts.
    """

    version: ClassVar[str]  # the format a subclass writes
    formats: ClassVar[dict[str, type[LeRobotWriter]]] = {}  # version -> its writer (registered below)

    def __init_subclass__(cls, version: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.version = version
        LeRobotWriter.formats[version] = cls

    def __new__(cls, root: str | Path, version: str, spec: DatasetSpec, *args: Any, **kwargs: Any) -> LeRobotWriter:
        if cls is LeRobotWriter:  # LeRobotWriter(root, version, spec): the writer of that version
            check_version(version)
            cls = LeRobotWriter.formats[version]
        return super().__new__(cls)

    def __init__(
        self,
        root: str | Path,
        version: str,
        spec: DatasetSpec,
        eps_per_data_file: int = 5,
        eps_per_video_file: int = 3,
        files_per_chunk: int = 2,
    ) -> None:
        """The sharding arguments are v3.0's (v2.1 has one file per episode and camera)."""
        self.root, self.spec = Path(root), spec
        (self.root / "meta").mkdir(parents=True)
        self.lengths: list[int] = []
        self.size_hw: tuple[int, int] | None = None
        self.dims: tuple[int, int] | None = None
        # For the dataset's stats.json, exact (lerobot_stats): the numeric columns are small
        # (T x ~30 numbers per episode) and kept; camera pixels are kept as 256-bin histograms.
        self._columns: dict[str, list[np.ndarray]] = {}
        self._pixels: dict[str, PixelHistogram] = {}
        self._rows: list[dict] = []  # the episodes' metadata rows, in each version's layout
        self._finished = False

    @property
    def num_episodes(self) -> int:
        return len(self.lengths)

    def add_episode(self, episode: Episode, frames: Mapping[str, np.ndarray]) -> int:
        """Append one episode (``frames[video_key]``: uint8 (T, H, W, 3)); returns its index."""
        if self._finished:
            raise RuntimeError("add_episode after finish()")
        self._check(episode, frames)
        e, n = len(self.lengths), len(episode.states)
        start = int(sum(self.lengths))
        self.lengths.append(n)
        cols = frame_columns(episode, e, start, self.spec.fps)
        self._write_episode(e, episode, frames, cols, self._episode_stats(cols, frames))
        return e

    def _write_episode(self, e: int, ep: Episode, frames: Mapping[str, np.ndarray], cols: dict, stats: dict) -> None:
        """Write episode ``e``'s rows and frames, and keep its metadata row (the version's layout)."""
        raise NotImplementedError

    def _close_files(self) -> None:
        """Write out and close what is still open (v3.0's shared files)."""

    def _write_meta(self) -> None:
        """Write meta/: info.json, the episodes, tasks and statistics (the version's layout)."""
        raise NotImplementedError

    def _episode_stats(self, cols: dict[str, np.ndarray], frames: Mapping[str, np.ndarray]) -> dict:
        """lerobot's per-episode stats of every feature (lerobot_stats), in info.json's feature order;
        the episode's columns and pixel histograms are kept for the dataset's stats.json."""
        stats: dict[str, dict[str, np.ndarray]] = {}
        for key in ("observation.state", "action"):
            stats[key] = vector_stats(cols[key])
            self._columns.setdefault(key, []).append(cols[key])
        for key in self.spec.video_keys:
            hist = PixelHistogram.of_episode(frames[key])
            stats[key] = hist.stats()
            self._pixels[key] = self._pixels[key] + hist if key in self._pixels else hist
        for key in STANDARD_COLUMNS:
            stats[key] = vector_stats(cols[key])
            self._columns.setdefault(key, []).append(cols[key])
        return stats

    def _dataset_stats(self) -> dict:
        """stats.json: the stats of all frames (numeric columns pooled whole, pixel histograms summed)."""
        out = {key: vector_stats(np.concatenate(self._columns[key])) for key in ("observation.state", "action")}
        out |= {key: self._pixels[key].stats() for key in self.spec.video_keys}
        return out | {key: vector_stats(np.concatenate(self._columns[key])) for key in STANDARD_COLUMNS}

    def _check(self, episode: Episode, frames: Mapping[str, np.ndarray]) -> None:
        n = len(episode.states)
        if n == 0 or len(episode.actions) != n:
            raise ValueError(
                f"episode {len(self.lengths)}: {n} states and {len(episode.actions)} actions"
            )
        if not 0 <= episode.task_index < len(self.spec.tasks):
            raise ValueError(
                f"episode {len(self.lengths)}: task_index {episode.task_index}, expected 0..{len(self.spec.tasks) - 1}"
            )
        dims = (episode.states.shape[1], episode.actions.shape[1])
        if self.dims is None:
            self.dims = dims
        elif dims != self.dims:
            raise ValueError(
                f"episode {len(self.lengths)}: state/action dims {dims}, earlier episodes {self.dims}"
            )
        for key in self.spec.video_keys:
            clip = frames.get(key)
            if clip is None:
                raise ValueError(f"episode {len(self.lengths)}: no frames for video key {key!r}")
            if self.size_hw is None:
                self.size_hw = tuple(clip.shape[1:3])
            if clip.dtype != np.uint8 or clip.shape != (n, *self.size_hw, 3):
                raise ValueError(
                    f"episode {len(self.lengths)}, {key}: expected uint8 ({n}, {self.size_hw[0]}, "
                    f"{self.size_hw[1]}, 3) frames, got {clip.dtype} {clip.shape}"
                )

    def finish(self) -> None:
        """Close the open files and write the metadata (info, episodes, tasks, stats)."""
        if self._finished:
            return
        if not self.lengths:
            raise ValueError("no episodes to write")
        self._close_files()
        self._write_meta()
        for name, content in self.spec.extra_meta.items():
            (self.root / "meta" / name).write_text(json.dumps(content, indent=2))
        self._finished = True

    def close(self) -> None:
        """Release open files without writing metadata (an aborted dataset stays unreadable)."""

    def __enter__(self) -> LeRobotWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.close()


def check_version(version: str) -> None:
    if version not in LeRobotWriter.formats:
        raise ValueError(f"version must be one of {sorted(LeRobotWriter.formats)}, got {version!r}")


def write_lerobot_dataset(
    root: str | Path,
    version: str,
    spec: DatasetSpec,
    episodes: Sequence[Episode],
    frames: Mapping[str, Sequence[np.ndarray]],
    eps_per_data_file: int = 5,
    eps_per_video_file: int = 3,
    files_per_chunk: int = 2,
) -> None:
    """Write ``episodes`` and ``frames[video_key][episode]`` (uint8 (T, H, W, 3)) to a new ``root``."""
    check_version(version)
    if not episodes:
        raise ValueError("no episodes to write")
    with LeRobotWriter(root, version, spec, eps_per_data_file, eps_per_video_file, files_per_chunk) as writer:
        for e, ep in enumerate(episodes):
            writer.add_episode(ep, {key: frames[key][e] for key in spec.video_keys})
