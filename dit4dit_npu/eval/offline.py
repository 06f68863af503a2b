"""Open-loop checkpoint evaluation on held-out episodes (the library; its command is ``eval/cli.py``,
``python -m dit4dit_npu.eval``).

For sampled frames of the held-out episodes (by default the dataset and episodes recorded in the
policy folder at export), the policy predicts a chunk through the public ``predict_action`` API
(the deployment path: raw images, raw state, robot-unit output) and it is compared with the
recorded actions in robot units. Two baselines are scored on the same frames and steps:
hold-position (repeat the current state; only when state and action share their layout) and the
training-set mean action. Steps past the episode end are excluded (no recorded action there).
With ``--blank-cameras`` the same policy is scored a second time on the same frames with every
camera view replaced by one constant grey image (``cameras_blanked`` in metrics.json): clearly
worse than the real score shows the policy uses its cameras.

Writes ``metrics.json`` (MSE/MAE overall, per joint and per horizon step for the model and both
baselines, the model/baseline ratios; < 1 means better than the baseline) and PNG plots
(``eval/plots.py``). The original's offline G1 evaluator normalized state differently from
training; here the same PolicyIO as training is applied, inside the policy.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.files import atomic_write_json, is_out_of_space
from dit4dit_npu.transforms.observation import Observation

log = logging.getLogger("dit4dit_npu.eval")


class EvalError(DiT4DiTError, RuntimeError):
    """A problem with the evaluation request (data, episodes, checkpoint): one-line message."""


@dataclass
class Predictions:
    """Everything scored, aligned on N sampled frames."""

    pred: np.ndarray  # (N, H, A) robot units
    target: np.ndarray  # (N, H, A) recorded actions
    valid: np.ndarray  # (N, H) bool: the recorded step exists (not past the episode end)
    state: np.ndarray  # (N, S) raw state at the frame
    dataset: np.ndarray  # (N,) int
    episode: np.ndarray  # (N,) int
    frame: np.ndarray  # (N,) int
    index: np.ndarray  # (N,) int: sample index in the eval RoboTwinDataset
    extra: dict[str, Any] = field(default_factory=dict)


def error_stats(pred: np.ndarray, target: np.ndarray, valid: np.ndarray) -> dict[str, Any]:
    """MSE/MAE over valid (frame, step) pairs: overall, per joint, per horizon step."""
    pred = np.broadcast_to(pred, target.shape).astype(np.float64)
    err = pred - target.astype(np.float64)
    w = valid.astype(np.float64)[..., None]  # (N, H, 1)
    n_joint = max(w.sum(), 1.0)
    n_step = np.maximum(w.sum(axis=(0, 2)), 1.0)  # (H,)
    out: dict[str, Any] = {}
    for name, e in (("mse", err**2), ("mae", np.abs(err))):
        out[name] = float((e * w).sum() / (n_joint * err.shape[-1]))
        out[f"{name}_per_joint"] = ((e * w).sum(axis=(0, 1)) / n_joint).tolist()
        out[f"{name}_per_step"] = ((e * w).sum(axis=(0, 2)) / (n_step * err.shape[-1])).tolist()
    return out


def _ratio(a: float, b: float) -> float | None:
    return float(a / b) if b > 0 else None


def compute_metrics(p: Predictions, io: Any) -> dict[str, Any]:
    a_dim = p.target.shape[-1]
    results: dict[str, Any] = {"model": error_stats(p.pred, p.target, p.valid)}
    mean_action = io.stats["action"].mean
    baselines: dict[str, np.ndarray] = {"dataset_mean": np.asarray(mean_action)[None, None, :a_dim]}
    if p.state.shape[-1] == a_dim:  # absolute joint actions: holding = commanding the current state
        baselines["hold_position"] = p.state[:, None, :]
    else:
        results["hold_position_skipped"] = f"state has {p.state.shape[-1]} dims, actions {a_dim}"
    for name, b in baselines.items():
        results[name] = error_stats(b, p.target, p.valid)
        results[f"ratio_to_{name}"] = {
            k: _ratio(results["model"][k], results[name][k]) for k in ("mse", "mae")
        }
    # Same quantity as the trainer's val/action_mse (normalized space, real dims), for cross-checking.
    real = io.action_mask
    norm_err = (io.normalize_actions(p.pred) - io.normalize_actions(p.target))[..., real]
    w = p.valid[..., None]
    results["model"]["normalized_mse"] = float((norm_err**2 * w).sum() / max(w.sum() * int(real.sum()), 1))
    return results


# --------------------------------------------------------------------------------------------
# Data selection
# --------------------------------------------------------------------------------------------


def resolve_targets(
    records: dict[str, Any], data: list[str] | None, episodes: list[int] | None
) -> list[tuple[Path, list[int] | None]]:
    """(dataset root, episodes or None = all) pairs from the flags and the policy's record
    (``records``: its manifest's datasets, path -> DatasetRecord)."""
    held_out = {path: r.held_out_episodes for path, r in records.items()}
    if data:
        out = []
        for root in data:
            p = Path(root).expanduser().resolve()
            recorded = held_out.get(str(p))
            if episodes is not None:
                eps: list[int] | None = list(episodes)
                trained = records[str(p)].train_episodes if str(p) in records else None
                seen = sorted(set(eps) & set(trained or []))
                if seen:
                    log.warning("%s: episodes %s were used for training: their scores are not held-out", p, seen)
            elif recorded is None:
                log.warning("%s was not a training dataset of this policy: evaluating all its episodes", p)
                eps = None
            elif not recorded:
                raise EvalError(f"{p}: the policy records no held-out episodes of it (val_fraction 0?); pass --episode-indices")
            else:
                eps = list(recorded)
            out.append((p, eps))
        return out
    if not held_out:
        raise EvalError("the policy records no datasets; pass --data ROOT")
    if episodes is not None and len(held_out) > 1:
        raise EvalError("--episode-indices is ambiguous with several recorded datasets; pass --data ROOT too")
    out = []
    for path, eps in held_out.items():
        eps = episodes if episodes is not None else eps
        if not eps:
            log.warning("%s: no held-out episodes recorded (val_fraction 0?); skipping", path)
            continue
        if not Path(path).exists():
            raise EvalError(f"recorded dataset {path} not found (moved?); pass --data ROOT")
        out.append((Path(path), list(eps)))
    if not out:
        raise EvalError("no held-out episodes recorded in the policy; pass --data ROOT [--episode-indices ...]")
    return out


def sample_indices(n: int, max_frames: int, stride: int) -> np.ndarray:
    """Every ``stride``-th sample (per the global index), then at most ``max_frames`` evenly spaced."""
    idx = np.arange(0, n, max(1, stride))
    if len(idx) > max_frames:
        idx = idx[np.linspace(0, len(idx) - 1, max_frames).round().astype(int)]
    return np.unique(idx)


def build_eval_dataset(policy: Any, targets: list[tuple[Path, list[int] | None]]) -> Any:
    from dit4dit_npu.data import DatasetError, LeRobotDataset, RoboTwinDataset

    d = policy.manifest.data
    try:
        datasets = [LeRobotDataset(root, episodes=eps, image_size=policy.io.image_size) for root, eps in targets]
        return RoboTwinDataset(datasets, policy.io, d.state_key, d.action_key)
    except DatasetError as e:
        raise EvalError(str(e)) from None


# What a blanked camera shows: mid-grey, every pixel of every view of every frame.
BLANK_VALUE = 128


def observation(samples: list[Any], blank_cameras: bool = False) -> Observation:
    """Raw samples -> their parsed observation (what the policy's ``parse`` takes): the views of each
    sample's observation frame as the training data made them, cameras already cut and resized
    (sent as camera frames they would be cut again), the state in robot units. ``blank_cameras``
    replaces every view by the constant ``BLANK_VALUE`` image (same shape and dtype)."""
    views = np.stack([s.views[0] for s in samples])
    if blank_cameras:
        views = np.full_like(views, BLANK_VALUE)
    return Observation(
        views=views,
        state=np.stack([np.asarray(s.state, np.float64) for s in samples]),
        instructions=[s.instruction for s in samples],
        batched=True,
    )


def run_predictions(
    policy: Any, ds: Any, indices: np.ndarray, batch_size: int, seed: int, blank_cameras: bool = False
) -> Predictions:
    from tqdm.auto import tqdm

    rows: dict[str, list[Any]] = {k: [] for k in ("pred", "target", "valid", "state", "dataset", "episode", "frame", "index")}
    batches = [indices[i : i + batch_size] for i in range(0, len(indices), batch_size)]
    desc = "eval, cameras blanked" if blank_cameras else "eval"
    for b, chunk in enumerate(tqdm(batches, desc=desc, unit="batch", dynamic_ncols=True)):
        samples = [ds.raw_sample(int(i)) for i in chunk]
        parsed = policy.parse(observation(samples, blank_cameras))  # already parsed: only its state range is checked
        pred = policy.predict_batch([parsed], seed=seed + b)[0]
        for i, s in zip(chunk, samples):
            rows["valid"].append(s.valid)
            rows["target"].append(s.actions)
            rows["state"].append(s.state)
            rows["dataset"].append(s.dataset)
            rows["episode"].append(s.episode)
            rows["frame"].append(s.frame)
            rows["index"].append(int(i))
        rows["pred"].extend(pred)
    return Predictions(**{k: np.asarray(v) for k, v in rows.items()})


def imagination_strips(policy: Any, ds: Any, preds: Predictions, n: int, steps: int, seed: int) -> list:
    """(title, [("real", clip), ("round trip", clip), ("imagined", clip)]) for ``n`` evaluated
    frames: the real future with the model's own view tiling, its VAE round trip and the
    backbone's imagined clip (each (T, H, W, 3) uint8)."""
    from dit4dit_npu.eval.research import predict_video, reconstruct_video
    from dit4dit_npu.transforms.images import untile

    if n <= 0 or len(preds.frame) == 0:
        return []
    strips = []
    for p in np.unique(np.linspace(0, len(preds.frame) - 1, n).round().astype(int)):
        s = ds.raw_sample(int(preds.index[p]))
        real = untile(policy.io.frames(s.views).numpy())
        round_trip = reconstruct_video(policy, s.views)
        imagined = predict_video(policy, observation([s]), steps=steps, seed=seed)[0]
        t = min(len(real), len(imagined))
        name = Path(str(ds.datasets[s.dataset].root)).name
        strips.append((f"{name} ep{s.episode} t={s.frame}",
                       [("real", real[:t]), ("round trip", round_trip[:t]), ("imagined", imagined[:t])]))
    return strips


def joint_names(ds: Any, key: str, dim: int) -> list[str]:
    names = ds.datasets[0].meta.features.get(key, {}).get("names")
    if isinstance(names, dict):  # lerobot's {"motors": [...]} form
        names = next(iter(names.values()), None)
    if isinstance(names, list) and len(names) == dim and all(isinstance(n, str) for n in names):
        return names
    return [f"joint_{j}" for j in range(dim)]


def output_dir(output: str | None, policy_dir: Path) -> Path:
    """Default outputs/eval/<checkpoint>: not inside the checkpoint, which the trainer may prune."""
    if output:
        return Path(output)
    name = policy_dir.parent.name if policy_dir.name == "policy" else policy_dir.name
    return Path("outputs") / "eval" / name


def prepare_output(out: Path) -> None:
    """Create the output folder and prove it writable before any (long) prediction runs."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise EvalError(f"--out: cannot write to {out} ({e.strerror or e})") from None


def check_finite(metrics: dict[str, Any]) -> None:
    """A metric that is NaN/inf means the evaluation failed, whatever else was written."""
    for name, v in metrics["model"].items():
        values = np.asarray(v, dtype=np.float64)
        if not np.isfinite(values).all():
            raise EvalError(f"metric model.{name} is not finite ({v if values.ndim == 0 else 'NaN/inf in some entries'})")


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """The whole evaluation for the command's checked flags (``eval/cli.py``): metrics.json, the plots."""
    from dit4dit_npu.eval import plots as eval_plots
    from dit4dit_npu.policy import DiT4DiTPolicy
    from dit4dit_npu.policy.folder import find_policy_dir

    out = output_dir(args.out, find_policy_dir(args.policy))
    prepare_output(out)
    policy = DiT4DiTPolicy.from_pretrained(
        args.policy, device=args.device, base_model=args.base_model, merge_lora=args.merge_lora, compile=args.compile
    )
    policy_dir = policy.path
    targets = resolve_targets(policy.manifest.data.datasets, args.data, args.episode_indices)
    ds = build_eval_dataset(policy, targets)
    if len(ds) == 0:
        raise EvalError("the selected episodes hold no frames")
    indices = sample_indices(len(ds), args.max_frames, args.stride)
    preds = run_predictions(policy, ds, indices, args.batch_size, args.seed)
    metrics = compute_metrics(preds, policy.io)
    check_finite(metrics)
    if args.blank_cameras:  # same frames, same noise seeds, constant views
        blanked = compute_metrics(run_predictions(policy, ds, indices, args.batch_size, args.seed, True), policy.io)
        check_finite(blanked)
        metrics["cameras_blanked"] = {"blank_value": BLANK_VALUE, **blanked}
    names = joint_names(ds, policy.manifest.data.action_key, policy.action_dim)
    strips = imagination_strips(policy, ds, preds, args.video_samples, args.video_steps, args.seed)
    with _out_of_space_is_one_line(out):
        plots = eval_plots.plot_all(out, ds, preds, metrics, names, plot_episodes=args.plot_episodes, strips=strips)
    report = {
        "checkpoint": str(policy_dir),
        "step": policy.manifest.step,
        "datasets": {str(root): (eps if eps is not None else "all") for root, eps in targets},
        "num_frames": len(indices),
        "num_scored_steps": int(preds.valid.sum()),
        "episodes": sorted({(int(k), int(e)) for k, e in zip(preds.dataset, preds.episode)}),
        "chunk_length": policy.chunk_length,
        "action_dim": policy.action_dim,
        "joint_names": names,
        "seed": args.seed,
        "units": "robot units (unnormalized) unless named normalized_*",
        **metrics,
        "plots": [p.name for p in plots],
    }
    with _out_of_space_is_one_line(out):
        atomic_write_json(out / "metrics.json", report)
    return report


@contextlib.contextmanager
def _out_of_space_is_one_line(out: Path) -> Iterator[None]:
    """A full disk while writing the results: one line naming the folder (each plot and
    metrics.json is written whole or not at all; metrics.json comes last, so its absence says the
    run did not finish)."""
    try:
        yield
    except Exception as e:  # matplotlib and PIL raise it as OSError; other writers as their own types
        if not is_out_of_space(e):
            raise
        raise EvalError(
            f"--out {out}: no space left writing the results ({' '.join(str(e).split())}); metrics.json was not "
            "written"
        ) from None
