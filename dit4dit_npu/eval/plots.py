"""PNG plots of an open-loop evaluation (``dit4dit_npu.eval``), matplotlib Agg backend (headless).

- ``error_vs_horizon.png``: MSE / MAE per horizon step, model vs baselines;
- ``error_per_joint.png``: MSE per joint, model vs baselines;
- ``trajectory_<dataset>_ep<episode>.png``: per joint, the recorded action over the episode, the
  model's one-step-ahead prediction at every evaluated frame, and whole predicted chunks
  every ``chunk_length`` frames (what open-loop chunk execution would do);
- ``imagination.png``: for a few frames, the real future clip (views tiled as the model sees
  them), its VAE round trip (encode -> decode) and the backbone's imagined clip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display on servers and CI

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

COLORS = {"model": "tab:blue", "hold_position": "tab:orange", "dataset_mean": "tab:green"}


def _predictors(metrics: dict[str, Any]) -> list[str]:
    return [k for k in ("model", "hold_position", "dataset_mean") if isinstance(metrics.get(k), dict)]


def plot_horizon(out: Path, metrics: dict[str, Any]) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, stat in zip(axes, ("mse", "mae")):
        for name in _predictors(metrics):
            per_step = metrics[name][f"{stat}_per_step"]
            ax.plot(range(len(per_step)), per_step, "o-", label=name, color=COLORS[name])
        ax.set_xlabel("horizon step")
        ax.set_ylabel(f"{stat.upper()} (robot units)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("action error vs horizon step")
    fig.tight_layout()
    path = out / "error_vs_horizon.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_joints(out: Path, metrics: dict[str, Any], names: list[str]) -> Path:
    preds = _predictors(metrics)
    x = np.arange(len(names))
    width = 0.8 / len(preds)
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(names)), 4))
    for i, name in enumerate(preds):
        ax.bar(x + i * width, metrics[name]["mse_per_joint"], width, label=name, color=COLORS[name])
    ax.set_xticks(x + 0.4 - width / 2, names, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("MSE (robot units)")
    ax.set_yscale("symlog", linthresh=1e-6)
    ax.legend()
    ax.set_title("action MSE per joint")
    fig.tight_layout()
    path = out / "error_per_joint.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_trajectory(out: Path, ds: Any, preds: Any, k: int, episode: int, names: list[str], action_key: str) -> Path:
    lerobot_ds = ds.datasets[k]
    start, end = lerobot_ds.episode_bounds(episode)
    recorded = lerobot_ds.column(action_key)[start:end]
    frames = lerobot_ds.column("frame_index")[start:end]
    sel = np.flatnonzero((preds.dataset == k) & (preds.episode == episode))
    sel = sel[np.argsort(preds.frame[sel])]
    h = preds.pred.shape[1]
    a_dim = len(names)
    cols = min(a_dim, 7)
    rows = -(-a_dim // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.2 * rows), squeeze=False, sharex=True)
    chunk_starts = sel[:: max(1, h)] if len(sel) else sel
    for j in range(rows * cols):
        ax = axes[j // cols][j % cols]
        if j >= a_dim:
            ax.axis("off")
            continue
        ax.plot(frames, recorded[:, j], color="black", lw=1.2, label="recorded")
        ax.plot(preds.frame[sel], preds.pred[sel, 0, j], ".", color="tab:blue", ms=3, label="predicted (step 0)")
        for n, i in enumerate(chunk_starts):
            steps = preds.frame[i] + np.arange(h)
            keep = steps <= frames[-1]
            ax.plot(steps[keep], preds.pred[i, keep, j], color="tab:red", lw=0.8, alpha=0.7,
                    label="predicted chunk" if n == 0 else None)
        ax.set_title(names[j], fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=6)
    fig.suptitle(f"{Path(str(lerobot_ds.root)).name} episode {episode}: recorded vs predicted actions")
    fig.tight_layout()
    path = out / f"trajectory_{k}_ep{episode}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


Strip = tuple[str, list[tuple[str, np.ndarray]]]  # (title, [(row label, clip (T, H, W, 3) uint8)])


def plot_strips(path: Path, strips: list[Strip], title: str, dpi: int = 90) -> Path:
    """One row of frames per (label, clip) of each strip, the strip's title on its first row."""
    rows = [(f"{name} {label}" if i == 0 else label, clip) for name, clips in strips for i, (label, clip) in enumerate(clips)]
    t_max = max(len(clip) for _, clip in rows)
    aspect = max(clip.shape[2] / clip.shape[1] for _, clip in rows)  # tiled views are wide
    fig, axes = plt.subplots(len(rows), t_max, figsize=(1.2 * aspect * t_max, 1.45 * len(rows)), squeeze=False)
    for r, (label, clip) in enumerate(rows):
        for c in range(t_max):
            ax = axes[r][c]
            ax.axis("off")
            if c < len(clip):
                ax.imshow(clip[c])
            if c == 0:
                ax.set_title(label, fontsize=7, loc="left")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))  # room for a two-line title
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot_imagination(out: Path, strips: list[Strip]) -> Path | None:
    """``strips``: per picked frame, its real future clip, the clip's VAE round trip and the
    backbone's imagined clip."""
    if not strips:
        return None
    return plot_strips(out / "imagination.png", strips,
                       "per frame: real future frames / their VAE round trip / imagined by the video backbone")


def plot_all(
    out: Path,
    ds: Any,
    preds: Any,
    metrics: dict[str, Any],
    names: list[str],
    *,
    plot_episodes: int = 3,
    strips: list[Strip] | None = None,
) -> list[Path]:
    paths = [plot_horizon(out, metrics), plot_joints(out, metrics, names)]
    # The episodes with the most evaluated frames give the most readable trajectories.
    pairs, counts = np.unique(np.stack([preds.dataset, preds.episode], 1), axis=0, return_counts=True)
    for k, ep in pairs[np.argsort(-counts, kind="stable")][:plot_episodes]:
        paths.append(plot_trajectory(out, ds, preds, int(k), int(ep), names, ds.action_key))
    img = plot_imagination(out, strips or [])
    if img is not None:
        paths.append(img)
    return paths
