"""Opening a run folder: check everything that can refuse the run before anything is written.

A refused run overwrites nothing: the folder must be writable and, with several ranks, one folder
that every rank sees (rank 0 writes a token, every rank reads it back: node-local storage on a
multi-node run stops here, on every rank, in one line), a fresh run must not land on
another run's checkpoints, and a resumed run's checkpoint must be whole (``resume.py``: a damaged
newest one is named and the run falls back to the newest whole one) and made with a compatible
config. Then rank 0 finishes what a killed run left half-done (partial ``.tmp-*`` saves,
half-pruned folders, a half-replaced checkpoint) and sets damaged checkpoints aside. Every rank
waits for that before it reads the folder again. Rank 0 alone verifies the candidates (hashing
reads every byte of a checkpoint: once, not once per rank) and ``share`` hands its choice, or its
refusal, to every rank, so all continue from the same checkpoint or all stop with the same line. ``config.yaml`` is written by ``record_config``
once the data has been checked too (a resume on changed data is refused after ``open_run``).
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dit4dit_npu.config import Config, ConfigError, save_config
from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.files import atomic_write_text
from dit4dit_npu.train import checkpoint as ckpt_io
from dit4dit_npu.train import resume
from dit4dit_npu.train.errors import TrainingError

Share = Callable[[Any], Any]  # rank 0's value on every rank (collective); identity for one process


@dataclass(frozen=True)
class RunFolder:
    path: Path
    resume_from: Path | None  # the checkpoint to continue from; None for a fresh run
    created: bool = False  # this run made the folder (it may take it away again, see discard_if_unused)


SHARED_TOKEN = ".shared-check"  # hidden: never matched by the step_* globs of a run folder


def open_run(
    cfg: Config,
    is_main: bool,
    barrier: Callable[[], None] = lambda: None,
    share: Share = lambda x: x,
    gather: Callable[[Any], list[Any]] | None = None,
) -> RunFolder:
    """``share`` gives rank 0's value to every rank; ``gather`` (a collective: every rank's value,
    in rank order, on every rank) is given when there are several ranks: they check that they all
    see the same folder."""
    path = cfg.run_dir
    created = not path.exists()
    barrier()  # every rank looked before any rank creates it
    _check_writable(path)
    if gather is not None:
        _check_shared(path, is_main, barrier, gather, created)
    if is_main:  # before choosing: a kill inside a commit may have left the only copy aside
        for line in ckpt_io.clean_stale(path):
            _say(line)
    barrier()
    if cfg.trainer.resume is None and ckpt_io.step_folders(path):
        raise ConfigError(
            f"{path} already has checkpoints: continue it with trainer.resume=auto, "
            "or choose another run_id (nothing was overwritten)"
        )
    return RunFolder(path, _choose(cfg, is_main, barrier, share), created)


def _choose(
    cfg: Config, is_main: bool, barrier: Callable[[], None], share: Share, falling_back: bool = False
) -> Path | None:
    """The checkpoint to continue from (rank 0 verifies, every rank gets its answer), damaged
    newer ones set aside; raises on every rank alike."""
    outcome: Any = None
    if is_main:
        try:
            point = resume.find_resume(cfg)
            if point.path is not None:
                resume.check_config(point.path, cfg)
            outcome = point
        except DiT4DiTError as e:
            outcome = e
    outcome = share(outcome)
    if isinstance(outcome, BaseException):
        raise outcome
    if is_main:
        for line in resume.set_aside(outcome.damaged):
            _say(line)
        if (outcome.damaged or falling_back) and outcome.path is not None:
            _say(f"resume: falling back to {outcome.path}")
        if outcome.notice is not None:  # its files could not be verified (older version, damaged manifest)
            _say(outcome.notice)
    barrier()
    return outcome.path


def fall_back(
    cfg: Config, run: RunFolder, bad: Path, problem: str, is_main: bool,
    barrier: Callable[[], None] = lambda: None, share: Share = lambda x: x,
) -> RunFolder:
    """``bad`` passed every check on disk but failed once loaded (``problem``: non-finite weights
    or EMA, saved by a version that did not check them): set it aside like any damaged
    checkpoint and choose again. Only ``trainer.resume=auto`` falls back; a checkpoint named
    explicitly is refused. With nothing left to fall back to, the run stops (a fresh start in a
    folder of set-aside checkpoints is not what a resume asked for)."""
    if cfg.trainer.resume != "auto":
        raise ConfigError(f"trainer.resume: {bad} cannot be resumed from: {problem}")
    barrier()  # every rank has stopped reading it before rank 0 renames it
    if is_main:
        for line in resume.set_aside([(bad, problem)]):
            _say(line)
    barrier()
    path = _choose(cfg, is_main, barrier, share, falling_back=True)
    if path is None:
        raise TrainingError(
            f"no checkpoint left to resume in {ckpt_io.checkpoints_dir(run.path)}: {problem} "
            "(move the damaged-* folders away to start the run fresh)"
        )
    return replace(run, resume_from=path)


def record_config(cfg: Config, run: RunFolder, is_main: bool) -> None:
    """``config.yaml``, only once the run is known to be valid (config and data checked)."""
    if is_main:
        save_config(cfg, run.path / "config.yaml")


def discard_if_unused(run: RunFolder, is_main: bool) -> None:
    """A run that this call created and that failed before writing anything but its config
    leaves no folder behind (a refused start writes nothing); any other content stays."""
    if not (is_main and run.created):
        return
    try:
        if [p.name for p in run.path.iterdir()] == ["config.yaml"]:
            (run.path / "config.yaml").unlink()
        run.path.rmdir()  # only when empty
    except OSError:
        pass


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _check_shared(path: Path, is_main: bool, barrier: Callable[[], None], gather: Callable[[Any], list[Any]],
                  created: bool) -> None:
    """Rank 0 writes a token only this start knows; every rank reads it back and all compare
    what they saw, so every rank stops with the same line when any rank sees another folder (a
    node-local disk), instead of the others waiting for it at the next barrier."""
    token = path / SHARED_TOKEN
    if is_main:
        atomic_write_text(token, uuid.uuid4().hex)
    barrier()
    try:
        seen = token.read_text()
    except OSError:
        seen = None
    views = gather((socket.gethostname(), seen))  # collective: every rank has read it after this
    if is_main:
        token.unlink(missing_ok=True)
    blind = [f"{rank} ({host})" for rank, (host, text) in enumerate(views) if text != views[0][1]]
    if not blind:
        return
    if created:
        try:
            path.rmdir()  # a refused start leaves no folder behind (only when empty)
        except OSError:
            pass
    ranks = ", ".join(blind[:8]) + (f" and {len(blind) - 8} more" if len(blind) > 8 else "")
    raise ConfigError(
        f"run_root_dir/run_id: {path} is not one folder shared by all ranks: rank {ranks} "
        f"{'does' if len(blind) == 1 else 'do'} not see what rank 0 ({views[0][0]}) wrote there; every node must "
        "see the same run folder (shared storage such as NFS or Lustre)"
    )


def _check_writable(path: Path) -> None:
    # Every rank probes (its own file): on a multi-node run each node may mount the folder itself.
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"run_root_dir/run_id: cannot write to {path} ({e.strerror})") from None
