"""Opening a run folder: check everything that can refuse the run before anything is written.

A refused run overwrites nothing: the folder must be writable, a fresh run must not land on
another run's checkpoints, and a resumed run's checkpoint must have been made with a compatible
config. Only then does rank 0 write ``config.yaml``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dit4dit_npu.config import Config, ConfigError, save_config
from dit4dit_npu.train import checkpoint as ckpt_io


@dataclass(frozen=True)
class RunFolder:
    path: Path
    resume_from: Path | None  # the checkpoint to continue from; None for a fresh run


def open_run(cfg: Config, is_main: bool) -> RunFolder:
    path = cfg.run_dir
    _check_writable(path)
    if cfg.trainer.resume is None and ckpt_io.list_checkpoints(path):
        raise ConfigError(
            f"{path} already has checkpoints: continue it with trainer.resume=auto, "
            "or choose another run_id (nothing was overwritten)"
        )
    resume_from = ckpt_io.find_resume(cfg)
    if resume_from is not None:
        ckpt_io.check_fingerprint(resume_from, cfg)
    if is_main:  # only once the run is known to be valid
        save_config(cfg, path / "config.yaml")
    return RunFolder(path, resume_from)


def _check_writable(path: Path) -> None:
    # Every rank probes (its own file): on a multi-node run each node may mount the folder itself.
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"run_root_dir/run_id: cannot write to {path} ({e.strerror})") from None
