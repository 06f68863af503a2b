"""LeRobot v2.1 (the public RoboTwin conversions' format): one parquet and one mp4 per camera per
episode, ``episodes.jsonl``, ``episodes_stats.jsonl`` and ``tasks.jsonl``."""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
import pyarrow.parquet as pq

from dit4dit_npu.data.lerobot_stats import to_json
from dit4dit_npu.data.video import write_mp4
from dit4dit_npu.data.writer.common import Episode, LeRobotWriter, features, frame_table, info_common


class V21Writer(LeRobotWriter, version="v2.1"):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._stat_lines: list[dict] = []  # episodes_stats.jsonl

    def _write_episode(self, e: int, ep: Episode, frames: Mapping[str, np.ndarray], cols: dict, stats: dict) -> None:
        path = self.root / f"data/chunk-000/episode_{e:06d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(frame_table(cols), path)
        for key in self.spec.video_keys:
            vpath = self.root / f"videos/chunk-000/{key}/episode_{e:06d}.mp4"
            vpath.parent.mkdir(parents=True, exist_ok=True)
            write_mp4(vpath, frames[key], self.spec.fps, codec=self.spec.codec, gop=self.spec.gop)
        task = self.spec.tasks[ep.task_index]
        self._rows.append({"episode_index": e, "tasks": [task], "length": len(ep.states)})
        self._stat_lines.append({"episode_index": e, "stats": to_json(stats)})

    def _write_meta(self) -> None:
        meta = self.root / "meta"
        info = info_common(self.spec, "v2.1", self.lengths, 1000, features(self.spec, self.size_hw, *self.dims)) | {
            "total_chunks": 1,
            "total_videos": len(self.lengths) * len(self.spec.video_keys),
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
        }
        (meta / "info.json").write_text(json.dumps(info, indent=2))
        (meta / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in self._rows))
        (meta / "episodes_stats.jsonl").write_text("".join(json.dumps(x) + "\n" for x in self._stat_lines))
        (meta / "tasks.jsonl").write_text(
            "".join(json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(self.spec.tasks))
        )
