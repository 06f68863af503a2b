"""LeRobot v3.0: several episodes per file, data and video files sharded *differently* (so a
reader that uses the data file indices for videos, like starVLA, fails), small chunks (so
``chunk-001`` exists), per-episode ``from_timestamp`` in shared mp4s, ``meta/episodes`` parquet
rows with every feature's statistics, ``tasks.parquet`` with the task text as its pandas index,
and ``stats.json``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dit4dit_npu.data.lerobot_stats import to_json
from dit4dit_npu.data.video import Mp4Writer
from dit4dit_npu.data.writer.common import (
    DatasetSpec,
    Episode,
    LeRobotWriter,
    features,
    frame_table,
    info_common,
)


class V30Writer(LeRobotWriter, version="v3.0"):
    def __init__(
        self,
        root,
        version: str,
        spec: DatasetSpec,
        eps_per_data_file: int = 5,
        eps_per_video_file: int = 3,
        files_per_chunk: int = 2,
    ) -> None:
        super().__init__(root, version, spec)
        self.per_data, self.per_video, self.chunk = eps_per_data_file, eps_per_video_file, files_per_chunk
        self._data_tables: list[pa.Table] = []  # rows of the data file being filled
        self._videos: dict[str, Mp4Writer] = {}  # the open shared mp4 of each camera
        self._video_t = 0.0

    def _file_of(self, e: int, per_file: int) -> tuple[int, int]:
        """(chunk, file) index of episode ``e`` when files hold ``per_file`` episodes each."""
        n = e // per_file
        return n // self.chunk, n % self.chunk

    def _write_episode(self, e: int, ep: Episode, frames: Mapping[str, np.ndarray], cols: dict, stats: dict) -> None:
        n, fps, start = len(ep.states), self.spec.fps, int(cols["index"][0])
        c, f = self._file_of(e, self.per_data)
        self._data_tables.append(frame_table(cols))
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

    def _close_files(self) -> None:
        self._flush_data(*self._file_of(len(self.lengths) - 1, self.per_data))
        self._close_videos()

    def close(self) -> None:
        self._close_videos()
        self._data_tables = []

    def _write_meta(self) -> None:
        meta = self.root / "meta"
        (meta / "episodes/chunk-000").mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(self._rows), meta / "episodes/chunk-000/file-000.parquet")
        pq.write_table(tasks_table(self.spec.tasks), meta / "tasks.parquet")
        (meta / "stats.json").write_text(json.dumps(to_json(self._dataset_stats()), indent=2))
        feats = features(self.spec, self.size_hw, *self.dims)
        for f in feats.values():
            if f["dtype"] != "video":
                f["fps"] = self.spec.fps
        info = info_common(self.spec, "v3.0", self.lengths, self.chunk, feats) | {
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200,
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        }
        (meta / "info.json").write_text(json.dumps(info, indent=2))


def tasks_table(tasks: Sequence[str]) -> pa.Table:
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
