"""Write a LeRobot dataset (v2.1 or v3.0) from arrays and RGB frames: the demo's back end.

Files and metadata follow lerobot's layouts (reference/robotwin_lerobot_npu.md §1.4, §2) closely
enough that lerobot itself and starVLA read them: v2.1 with one parquet and one mp4 per camera per
episode; v3.0 with several episodes per file, data and video files sharded *differently* (so a
reader that uses the data file indices for videos, like starVLA, fails), small chunks (so
``chunk-001`` exists), per-episode ``from_timestamp`` in shared mp4s, ``tasks.parquet`` with the
task text as the pandas index, and aggregated ``stats.json`` with quantiles.
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

from dit4dit_npu.data.video import write_mp4

CODEC_NAMES = {"libx264": "h264", "libsvtav1": "av1", "libaom-av1": "av1", "mpeg4": "mpeg4"}


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


def _frame_table(ep: Episode, episode_index: int, start: int, fps: int) -> pa.Table:
    n = len(ep.states)
    vec = pa.list_(pa.float32())
    return pa.table(
        {
            "observation.state": pa.array(list(ep.states.astype(np.float32)), type=vec),
            "action": pa.array(list(ep.actions.astype(np.float32)), type=vec),
            "timestamp": pa.array((np.arange(n) / fps).astype(np.float32)),
            "frame_index": pa.array(np.arange(n, dtype=np.int64)),
            "episode_index": pa.array(np.full(n, episode_index, np.int64)),
            "index": pa.array(np.arange(start, start + n, dtype=np.int64)),
            "task_index": pa.array(np.full(n, ep.task_index, np.int64)),
        }
    )


def _stats(x: np.ndarray, quantiles: bool) -> dict:
    x = np.asarray(x, np.float64).reshape(len(x), -1)
    out = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0), "count": [len(x)]}
    if quantiles:
        for q in (1, 10, 50, 90, 99):
            out[f"q{q:02d}"] = np.quantile(x, q / 100, axis=0)
    return {k: np.asarray(v).tolist() for k, v in out.items()}


def _info(spec: DatasetSpec, version: str, episodes: Sequence[Episode], size_hw, chunks_size: int) -> dict:
    info = {
        "codebase_version": version,
        "robot_type": spec.robot_type,
        "total_episodes": len(episodes),
        "total_frames": sum(len(e.states) for e in episodes),
        "total_tasks": len(spec.tasks),
        "chunks_size": chunks_size,
        "fps": spec.fps,
        "splits": {"train": f"0:{len(episodes)}"},
        "features": _features(
            spec, size_hw, version, episodes[0].states.shape[1], episodes[0].actions.shape[1]
        ),
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
        "total_videos": len(episodes) * len(spec.video_keys),
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
    }


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
    root = Path(root)
    if version not in ("v2.1", "v3.0"):
        raise ValueError(f"version must be 'v2.1' or 'v3.0', got {version!r}")
    if not episodes:
        raise ValueError("no episodes to write")
    size_hw = tuple(frames[spec.video_keys[0]][0].shape[1:3])
    (root / "meta").mkdir(parents=True)
    if version == "v3.0":
        _write_v3(
            root, spec, episodes, frames, size_hw, eps_per_data_file, eps_per_video_file, files_per_chunk
        )
    else:
        _write_v21(root, spec, episodes, frames, size_hw)
    for name, content in spec.extra_meta.items():
        (root / "meta" / name).write_text(json.dumps(content, indent=2))


def _write_v21(root: Path, spec: DatasetSpec, episodes, frames, size_hw) -> None:
    start = 0
    ep_lines, stat_lines = [], []
    for e, ep in enumerate(episodes):
        path = root / f"data/chunk-000/episode_{e:06d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(_frame_table(ep, e, start, spec.fps), path)
        start += len(ep.states)
        for key in spec.video_keys:
            vpath = root / f"videos/chunk-000/{key}/episode_{e:06d}.mp4"
            vpath.parent.mkdir(parents=True, exist_ok=True)
            write_mp4(vpath, frames[key][e], spec.fps, codec=spec.codec, gop=spec.gop)
        ep_lines.append({"episode_index": e, "tasks": [spec.tasks[ep.task_index]], "length": len(ep.states)})
        stats = {"observation.state": _stats(ep.states, False), "action": _stats(ep.actions, False)}
        stat_lines.append({"episode_index": e, "stats": stats})
    meta = root / "meta"
    (meta / "info.json").write_text(json.dumps(_info(spec, "v2.1", episodes, size_hw, 1000), indent=2))
    (meta / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in ep_lines))
    (meta / "episodes_stats.jsonl").write_text("".join(json.dumps(x) + "\n" for x in stat_lines))
    (meta / "tasks.jsonl").write_text(
        "".join(json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(spec.tasks))
    )


def _write_v3(root: Path, spec, episodes, frames, size_hw, per_data: int, per_video: int, chunk: int) -> None:
    lengths = [len(e.states) for e in episodes]
    starts = [int(s) for s in np.cumsum([0] + lengths[:-1])]
    rows: list[dict] = [{} for _ in episodes]

    def groups(per_file: int):
        for n, f0 in enumerate(range(0, len(episodes), per_file)):
            yield n // chunk, n % chunk, range(f0, min(f0 + per_file, len(episodes)))

    for c, f, group in groups(per_data):
        path = root / f"data/chunk-{c:03d}/file-{f:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(
            pa.concat_tables([_frame_table(episodes[e], e, starts[e], spec.fps) for e in group]), path
        )
        for e in group:
            rows[e] |= {"data/chunk_index": c, "data/file_index": f}
    for key in spec.video_keys:
        for c, f, group in groups(per_video):
            path = root / f"videos/{key}/chunk-{c:03d}/file-{f:03d}.mp4"
            path.parent.mkdir(parents=True, exist_ok=True)
            clip = np.concatenate([frames[key][e] for e in group])
            write_mp4(path, clip, spec.fps, codec=spec.codec, gop=spec.gop)
            t = 0.0
            for e in group:
                rows[e] |= {
                    f"videos/{key}/chunk_index": c,
                    f"videos/{key}/file_index": f,
                    f"videos/{key}/from_timestamp": t,
                    f"videos/{key}/to_timestamp": t + lengths[e] / spec.fps,
                }
                t += lengths[e] / spec.fps
    for e, ep in enumerate(episodes):
        rows[e] |= {
            "episode_index": e,
            "tasks": [spec.tasks[ep.task_index]],
            "length": lengths[e],
            "dataset_from_index": starts[e],
            "dataset_to_index": starts[e] + lengths[e],
            "meta/episodes/chunk_index": 0,
            "meta/episodes/file_index": 0,
        }
        for feat, x in (("observation.state", ep.states), ("action", ep.actions)):
            for name, v in _stats(x, False).items():
                rows[e][f"stats/{feat}/{name}"] = v
    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), root / "meta/episodes/chunk-000/file-000.parquet")
    # pandas' layout: the task text is the (unnamed) DataFrame index.
    tasks = pa.table(
        {"task_index": pa.array(range(len(spec.tasks)), pa.int64()), "__index_level_0__": list(spec.tasks)}
    )
    pandas_meta = {"index_columns": ["__index_level_0__"], "columns": [], "pandas_version": "2.2.0"}
    pq.write_table(
        tasks.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()}),
        root / "meta/tasks.parquet",
    )
    stats = {
        "observation.state": _stats(np.concatenate([e.states for e in episodes]), True),
        "action": _stats(np.concatenate([e.actions for e in episodes]), True),
    }
    meta = root / "meta"
    (meta / "stats.json").write_text(json.dumps(stats, indent=2))
    (meta / "info.json").write_text(json.dumps(_info(spec, "v3.0", episodes, size_hw, chunk), indent=2))
