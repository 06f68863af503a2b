"""Write a LeRobot dataset (v2.1 or v3.0) from arrays and RGB frames: the demo's back end.

Files and metadata follow lerobot's layouts (reference/robotwin_lerobot_npu.md §1.4, §2): lerobot
0.4.4's LeRobotDataset, v2.1->v3.0 converter, visualizer and trainer accept them unchanged
(``scripts/interop_check.sh`` checks with the real library), and starVLA reads them. v2.1: one
parquet and one mp4 per camera per episode, ``episodes_stats.jsonl``; v3.0: several episodes per
file, data and video files sharded *differently* (so a reader that uses the data file indices for
videos, like starVLA, fails), small chunks (so ``chunk-001`` exists), per-episode
``from_timestamp`` in shared mp4s, ``tasks.parquet`` with the task text as its pandas index, and
``stats.json``. Statistics (``lerobot_stats``) cover every feature, cameras included, per episode
and for the dataset, as lerobot's ``compute_episode_stats`` lays them out.

``LeRobotWriter`` appends one episode at a time (bounded memory: simulation demos);
``write_lerobot_dataset`` writes arrays already in memory through it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dit4dit_npu.data.lerobot_stats import PixelHistogram, to_json, vector_stats
from dit4dit_npu.data.meta import STANDARD_COLUMNS
from dit4dit_npu.data.video import Mp4Writer, write_mp4

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


def _check_version(version: str) -> None:
    if version not in ("v2.1", "v3.0"):
        raise ValueError(f"version must be 'v2.1' or 'v3.0', got {version!r}")


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


def _features(spec: DatasetSpec, size_hw: tuple[int, int], version: str, sd: int, ad: int) -> dict:
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
    if version == "v3.0":
        for f in feats.values():
            if f["dtype"] != "video":
                f["fps"] = spec.fps
    return feats


def _frame_columns(ep: Episode, episode_index: int, start: int, fps: int) -> dict[str, np.ndarray]:
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


def _frame_table(cols: dict[str, np.ndarray]) -> pa.Table:
    vec = pa.list_(pa.float32())
    return pa.table(
        {k: pa.array(list(v), type=vec) if v.ndim == 2 else pa.array(v) for k, v in cols.items()}
    )


def _tasks_table(tasks: Sequence[str]) -> pa.Table:
    """``meta/tasks.parquet`` as ``pd.DataFrame({"task_index": ...}, index=tasks).to_parquet()`` writes it.

    lerobot reads it with ``pd.read_parquet`` and looks tasks up by the DataFrame's index, so the
    pandas metadata must describe every column: pyarrow rebuilds the index from it, and a column it
    does not list fails with ``KeyError: '__index_level_0__'``. The layout is pandas 2.2's (plain
    ``string`` values), which pandas 2 and 3 both read; pandas itself is not needed to write it.
    """
    index = "__index_level_0__"
    table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()), index: pa.array(list(tasks), pa.string())})
    text = {"pandas_type": "unicode", "numpy_type": "object"}
    pandas_meta = {
        "index_columns": [index],
        "column_indexes": [{"name": None, "field_name": None, **text, "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64", "metadata": None},
            {"name": None, "field_name": index, **text, "metadata": None},
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


def _info(
    spec: DatasetSpec, version: str, lengths: Sequence[int], dims: tuple[int, int], size_hw, chunks_size: int
) -> dict:
    info = {
        "codebase_version": version,
        "robot_type": spec.robot_type,
        "total_episodes": len(lengths),
        "total_frames": int(sum(lengths)),
        "total_tasks": len(spec.tasks),
        "chunks_size": chunks_size,
        "fps": spec.fps,
        "splits": {"train": f"0:{len(lengths)}"},
        "features": _features(spec, size_hw, version, *dims),
    }
    if version == "v3.0":
        return info | {
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200,
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        }
    return info | {
        "total_chunks": 1,
        "total_videos": len(lengths) * len(spec.video_keys),
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
    }


class LeRobotWriter:
    """Writes a dataset one episode at a time, so memory stays bounded by one episode's frames
    (50 episodes x 400 frames x 3 cameras at 240x320 would need 13.8 GB held at once).

    ``add_episode`` writes an episode's parquet rows and encodes its frames right away (v3.0: into
    the data/video files it shares with its neighbours, which stay open until full); ``finish``
    writes the metadata. Use as a context manager or call ``finish()`` yourself; a writer that
    never finishes leaves a folder without ``meta/info.json``, which no reader accepts.
    """

    def __init__(
        self,
        root: str | Path,
        version: str,
        spec: DatasetSpec,
        eps_per_data_file: int = 5,
        eps_per_video_file: int = 3,
        files_per_chunk: int = 2,
    ) -> None:
        _check_version(version)
        self.root, self.version, self.spec = Path(root), version, spec
        self.per_data, self.per_video, self.chunk = eps_per_data_file, eps_per_video_file, files_per_chunk
        (self.root / "meta").mkdir(parents=True)
        self.lengths: list[int] = []
        self.size_hw: tuple[int, int] | None = None
        self.dims: tuple[int, int] | None = None
        # For the dataset's stats.json, exact (lerobot_stats): the numeric columns are small
        # (T x ~30 numbers per episode) and kept; camera pixels are kept as 256-bin histograms.
        self._columns: dict[str, list[np.ndarray]] = {}
        self._pixels: dict[str, PixelHistogram] = {}
        self._rows: list[dict] = []  # v2.1: episodes.jsonl lines; v3.0: meta/episodes rows
        self._stat_lines: list[dict] = []  # v2.1 episodes_stats.jsonl
        self._data_tables: list[pa.Table] = []  # v3.0: rows of the data file being filled
        self._videos: dict[str, Mp4Writer] = {}  # v3.0: the open shared mp4 of each camera
        self._video_t = 0.0
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
        cols = _frame_columns(episode, e, start, self.spec.fps)
        stats = self._episode_stats(cols, frames)
        if self.version == "v3.0":
            self._add_v3(e, episode, frames, cols, stats)
        else:
            self._add_v21(e, episode, frames, cols, stats)
        return e

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

    def _add_v21(self, e: int, ep: Episode, frames: Mapping[str, np.ndarray], cols: dict, stats: dict) -> None:
        path = self.root / f"data/chunk-000/episode_{e:06d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(_frame_table(cols), path)
        for key in self.spec.video_keys:
            vpath = self.root / f"videos/chunk-000/{key}/episode_{e:06d}.mp4"
            vpath.parent.mkdir(parents=True, exist_ok=True)
            write_mp4(vpath, frames[key], self.spec.fps, codec=self.spec.codec, gop=self.spec.gop)
        task = self.spec.tasks[ep.task_index]
        self._rows.append({"episode_index": e, "tasks": [task], "length": len(ep.states)})
        self._stat_lines.append({"episode_index": e, "stats": to_json(stats)})

    def _file_of(self, e: int, per_file: int) -> tuple[int, int]:
        """(chunk, file) index of episode ``e`` when files hold ``per_file`` episodes each."""
        n = e // per_file
        return n // self.chunk, n % self.chunk

    def _add_v3(self, e: int, ep: Episode, frames: Mapping[str, np.ndarray], cols: dict, stats: dict) -> None:
        n, fps, start = len(ep.states), self.spec.fps, int(cols["index"][0])
        c, f = self._file_of(e, self.per_data)
        self._data_tables.append(_frame_table(cols))
        row: dict = {"data/chunk_index": c, "data/file_index": f}
        if (e + 1) % self.per_data == 0:
            self._flush_data(c, f)
        vc, vf = self._file_of(e, self.per_video)
        if e % self.per_video == 0:  # first episode of a new shared video file
            self._close_videos()
            for key in self.spec.video_keys:
                path = self.root / f"videos/{key}/chunk-{vc:03d}/file-{vf:03d}.mp4"
                path.parent.mkdir(parents=True, exist_ok=True)
                self._videos[key] = Mp4Writer(
                    path, self.size_hw, fps, codec=self.spec.codec, gop=self.spec.gop
                )
            self._video_t = 0.0
        for key in self.spec.video_keys:
            self._videos[key].write(frames[key])
            row |= {
                f"videos/{key}/chunk_index": vc,
                f"videos/{key}/file_index": vf,
                f"videos/{key}/from_timestamp": self._video_t,
                f"videos/{key}/to_timestamp": self._video_t + n / fps,
            }
        self._video_t += n / fps
        if (e + 1) % self.per_video == 0:
            self._close_videos()
        row |= {
            "episode_index": e,
            "tasks": [self.spec.tasks[ep.task_index]],
            "length": n,
            "dataset_from_index": start,
            "dataset_to_index": start + n,
            "meta/episodes/chunk_index": 0,
            "meta/episodes/file_index": 0,
        }
        for feat, per in to_json(stats).items():
            row |= {f"stats/{feat}/{name}": v for name, v in per.items()}
        self._rows.append(row)

    def _flush_data(self, c: int, f: int) -> None:
        if not self._data_tables:
            return
        path = self.root / f"data/chunk-{c:03d}/file-{f:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.concat_tables(self._data_tables), path)
        self._data_tables = []

    def _close_videos(self) -> None:
        for writer in self._videos.values():
            writer.close()
        self._videos = {}

    def finish(self) -> None:
        """Close the open files and write the metadata (info, episodes, tasks, stats)."""
        if self._finished:
            return
        if not self.lengths:
            raise ValueError("no episodes to write")
        if self.version == "v3.0":
            self._flush_data(*self._file_of(len(self.lengths) - 1, self.per_data))
            self._close_videos()
            self._finish_v3()
        else:
            self._finish_v21()
        for name, content in self.spec.extra_meta.items():
            (self.root / "meta" / name).write_text(json.dumps(content, indent=2))
        self._finished = True

    def close(self) -> None:
        """Release open files without writing metadata (an aborted dataset stays unreadable)."""
        self._close_videos()
        self._data_tables = []

    def __enter__(self) -> LeRobotWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.close()

    def _finish_v21(self) -> None:
        meta = self.root / "meta"
        info = _info(self.spec, "v2.1", self.lengths, self.dims, self.size_hw, 1000)
        (meta / "info.json").write_text(json.dumps(info, indent=2))
        (meta / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in self._rows))
        (meta / "episodes_stats.jsonl").write_text("".join(json.dumps(x) + "\n" for x in self._stat_lines))
        (meta / "tasks.jsonl").write_text(
            "".join(json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(self.spec.tasks))
        )

    def _finish_v3(self) -> None:
        meta = self.root / "meta"
        (meta / "episodes/chunk-000").mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(self._rows), meta / "episodes/chunk-000/file-000.parquet")
        pq.write_table(_tasks_table(self.spec.tasks), meta / "tasks.parquet")
        (meta / "stats.json").write_text(json.dumps(to_json(self._dataset_stats()), indent=2))
        info = _info(self.spec, "v3.0", self.lengths, self.dims, self.size_hw, self.chunk)
        (meta / "info.json").write_text(json.dumps(info, indent=2))


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
    _check_version(version)
    if not episodes:
        raise ValueError("no episodes to write")
    with LeRobotWriter(root, version, spec, eps_per_data_file, eps_per_video_file, files_per_chunk) as writer:
        for e, ep in enumerate(episodes):
            writer.add_episode(ep, {key: frames[key][e] for key in spec.video_keys})
