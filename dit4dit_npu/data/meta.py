"""LeRobot dataset metadata (format v2.0/v2.1 and v3.0), read natively, never written.

Mirrors ``lerobot.datasets.LeRobotDatasetMetadata``: ``fps``, ``features``, ``camera_keys``,
``video_keys``, ``episodes``, ``tasks``, ``stats``, ``info``, ``total_episodes``,
``total_frames``, ``get_data_file_path``, ``get_video_file_path``. The two formats differ in
where things live; this class hides that:

- v2.x: one parquet + one mp4 per camera per episode; ``episodes.jsonl``, ``tasks.jsonl``,
  ``episodes_stats.jsonl`` (v2.1) or ``stats.json`` (v2.0).
- v3.0: many episodes per file; ``meta/episodes/*/*.parquet`` gives per-episode data/video file
  indices and, per camera, ``from_timestamp`` (frames are at ``from_timestamp + timestamp`` in the
  shared mp4; starVLA used the *data* file indices for videos, a bug we do not copy);
  ``meta/tasks.parquet`` holds the task text in its (pandas) index column.

``episodes`` is a dict ``{episode_index: {...}}`` with, for both formats: ``episode_index``,
``tasks``, ``length``, ``dataset_from_index``, ``dataset_to_index``, ``data_path`` and
``videos`` = ``{video_key: {"path": relative Path, "from_timestamp": float}}``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dit4dit_npu.data.errors import DatasetError
from dit4dit_npu.transforms.feature_stats import pool_moments

SUPPORTED_VERSIONS = ("v2.0", "v2.1", "v3.0")
# The bookkeeping columns every LeRobot frame has (after its features), in lerobot's order.
STANDARD_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
STAT_NAMES = ("min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99")


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise DatasetError(f"missing {path}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"malformed JSON in {path}: {e}") from None


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise DatasetError(f"missing {path}")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DatasetError(f"malformed JSON on line {n} of {path}: {e}") from None
    return rows


def read_parquet(path: Path, columns: list[str] | None = None) -> pa.Table:
    if not path.is_file():
        raise DatasetError(f"missing parquet file {path}")
    try:
        return pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(
            f"cannot read parquet {path} (truncated/corrupt, or missing columns {columns}): {e}"
        ) from None


def _stats_to_numpy(stats: dict) -> dict[str, dict[str, np.ndarray]]:
    return {
        feat: {name: np.asarray(v, dtype=np.float64) for name, v in per.items() if name in STAT_NAMES}
        for feat, per in stats.items()
        if isinstance(per, dict)
    }


def aggregate_episode_stats(
    per_episode: list[dict[str, dict[str, np.ndarray]]],
) -> dict[str, dict[str, np.ndarray]]:
    """Pool per-episode min/max/mean/std/count into dataset stats (lerobot's aggregate_stats)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    keys = {k for s in per_episode for k in s}
    for key in sorted(keys):
        parts = [
            s[key] for s in per_episode if key in s and {"min", "max", "mean", "std", "count"} <= set(s[key])
        ]
        if not parts:
            continue
        counts = np.array([float(np.asarray(p["count"]).reshape(-1)[0]) for p in parts])
        mean, std = pool_moments(counts, np.stack([p["mean"] for p in parts]), np.stack([p["std"] for p in parts]))
        out[key] = {
            "min": np.min(np.stack([p["min"] for p in parts]), 0),
            "max": np.max(np.stack([p["max"] for p in parts]), 0),
            "mean": mean,
            "std": std,
            "count": np.array([counts.sum()]),
        }
    return out


class LeRobotDatasetMetadata:
    """Metadata of a local LeRobot dataset folder (v2.0, v2.1 or v3.0)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise DatasetError(f"dataset folder not found: {self.root}")
        info_path = self.root / "meta" / "info.json"
        self.info: dict[str, Any] = read_json(info_path)
        if not isinstance(self.info, dict):
            raise DatasetError(f"{info_path}: expected a JSON object")
        version = self.info.get("codebase_version")
        if version not in SUPPORTED_VERSIONS:
            raise DatasetError(
                f"{info_path}: unknown codebase_version {version!r}, expected one of {list(SUPPORTED_VERSIONS)}"
            )
        self.codebase_version: str = version
        for key in ("fps", "features", "data_path"):
            if key not in self.info:
                raise DatasetError(f"{info_path}: missing key {key!r}")
        fps = self.info["fps"]
        # bool is an int to Python; "30" or NaN would pass float() and fail far from here.
        if isinstance(fps, bool) or not isinstance(fps, int | float) or not math.isfinite(fps) or fps <= 0:
            raise DatasetError(f"{info_path}: fps must be a number > 0, got {fps!r}")
        self.fps: float = float(fps)
        self.features: dict[str, dict] = self.info["features"]
        self.video_keys = [k for k, f in self.features.items() if f.get("dtype") == "video"]
        self.image_keys = [k for k, f in self.features.items() if f.get("dtype") == "image"]
        self.camera_keys = self.video_keys + self.image_keys
        if self.video_keys and "video_path" not in self.info:
            raise DatasetError(f"{info_path}: has video features {self.video_keys} but no 'video_path'")
        if self.is_v3:
            self.tasks = self._load_tasks_v3()
            self.episodes, episode_stats = self._load_episodes_v3()
        else:
            self.tasks = self._load_tasks_v2()
            self.episodes, episode_stats = self._load_episodes_v2()
        self.stats = self._load_stats(episode_stats)

    # -- public, lerobot-like ---------------------------------------------------------------

    @property
    def is_v3(self) -> bool:
        return self.codebase_version == "v3.0"

    @property
    def robot_type(self) -> str | None:
        return self.info.get("robot_type")

    @property
    def total_episodes(self) -> int:
        return len(self.episodes)

    @property
    def total_frames(self) -> int:
        return sum(e["length"] for e in self.episodes.values())

    @property
    def total_tasks(self) -> int:
        return len(self.tasks)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(f.get("shape", ())) for k, f in self.features.items()}

    @property
    def names(self) -> dict[str, Any]:
        return {k: f.get("names") for k, f in self.features.items()}

    def episode(self, episode_index: int) -> dict[str, Any]:
        try:
            return self.episodes[int(episode_index)]
        except KeyError:
            raise DatasetError(
                f"{self.root}: no episode {episode_index} (episodes are {self._episode_range()})"
            ) from None

    def get_data_file_path(self, episode_index: int) -> Path:
        return self.episode(episode_index)["data_path"]

    def get_video_file_path(self, episode_index: int, video_key: str) -> Path:
        return self.episode(episode_index)["videos"][video_key]["path"]

    def video_from_timestamp(self, episode_index: int, video_key: str) -> float:
        return self.episode(episode_index)["videos"][video_key]["from_timestamp"]

    def video_size(self, video_key: str) -> tuple[int, int] | None:
        """(H, W) declared in info.json for a camera (names say which axis is which)."""
        f = self.features[video_key]
        shape, names = f.get("shape"), f.get("names")
        if not shape or len(shape) != 3:
            return None
        if isinstance(names, list) and "height" in names and "width" in names:
            return int(shape[names.index("height")]), int(shape[names.index("width")])
        if shape[0] in (1, 3, 4):  # channel-first
            return int(shape[1]), int(shape[2])
        return int(shape[0]), int(shape[1])

    # -- loading ----------------------------------------------------------------------------

    def _episode_range(self) -> str:
        keys = sorted(self.episodes)
        return f"{keys[0]}..{keys[-1]}" if keys else "none"

    def _load_tasks_v2(self) -> dict[int, str]:
        path = self.root / "meta" / "tasks.jsonl"
        try:
            return {int(r["task_index"]): str(r["task"]) for r in read_jsonl(path)}
        except (KeyError, TypeError, ValueError):
            raise DatasetError(f"{path}: each line needs 'task_index' and 'task'") from None

    def _load_tasks_v3(self) -> dict[int, str]:
        path = self.root / "meta" / "tasks.parquet"
        table = read_parquet(path)
        names = table.column_names
        # pandas writes the DataFrame index (the task text) as a named or "__index_level_0__" column.
        text_col = "task" if "task" in names else None
        if text_col is None:
            meta = table.schema.metadata or {}
            pandas_meta = json.loads(meta.get(b"pandas", b"{}") or b"{}")
            idx = [c for c in pandas_meta.get("index_columns", []) if isinstance(c, str)]
            text_col = idx[0] if idx else ("__index_level_0__" if "__index_level_0__" in names else None)
        if text_col is None or "task_index" not in names:
            raise DatasetError(
                f"{path}: expected a 'task_index' column and the task text (index or 'task' column)"
            )
        return {
            int(i): str(t)
            for i, t in zip(table.column("task_index").to_pylist(), table.column(text_col).to_pylist())
        }

    def _load_episodes_v2(self) -> tuple[dict[int, dict], list[dict]]:
        path = self.root / "meta" / "episodes.jsonl"
        chunks_size = int(self.info.get("chunks_size", 1000))
        episodes: dict[int, dict] = {}
        start = 0
        try:
            rows = sorted(read_jsonl(path), key=lambda r: int(r["episode_index"]))
            for r in rows:
                ep, length = int(r["episode_index"]), int(r["length"])
                fmt = {"episode_chunk": ep // chunks_size, "episode_index": ep}
                episodes[ep] = {
                    "episode_index": ep,
                    "tasks": list(r.get("tasks", [])),
                    "length": length,
                    "dataset_from_index": start,
                    "dataset_to_index": start + length,
                    "data_path": Path(self.info["data_path"].format(**fmt)),
                    "videos": {
                        k: {
                            "path": Path(self.info["video_path"].format(video_key=k, **fmt)),
                            "from_timestamp": 0.0,
                        }
                        for k in self.video_keys
                    },
                }
                start += length
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{path}: each line needs 'episode_index' and 'length' ({e})") from None
        stats: list[dict] = []
        stats_path = self.root / "meta" / "episodes_stats.jsonl"
        if stats_path.is_file():
            stats = [_stats_to_numpy(r.get("stats", {})) for r in read_jsonl(stats_path)]
        return episodes, stats

    def _load_episodes_v3(self) -> tuple[dict[int, dict], list[dict]]:
        folder = self.root / "meta" / "episodes"
        files = sorted(folder.glob("chunk-*/file-*.parquet"))
        if not files:
            raise DatasetError(f"missing episode metadata: no {folder}/chunk-*/file-*.parquet")
        episodes: dict[int, dict] = {}
        stats: list[dict] = []
        for f in files:
            table = read_parquet(f)
            for r in table.to_pylist():
                try:
                    ep = int(r["episode_index"])
                    data_path = self.info["data_path"].format(
                        chunk_index=int(r["data/chunk_index"]), file_index=int(r["data/file_index"])
                    )
                    videos = {
                        k: {
                            "path": Path(
                                self.info["video_path"].format(
                                    video_key=k,
                                    chunk_index=int(r[f"videos/{k}/chunk_index"]),
                                    file_index=int(r[f"videos/{k}/file_index"]),
                                )
                            ),
                            "from_timestamp": float(r[f"videos/{k}/from_timestamp"]),
                        }
                        for k in self.video_keys
                    }
                    episodes[ep] = {
                        "episode_index": ep,
                        "tasks": list(r.get("tasks") or []),
                        "length": int(r["length"]),
                        "dataset_from_index": int(r["dataset_from_index"]),
                        "dataset_to_index": int(r["dataset_to_index"]),
                        "data_path": Path(data_path),
                        "videos": videos,
                    }
                except (KeyError, TypeError, ValueError) as e:
                    raise DatasetError(
                        f"{f}: episode row lacks column {e} (expected LeRobot v3.0 episodes)"
                    ) from None
                per: dict[str, dict[str, np.ndarray]] = {}
                for col, v in r.items():
                    if col.startswith("stats/") and v is not None:
                        feat, _, name = col[len("stats/") :].rpartition("/")
                        if name in STAT_NAMES:
                            per.setdefault(feat, {})[name] = np.asarray(v, dtype=np.float64)
                stats.append(per)
        return dict(sorted(episodes.items())), stats

    def _load_stats(self, episode_stats: list[dict]) -> dict[str, dict[str, np.ndarray]]:
        path = self.root / "meta" / "stats.json"
        if path.is_file():
            return _stats_to_numpy(read_json(path))
        return aggregate_episode_stats(episode_stats) if episode_stats else {}
