"""Every dataset check, in one place, as functions that return a list of problems.

Each problem is one line naming the file (or key) and what was expected. The inspector
(``inspect --check``) prints them all; loaders raise the first (``raise_first``) so training
fails at start-up, not in a worker hours later.

- ``table_problems``: one parquet file's rows against its episodes' metadata (row counts,
  NaN/inf, frame_index, timestamps on the 1/fps grid, known task indices);
- ``feature_problems``: the features a run needs (cameras, state/action vectors of one width
  across a mixture, their declared width against the parquet's, clip offsets on each video's
  frame grid);
- ``index_problems``: the episode index against info.json's totals and the data files on disk
  (an episode whose file is there but whose index entry is not, an empty dataset);
- ``width_problems``: declared (info.json) against stored (parquet) widths of vector features;
- ``episode_length_problems``: episodes shorter than the action chunk or the video clip (every
  sample of them would train on padding).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dit4dit_npu.data.errors import DatasetError


def raise_first(problems: list[str]) -> None:
    if problems:
        more = f" (and {len(problems) - 1} more problem(s); run `python -m dit4dit_npu.data.inspect ROOT --check`)"
        raise DatasetError(problems[0] + (more if len(problems) > 1 else ""))


def table_problems(
    path: Path,
    cols: dict[str, np.ndarray],
    episodes: Sequence[dict[str, Any]],
    fps: float,
    tolerance_s: float,
    tasks: dict[int, str],
    indexed: set[int] | None = None,
) -> list[str]:
    """Problems of one parquet file's numeric columns ``cols`` holding ``episodes`` (metadata dicts);
    ``indexed``: every episode the episode index knows (rows of any other are an error)."""
    problems: list[str] = []
    if indexed is not None:
        stray = sorted(set(np.unique(cols["episode_index"]).tolist()) - indexed)
        if stray:
            problems.append(f"{path}: rows of episode(s) {stray[:5]} that the episode index does not list")
    for k, arr in cols.items():
        if arr.dtype.kind == "f" and len(arr):
            bad = ~np.isfinite(arr.reshape(len(arr), -1)).all(1)
            if bad.any():
                row = int(np.flatnonzero(bad)[0])
                problems.append(
                    f"{path}: {int(bad.sum())} row(s) with NaN/inf in column {k!r} (first: episode "
                    f"{int(cols['episode_index'][row])}, frame_index {int(cols['frame_index'][row])})"
                )
    unknown = sorted(set(np.unique(cols["task_index"]).tolist()) - set(tasks))
    if unknown:
        problems.append(f"{path}: task_index values {unknown} not in the tasks metadata")
    for ep in episodes:
        e = ep["episode_index"]
        rows = np.flatnonzero(cols["episode_index"] == e)
        if len(rows) != ep["length"]:
            problems.append(f"{path}: episode {e} has {len(rows)} rows, metadata length is {ep['length']}")
            continue
        if not np.array_equal(cols["frame_index"][rows], np.arange(len(rows))):
            problems.append(f"{path}: episode {e} frame_index is not 0..{len(rows) - 1}")
        ts = cols["timestamp"][rows].astype(np.float64)
        d = np.diff(ts)
        if (d <= 0).any():
            problems.append(f"{path}: episode {e} timestamps are not strictly increasing")
        elif (np.abs(d - 1.0 / fps) > tolerance_s).any():
            i = int(np.flatnonzero(np.abs(d - 1.0 / fps) > tolerance_s)[0])
            problems.append(
                f"{path}: episode {e} timestamps {ts[i]:.6f} -> {ts[i + 1]:.6f} s are not 1/fps = "
                f"{1 / fps:.6f} s apart (tolerance {tolerance_s:g} s)"
            )
        if len(ts) and abs(ts[0]) > tolerance_s:
            problems.append(f"{path}: episode {e} timestamps start at {ts[0]:.6f} s, expected 0")
    return problems


def vector_width(ds: Any, key: str) -> int | None:
    """Declared width of a 1-d feature (info.json), or None when it is not a vector."""
    shape = (ds.meta.features.get(key) or {}).get("shape") or [1]
    return int(shape[0]) if len(shape) == 1 else None


def feature_problems(
    datasets: Sequence[Any],
    cameras: Sequence[str],
    vectors: Sequence[str],
    clip_offsets: Sequence[int] = (),
) -> list[str]:
    """Problems of the features a run reads from each dataset of a mixture.

    ``vectors`` (e.g. the state and action keys) must be 1-d, of the same width in every
    dataset, and as wide in the parquet as info.json declares; ``clip_offsets`` (frames) must land
    on each camera video's own frame grid.
    """
    problems: list[str] = []
    widths: dict[str, tuple[int, Path]] = {}
    for ds in datasets:
        missing = [k for k in cameras if k not in ds.meta.video_keys]
        if missing:
            problems.append(f"{ds.root}: camera key(s) {missing} not found; its video keys are {ds.meta.video_keys}")
        for key in vectors:
            feat = ds.meta.features.get(key)
            if feat is None:
                problems.append(f"{ds.root}: feature {key!r} not found (features: {sorted(ds.meta.features)})")
                continue
            declared = vector_width(ds, key)
            if declared is None:
                problems.append(f"{ds.root}: feature {key!r} has shape {feat.get('shape')}, expected a vector")
                continue
            stored = ds.column(key).reshape(ds.num_frames, -1).shape[1] if ds.num_frames else declared
            if stored != declared:
                problems.append(
                    f"{ds.root}: {key!r} is {stored} wide in the parquet files but meta/info.json declares {declared}"
                )
            first = widths.setdefault(key, (stored, ds.root))
            if first[0] != stored:
                problems.append(f"{ds.root}: {key!r} has {stored} dims but {first[1]} has {first[0]} (one width per mixture)")
        for key in cameras:
            if key not in ds.meta.video_keys:
                continue
            feat = ds.meta.features[key]
            vfps = float((feat.get("info") or feat.get("video_info") or {}).get("video.fps", ds.fps))
            for off in clip_offsets:
                t = off / ds.fps
                if abs(t * vfps - round(t * vfps)) / vfps > ds.tolerance_s:
                    problems.append(
                        f"{ds.root}: clip offset {off} frames = {t:.6f} s is off the {vfps:g} fps grid of {key!r}"
                    )
                    break
    return problems


def _index_name(meta: Any) -> str:
    return "meta/episodes/" if meta.is_v3 else "meta/episodes.jsonl"


def index_problems(meta: Any) -> list[str]:
    """The episode index (``meta``: LeRobotDatasetMetadata) against info.json and the data folder."""
    problems: list[str] = []
    info, index = meta.root / "meta" / "info.json", _index_name(meta)
    if not meta.episodes:
        return [f"{meta.root}: the dataset has no episodes ({index} lists none)"]
    for key, have in (("total_episodes", meta.total_episodes), ("total_frames", meta.total_frames)):
        declared = meta.info.get(key)
        if declared is not None and declared != have:
            problems.append(f"{info}: {key} is {declared!r} but {index} lists {have}")
    data_dir = meta.root / Path(meta.info["data_path"]).parts[0]
    indexed = {meta.root / ep["data_path"] for ep in meta.episodes.values()}
    stray = sorted(p for p in data_dir.rglob("*.parquet") if p not in indexed) if data_dir.is_dir() else []
    if stray:
        more = f" and {len(stray) - 3} more" if len(stray) > 3 else ""
        problems.append(
            f"{meta.root}: data file(s) {', '.join(str(p) for p in stray[:3])}{more} hold episodes that "
            f"{index} does not list (a missing index entry?)"
        )
    return problems


def width_problems(path: Path, cols: dict[str, np.ndarray], features: dict[str, dict]) -> list[str]:
    """Vector features whose parquet width differs from the shape info.json declares."""
    problems: list[str] = []
    for key, arr in cols.items():
        shape = (features.get(key) or {}).get("shape")
        if not shape or len(shape) != 1 or not len(arr):
            continue
        stored = arr.reshape(len(arr), -1).shape[1]
        if stored != int(shape[0]):
            problems.append(f"{path}: {key!r} is {stored} wide but meta/info.json declares {int(shape[0])}")
    return problems


def episode_length_problems(
    datasets: Sequence[Any], episodes: Sequence[Sequence[int] | None], clip_offsets: Sequence[int], chunk_length: int
) -> list[str]:
    """Each dataset's shortest episode against what one sample spans: the action chunk
    (``chunk_length`` steps) and the video clip (up to ``max(clip_offsets)`` frames ahead)."""
    problems: list[str] = []
    clip = max(clip_offsets, default=0) + 1
    for ds, eps in zip(datasets, episodes):
        eps = ds.selected_episodes if eps is None else eps
        if not eps:
            continue
        shortest = min(eps, key=lambda e: ds.meta.episode(e)["length"])
        n = ds.meta.episode(shortest)["length"]
        if n < chunk_length:
            problems.append(
                f"{ds.root}: episode {shortest} has {n} frames, fewer than the action chunk ({chunk_length} steps = "
                "framework.action_model.chunk_length): every sample of it would train on padding"
            )
        elif n < clip:
            problems.append(
                f"{ds.root}: episode {shortest} has {n} frames, fewer than the video clip spans ({clip} frames: "
                f"clip offsets {list(clip_offsets)}): every sample of it would train on padding"
            )
    return problems
