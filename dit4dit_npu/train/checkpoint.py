"""Full-state checkpoints, written atomically, and exact resume.

Layout of a run folder::

    <run_dir>/config.yaml               resolved config (written at start)
    <run_dir>/metrics.jsonl
    <run_dir>/checkpoints/step_000100/  complete checkpoint (renamed into place when done)
        state/                          accelerate/DeepSpeed state: model, optimizer, RNG of every rank
        trainer_state.pt                step, LR scheduler, data cursor
        fingerprint.json                config keys a resume must agree with
        policy/                         exported policy folder (inference only needs this)
    <run_dir>/checkpoints/.tmp-step_000100/  a save in progress; never read

A crash during a save leaves only a `.tmp-*` folder behind, so the previous checkpoint stays the
latest valid one.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from dit4dit_npu.config import Config, ConfigError, to_dict

STEP_DIR = re.compile(r"^step_(\d+)$")
COMPLETE_MARKER = "trainer_state.pt"


def fingerprint(cfg: Config) -> dict[str, Any]:
    """What must not change between a checkpoint and the run resuming it."""
    d = cfg.datasets.vla_data
    return {
        "framework": to_dict(cfg.framework),
        "datasets.vla_data": {
            k: to_dict(d)[k]
            for k in (
                "data_mix", "video_delta_indices", "action_video_freq_ratio", "camera_keys", "image_size",
                "max_state_dim", "max_action_dim", "action_norm", "state_norm", "per_device_batch_size",
            )
        },
        "trainer.gradient_accumulation_steps": cfg.trainer.gradient_accumulation_steps,
        "trainer.learning_rate": cfg.trainer.learning_rate,
        "trainer.freeze_modules": cfg.trainer.freeze_modules,
    }


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else str(k))
        return out
    return [] if a == b else [f"{prefix}: checkpoint {a!r} vs config {b!r}"]


def checkpoints_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = STEP_DIR.match(p.name)
        if m and (p / COMPLETE_MARKER).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def find_resume(cfg: Config) -> Path | None:
    """trainer.resume: null -> None, "auto" -> latest complete checkpoint (or None), else a path."""
    r = cfg.trainer.resume
    if r is None:
        return None
    if r == "auto":
        ckpts = list_checkpoints(cfg.run_dir)
        return ckpts[-1][1] if ckpts else None
    p = Path(r)
    if not (p / COMPLETE_MARKER).is_file():
        raise ConfigError(f"trainer.resume: {p} is not a complete checkpoint (no {COMPLETE_MARKER})")
    return p


def check_fingerprint(ckpt: Path, cfg: Config) -> None:
    saved = json.loads((ckpt / "fingerprint.json").read_text())
    diffs = _diff(saved, json.loads(json.dumps(fingerprint(cfg))))
    if diffs:
        raise ConfigError(f"checkpoint {ckpt} was made with another config: " + "; ".join(diffs[:5]))


def tmp_dir_for(run_dir: Path, step: int) -> Path:
    return checkpoints_dir(run_dir) / f".tmp-step_{step:06d}"


def final_dir_for(run_dir: Path, step: int) -> Path:
    return checkpoints_dir(run_dir) / f"step_{step:06d}"


def write_trainer_state(tmp: Path, cfg: Config, step: int, scheduler, sampler_state: dict) -> None:
    (tmp / "fingerprint.json").write_text(json.dumps(fingerprint(cfg), indent=1))
    # Written last: its presence marks the checkpoint complete.
    torch.save({"step": step, "scheduler": scheduler.state_dict(), "sampler": sampler_state}, tmp / COMPLETE_MARKER)


def read_trainer_state(ckpt: Path) -> dict:
    return torch.load(ckpt / COMPLETE_MARKER, weights_only=False)


def commit(tmp: Path, final: Path) -> None:
    """Rename a finished save into place (replacing a same-step checkpoint from an older run)."""
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)


def prune(run_dir: Path, keep: int) -> None:
    ckpts = list_checkpoints(run_dir)
    for _, path in ckpts[:-keep]:
        shutil.rmtree(path, ignore_errors=True)
    for stale in checkpoints_dir(run_dir).glob(".tmp-step_*"):
        shutil.rmtree(stale, ignore_errors=True)
