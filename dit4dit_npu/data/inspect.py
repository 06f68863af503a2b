"""Inspect and validate a LeRobot dataset folder (read-only).

    python -m dit4dit_npu.data.inspect ROOT            # summary: episodes, fps, cameras, tasks, dims, stats
    python -m dit4dit_npu.data.inspect ROOT --check    # + validation; exit 1 listing every problem
    python -m dit4dit_npu.data.inspect ROOT --check --decode      # + decode every video frame

``--check`` does not stop at the first problem: it reports, each with its file, the episode
index against info.json's totals and the data files on disk, parquet rows vs episode lengths,
frame_index/timestamps (monotonic, 1/fps apart), NaN/inf in numeric columns, vector widths
against info.json, unknown task indices, missing/unreadable videos, video frame counts,
durations and sizes, and an unknown format version. Videos are demuxed; with ``--decode`` (the
default for datasets with at most DECODE_BY_DEFAULT_BYTES of video) every frame is also decoded,
so a corrupt payload is found before training rather than at step N.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from dit4dit_npu.data.errors import DatasetError
from dit4dit_npu.data.lerobot import STANDARD_COLUMNS, _column_to_numpy
from dit4dit_npu.data.meta import LeRobotDatasetMetadata, read_parquet
from dit4dit_npu.data.validate import index_problems, table_problems, width_problems
from dit4dit_npu.data.video import decode_problem, probe_video

# Decoding every frame costs about a minute per GB of h264 on one core: on by default below this.
DECODE_BY_DEFAULT_BYTES = 1 << 30


def _numeric_keys(meta: LeRobotDatasetMetadata) -> list[str]:
    keys = [k for k, f in meta.features.items() if f.get("dtype") not in ("video", "image", "string")]
    return keys + [k for k in STANDARD_COLUMNS if k not in keys]


def _episode_groups(meta: LeRobotDatasetMetadata, kind: str, key: str = "") -> dict[Path, list[dict]]:
    """File -> its episodes in file order (one per file in v2.x, several in v3.0)."""
    groups: dict[Path, list[dict]] = {}
    for ep in meta.episodes.values():
        path = ep["data_path"] if kind == "data" else ep["videos"][key]["path"]
        groups.setdefault(meta.root / path, []).append(ep)
    for eps in groups.values():
        eps.sort(
            key=lambda e: e["videos"][key]["from_timestamp"] if kind == "video" else e["dataset_from_index"]
        )
    return groups


def _check_data(meta: LeRobotDatasetMetadata, tol: float) -> list[str]:
    problems: list[str] = []
    keys = _numeric_keys(meta)
    groups = _episode_groups(meta, "data")
    for path, eps in tqdm(groups.items(), desc="check data", total=len(groups), unit="file", disable=None):
        try:
            table = read_parquet(path)
        except DatasetError as e:
            problems.append(str(e))
            continue
        missing = [k for k in keys if k not in table.column_names]
        if missing:
            problems.append(f"{path}: missing columns {missing}")
            continue
        try:
            cols = {k: _column_to_numpy(table.column(k), k, path) for k in keys}
        except DatasetError as e:
            problems.append(str(e))
            continue
        problems += width_problems(path, cols, meta.features)
        problems += table_problems(path, cols, eps, meta.fps, tol, meta.tasks, set(meta.episodes))
    return problems


def _check_videos(meta: LeRobotDatasetMetadata, tol: float, decode: bool) -> list[str]:
    problems: list[str] = []
    for key in meta.video_keys:
        want_hw = meta.video_size(key)
        groups = _episode_groups(meta, "video", key)
        bar = tqdm(groups.items(), desc=f"check {key}", total=len(groups), unit="file", disable=None)
        for path, eps in bar:
            try:
                info = probe_video(path)
            except DatasetError as e:
                problems.append(str(e))
                continue
            if decode:
                bad = decode_problem(path, info["frames"])
                if bad:
                    problems.append(bad)
            n = sum(ep["length"] for ep in eps)
            if info["frames"] != n:
                problems.append(
                    f"{path}: {info['frames']} video frames, episodes {[e['episode_index'] for e in eps]} have {n}"
                )
            if want_hw and (info["height"], info["width"]) != want_hw:
                problems.append(
                    f"{path}: frames are {info['height']}x{info['width']}, info.json says {want_hw[0]}x{want_hw[1]}"
                )
            t = 0.0
            for ep in eps:
                start = ep["videos"][key]["from_timestamp"]
                if abs(start - t) > tol:
                    problems.append(
                        f"{path}: episode {ep['episode_index']} from_timestamp {start:.6f} s, expected {t:.6f} s"
                    )
                t = start + ep["length"] / meta.fps
            last = info["last_time"]
            if last is not None and abs(last - (t - 1 / meta.fps)) > max(tol, 0.5 / meta.fps):
                problems.append(
                    f"{path}: last frame at {last:.6f} s, episodes end at {t - 1 / meta.fps:.6f} s (duration mismatch)"
                )
    return problems


def video_bytes(meta: LeRobotDatasetMetadata) -> int:
    paths = {meta.root / ep["videos"][k]["path"] for ep in meta.episodes.values() for k in meta.video_keys}
    return sum(p.stat().st_size for p in paths if p.is_file())


def check_dataset(root: str | Path, tolerance_s: float = 1e-4, decode: bool | None = None) -> list[str]:
    """Every problem found in the dataset at ``root`` (empty list = valid). ``decode``: decode
    every video frame too (None: only when the videos total at most DECODE_BY_DEFAULT_BYTES)."""
    try:
        meta = LeRobotDatasetMetadata(root)
    except DatasetError as e:
        return [str(e)]
    if decode is None:
        decode = video_bytes(meta) <= DECODE_BY_DEFAULT_BYTES
    return index_problems(meta) + _check_data(meta, tolerance_s) + _check_videos(meta, tolerance_s, decode)


def _fmt(v: np.ndarray) -> str:
    return "[" + ", ".join(f"{x:+.3f}" for x in np.asarray(v).reshape(-1)) + "]"


def summarize(root: str | Path) -> str:
    meta = LeRobotDatasetMetadata(root)
    lengths = [e["length"] for e in meta.episodes.values()]
    lines = [
        f"dataset   {meta.root}",
        f"format    {meta.codebase_version}   robot {meta.robot_type}   fps {meta.fps:g}",
        f"episodes  {meta.total_episodes}   frames {meta.total_frames}   "
        f"length min/mean/max {min(lengths)}/{np.mean(lengths):.1f}/{max(lengths)}"
        if lengths
        else "episodes  0",
        f"tasks     {len(meta.tasks)}",
    ]
    lines += [f"  {i:>4}: {t}" for i, t in sorted(meta.tasks.items())]
    lines.append(f"cameras   {len(meta.camera_keys)}")
    for k in meta.camera_keys:
        info = meta.features[k].get("info") or meta.features[k].get("video_info") or {}
        hw = meta.video_size(k)
        size = f"{hw[0]}x{hw[1]}" if hw else "?"
        lines.append(
            f"  {k}: {size} (HxW) {info.get('video.codec', '?')} {info.get('video.fps', meta.fps)} fps"
        )
    lines.append("features")
    for k, f in meta.features.items():
        if f.get("dtype") not in ("video", "image") and k not in STANDARD_COLUMNS:
            names = f.get("names")
            names = names.get("motors", names) if isinstance(names, dict) else names
            lines.append(f"  {k}: {f.get('dtype')} {f.get('shape')}  {names if names else ''}")
    try:
        from dit4dit_npu.data.lerobot import LeRobotDataset
        from dit4dit_npu.transforms.feature_stats import FeatureStats

        ds = LeRobotDataset(root)
        lines.append("stats (from parquet, all episodes)")
        for k, f in meta.features.items():
            if f.get("dtype") not in ("video", "image", "string") and k not in STANDARD_COLUMNS:
                s = FeatureStats.from_data(ds.column(k))
                for name in ("min", "max", "mean", "std"):
                    lines.append(f"  {k} {name:>4} {_fmt(getattr(s, name))}")
    except DatasetError as e:
        lines.append(f"stats unavailable: {e}")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m dit4dit_npu.data.inspect: the command is data/cli.py's
    from dit4dit_npu.data.cli import inspect_main

    raise SystemExit(inspect_main())
