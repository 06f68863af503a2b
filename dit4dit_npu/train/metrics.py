"""Run logging: metrics.jsonl (always), optional tensorboard / wandb, and a loss plot at the end.

Only rank 0 writes; values arrive already averaged across ranks. ``Window`` measures the
throughput between two log rows. The trackers are checked when the config loads
(``check_trackers``: one line, before the seconds of imports and data loading), and each gets
the resolved config: wandb as the run config, TensorBoard as a text panel (the YAML) and as
hyper-parameters (the HPARAMS tab, one flattened key per config leaf).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

from dit4dit_npu.config import Config, ConfigError, dump_yaml, to_dict
from dit4dit_npu.files import atomic_write_text

# The module each optional tracker needs (tensorboard: torch.utils.tensorboard imports it).
TRACKER_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb"}
# Metrics shown next to the hyper-parameters in TensorBoard's HPARAMS tab (logged as scalars).
HPARAM_METRICS = ("total_loss", "action_loss", "video_loss", "val/action_mse")


def check_trackers(trackers: list[str]) -> None:
    """One clear line for a tracker that is not installed, without importing it (fast)."""
    import importlib.util

    missing = [t for t in trackers if t in TRACKER_MODULES and importlib.util.find_spec(TRACKER_MODULES[t]) is None]
    if missing:
        raise ConfigError(
            f"trackers: {', '.join(missing)} not installed (pip install {' '.join(TRACKER_MODULES[t] for t in missing)}, "
            "or `pip install -e .[trackers]`; or remove it from trackers)"
        )


def flat_hparams(cfg: Config) -> dict[str, bool | int | float | str]:
    """The config as dotted keys -> scalars (what TensorBoard's hparams accept; lists as text)."""
    out: dict[str, bool | int | float | str] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, bool | int | float | str):
            out[prefix] = value
        else:  # None, lists, empty mappings
            out[prefix] = json.dumps(value)

    walk("", to_dict(cfg))
    return out


class MetricsLogger:
    def __init__(self, cfg: Config, run_dir: Path, enabled: bool):
        self.enabled = enabled
        self.path = run_dir / "metrics.jsonl"
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        check_trackers(cfg.trackers)
        if "tensorboard" in cfg.trackers:
            from torch.utils.tensorboard import SummaryWriter
            from torch.utils.tensorboard.summary import hparams

            self._tb = SummaryWriter(str(run_dir / "tensorboard"))
            self._tb.add_text("config", "```yaml\n" + dump_yaml(cfg) + "```", 0)
            # In this run (add_hparams would start a separate one), so the HPARAMS tab links the
            # hyper-parameters to this run's loss curves.
            for summary in hparams(flat_hparams(cfg), dict.fromkeys(HPARAM_METRICS, 0.0)):
                self._tb.file_writer.add_summary(summary)
        if "wandb" in cfg.trackers:
            import os

            import wandb

            os.environ.setdefault("WANDB_MODE", "offline")  # offline unless the user opts in
            self._wandb = wandb.init(
                project=cfg.wandb_project,
                entity=cfg.wandb_entity,
                name=cfg.run_id,
                dir=str(run_dir),
                config=to_dict(cfg),
            )

    def log(self, step: int, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: (None if not math.isfinite(v) else v) for k, v in values.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


class Window:
    """Steps, data-loading time and wall time since the last log row.

    Eval and save are not training throughput: time spent under ``paused()`` is left out of
    step_time and samples_per_s.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps, self.data_time, self.start = 0, 0.0, time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    @contextlib.contextmanager
    def loading(self) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.data_time += time.perf_counter() - t0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.start += time.perf_counter() - t0


def _parse_rows(path: Path) -> tuple[list[dict], int]:
    """The rows of metrics.jsonl, and how many lines were unreadable. A kill (or a full disk)
    in the middle of an append leaves a torn last line; it carries nothing worth a traceback."""
    if not path.is_file():
        return [], 0
    rows, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            int(row["step"])
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        rows.append(row)
    return rows, bad


def truncate_metrics(path: Path, step: int) -> int:
    """On resume, drop rows the interrupted run logged after its last checkpoint, and torn
    lines; returns the number of torn lines dropped. Rewritten atomically (temp + rename)."""
    if not path.is_file():
        return 0
    rows, bad = _parse_rows(path)
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows if r["step"] <= step))
    return bad


def read_metrics(path: Path) -> list[dict]:
    return _parse_rows(path)[0]


def plot_losses(metrics_path: Path, out_png: Path) -> None:
    rows = [r for r in read_metrics(metrics_path) if "total_loss" in r]
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [r["step"] for r in rows]
    for key in ("total_loss", "action_loss", "video_loss"):
        ys = [r.get(key) for r in rows]
        if any(y for y in ys):
            ax.plot(steps, ys, label=key)
    val = [(r["step"], r["val/action_mse"]) for r in read_metrics(metrics_path) if "val/action_mse" in r]
    if val:
        ax.plot(*zip(*val), "o-", label="val/action_mse")
    ax.set_xlabel("step")
    ax.set_yscale("log")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
