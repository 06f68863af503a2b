"""The lerobot side of ``scripts/interop_check.sh`` (runs in the side virtualenv with lerobot 0.4.4).

    python lerobot_side.py compare ROOT OURS.npz BACKEND   # lerobot's samples == ours, key by key
    python lerobot_side.py stats ROOT                      # stats.json in lerobot's layout
    python lerobot_side.py viz ROOT OUT_DIR BACKEND        # lerobot's visualizer writes its .rrd
    python lerobot_side.py write ROOT                      # a dataset written by lerobot itself

Every line printed is ``PASS ...`` or ``FAIL ...``; the exit code is the number of FAILs. Nothing
here imports dit4dit_npu: our side's samples arrive as an .npz written by ``ours.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from lerobot.datasets.lerobot_dataset import LeRobotDataset

REPO_ID = "local/dit4dit_demo"  # a name only: root= points at the folder, nothing is downloaded


def _open(root: Path, backend: str, **kw) -> LeRobotDataset:
    return LeRobotDataset(REPO_ID, root=root, video_backend=backend, **kw)


def _differences(ours: dict[str, np.ndarray], prefix: str, item: dict) -> list[str]:
    theirs = {k: (np.asarray(v) if isinstance(v, str) else v.numpy()) for k, v in item.items()}
    mine = {k[len(prefix) :]: v for k, v in ours.items() if k.startswith(prefix)}
    problems = []
    if set(mine) != set(theirs):
        problems.append(f"keys differ: only ours {sorted(set(mine) - set(theirs))}, only lerobot's {sorted(set(theirs) - set(mine))}")
    for k in sorted(set(mine) & set(theirs)):
        a, b = mine[k], theirs[k]
        if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a, b):
            diff = ""
            if a.shape == b.shape and a.dtype.kind == b.dtype.kind == "f":
                diff = f", max |diff| {np.abs(a.astype(np.float64) - b).max():.3g}"
            problems.append(f"{k}: ours {a.dtype}{list(a.shape)}, lerobot's {b.dtype}{list(b.shape)}{diff}")
    return problems


def compare(root: Path, ours_npz: Path, backend: str) -> int:
    ours = dict(np.load(ours_npz))
    spec = json.loads(ours_npz.with_suffix(".json").read_text())
    fails = 0
    for name, kw in (("plain", {}), ("delta", {"delta_timestamps": spec["delta_timestamps"]})):
        ds = _open(root, backend, **kw)
        if len(ds) != spec["frames"]:
            print(f"FAIL lerobot sees {len(ds)} frames in {root.name}, ours {spec['frames']}")
            fails += 1
            continue
        bad = {}
        for i in range(len(ds)):
            problems = _differences(ours, f"{name}/{i}/", ds[i])
            if problems:
                bad[i] = problems
        what = "samples" if name == "plain" else "samples with delta_timestamps (action chunk, 2-frame clips)"
        if bad:
            i = next(iter(bad))
            print(f"FAIL lerobot {backend}: {len(bad)}/{len(ds)} {what} of {root.name} differ; sample {i}: {'; '.join(bad[i][:3])}")
            fails += 1
        else:
            keys = sorted(ds[0].keys())
            print(f"PASS lerobot {backend}: all {len(ds)} {what} of {root.name} equal ours exactly ({len(keys)} keys: {', '.join(keys)})")
    return fails


def stats(root: Path) -> int:
    """lerobot's own validation of the stats (the one lerobot-train relies on) + image stats present."""
    from lerobot.datasets.compute_stats import _assert_type_and_shape

    ds = LeRobotDataset(REPO_ID, root=root)
    s = ds.meta.stats
    missing = [k for k in ds.meta.features if ds.meta.features[k]["dtype"] != "string" and k not in s]
    problems = [f"no stats for {missing}"] if missing else []
    try:
        _assert_type_and_shape([s])
    except ValueError as e:
        problems.append(str(e))
    # lerobot drops the per-episode stats columns when it loads meta/episodes: read them directly.
    episodes = pd.concat([pd.read_parquet(f) for f in sorted((root / "meta/episodes").glob("*/*.parquet"))])
    for key in ds.meta.camera_keys:
        n = int(np.asarray(s[key]["count"]).reshape(-1)[0])
        episodes_count = sum(int(np.asarray(c).reshape(-1)[0]) for c in episodes[f"stats/{key}/count"])
        if n != episodes_count:
            problems.append(f"{key}: count {n} != sum of episode counts {episodes_count}")
    if problems:
        print(f"FAIL lerobot reads meta/stats.json of {root.name}: {'; '.join(problems)}")
        return 1
    cams = ", ".join(f"{k.split('.')[-1]} {list(np.asarray(s[k]['mean']).shape)} count {int(s[k]['count'][0])}" for k in ds.meta.camera_keys)
    print(f"PASS lerobot reads meta/stats.json of {root.name}: every feature, image stats per camera ({cams})")
    return 0


def viz(root: Path, out_dir: Path, backend: str) -> int:
    """lerobot-dataset-viz's own function (the CLI calls it with the default decoder)."""
    from lerobot.scripts.lerobot_dataset_viz import visualize_dataset

    ds = _open(root, backend, episodes=[0])
    path = visualize_dataset(ds, episode_index=0, num_workers=0, mode="local", save=True, output_dir=out_dir)
    size = Path(path).stat().st_size if path and Path(path).is_file() else 0
    if size == 0:
        print(f"FAIL lerobot visualizer ({backend}) wrote no .rrd for {root.name}")
        return 1
    print(f"PASS lerobot visualizer ({backend}) wrote {Path(path).name} ({size} bytes) for episode 0 of {root.name}")
    return 0


def write(root: Path) -> int:
    """lerobot's own recording API (LeRobotDataset.create / add_frame / save_episode / finalize)."""
    features = {
        "observation.state": {"dtype": "float32", "shape": (6,), "names": [f"j{i}" for i in range(6)]},
        "action": {"dtype": "float32", "shape": (6,), "names": [f"j{i}" for i in range(6)]},
        **{
            f"observation.images.{cam}": {"dtype": "video", "shape": (32, 48, 3), "names": ["height", "width", "channels"]}
            for cam in ("cam_high", "cam_left_wrist")
        },
    }
    ds = LeRobotDataset.create(REPO_ID, fps=15, root=root, features=features, robot_type="aloha", use_videos=True)
    rng = np.random.default_rng(0)
    for episode, length in enumerate((17, 23, 12)):
        for _ in range(length):
            frame = {k: rng.normal(size=6).astype(np.float32) for k in ("observation.state", "action")}
            frame |= {k: rng.integers(0, 256, (32, 48, 3), dtype=np.uint8) for k in features if "images" in k}
            ds.add_frame(frame | {"task": f"task {episode % 2}"})
        ds.save_episode()
    ds.finalize()
    print(f"lerobot wrote {ds.meta.total_episodes} episodes, {ds.meta.total_frames} frames to {root}")
    return 0


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "compare":
        sys.exit(compare(Path(args[0]), Path(args[1]), args[2]))
    if cmd == "stats":
        sys.exit(stats(Path(args[0])))
    if cmd == "write":
        sys.exit(write(Path(args[0])))
    if cmd == "viz":
        sys.exit(viz(Path(args[0]), Path(args[1]), args[2]))
    sys.exit(f"unknown command {cmd}")
