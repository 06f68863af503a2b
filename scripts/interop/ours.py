"""The dit4dit-npu side of ``scripts/interop_check.sh`` (runs in the project's own environment).

    python scripts/interop/ours.py samples ROOT OUT.npz        # our reader's samples of a dataset
    python scripts/interop/ours.py stats ROOT                  # our reader on a (lerobot) stats.json
    python scripts/interop/ours.py observations POLICY ROOT OUT.npz
                                                               # robot observations + our actions

``samples`` stores, for every frame, what ``dit4dit_npu.data.LeRobotDataset`` returns, once plainly
and once with the delta timestamps in ``DELTAS`` (lerobot's side reads the same JSON), so the other
side can compare key by key. ``observations`` builds a few observations from the dataset's frames,
as a robot would send them (uint8 HWC images, raw state, an instruction), and the actions this
project's policy predicts for them with seed 0, for the openpi client to compare with the server.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

# Offsets in frames at the dataset's fps: an action chunk, and a clip of two frames per camera.
DELTA_FRAMES = {"action": list(range(8)), "observation.state": [0], "camera": [0, 2]}


def delta_timestamps(fps: float, camera_keys: list[str]) -> dict[str, list[float]]:
    out = {k: [f / fps for f in v] for k, v in DELTA_FRAMES.items() if k != "camera"}
    return out | {k: [f / fps for f in DELTA_FRAMES["camera"]] for k in camera_keys}


def _as_numpy(item: dict) -> dict[str, np.ndarray]:
    return {k: (np.asarray(v) if isinstance(v, str) else v.numpy()) for k, v in item.items()}


def samples(root: Path, out: Path) -> None:
    from dit4dit_npu.data import LeRobotDataset

    plain = LeRobotDataset(root)
    deltas = delta_timestamps(plain.fps, plain.meta.camera_keys)
    delta = LeRobotDataset(root, delta_timestamps=deltas)
    arrays: dict[str, np.ndarray] = {}
    for name, ds in (("plain", plain), ("delta", delta)):
        for i in range(len(ds)):
            arrays |= {f"{name}/{i}/{k}": v for k, v in _as_numpy(ds[i]).items()}
    np.savez(out, **arrays)
    (out.with_suffix(".json")).write_text(json.dumps({"delta_timestamps": deltas, "frames": len(plain)}))


def stats(root: Path) -> None:
    """Our reader on a stats.json (lerobot's own): every camera's stats, shaped as lerobot's."""
    from dit4dit_npu.data import LeRobotDatasetMetadata

    meta = LeRobotDatasetMetadata(root)
    bad = [k for k in meta.camera_keys if meta.stats.get(k, {}).get("mean", np.zeros(0)).shape != (3, 1, 1)]
    if bad or not meta.camera_keys:
        print(f"FAIL our reader on {root.name}/meta/stats.json: no (3, 1, 1) image stats for {bad}")
        sys.exit(1)
    shown = ", ".join(f"{k.split('.')[-1]} count {int(meta.stats[k]['count'][0])}" for k in meta.camera_keys)
    print(f"PASS our reader reads the stats.json lerobot wrote ({len(meta.stats)} features; {shown})")


def observations(policy_dir: Path, root: Path, out: Path) -> None:
    from dit4dit_npu.data import LeRobotDataset
    from dit4dit_npu.policy import DiT4DiTPolicy

    policy = DiT4DiTPolicy.from_pretrained(policy_dir)
    ds = LeRobotDataset(root)
    arrays: dict[str, np.ndarray] = {}
    picks = np.linspace(0, len(ds) - 1, 3).round().astype(int)
    for n, i in enumerate(picks):
        item = ds[int(i)]
        obs = {k: np.round(item[k].numpy().transpose(1, 2, 0) * 255).astype(np.uint8) for k in policy.camera_keys}
        obs |= {"state": item["observation.state"].numpy(), "prompt": item["task"]}
        arrays |= {f"{n}/obs/{k}": np.asarray(v) for k, v in obs.items()}
        arrays[f"{n}/actions"] = policy.predict_action({**obs}, seed=0)
    np.savez(out, **arrays)
    meta = {"count": len(picks), "camera_keys": policy.camera_keys, "chunk_length": policy.chunk_length}
    out.with_suffix(".json").write_text(json.dumps(meta | {"action_dim": policy.action_dim}))


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"samples": samples, "stats": stats, "observations": observations}[cmd](*map(Path, args))
