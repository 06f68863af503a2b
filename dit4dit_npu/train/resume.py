"""Which checkpoint a run continues from, and whether it is whole.

``trainer.resume=auto`` takes the newest checkpoint that passes ``checkpoint_problem``; a damaged
newer one is named, set aside as ``damaged-step_N`` (nothing is deleted) and the run falls back,
saying so. A checkpoint is whole when every file its manifest lists is there at its size and
with its content hash (a file damaged in place keeps its size: model, optimizer, RNG state, EMA,
trainer state alike), its trainer state and fingerprint read back, and it has the RNG state of
every rank that saved it (accelerate would otherwise skip a missing RNG file silently and the run
would continue inexactly). A checkpoint that cannot be verified (no manifest, a sizes-only one of
an older version, or a damaged manifest: it carries its own hash, so its damage is told from its
files') is resumed with one notice saying so (``ResumePoint.notice``), its other checks still made,
never set aside for the manifest's sake. Hashing reads the whole checkpoint, so only the candidate is hashed
(newest first, stopping at the first whole one), on rank 0 (``run_folder``). Once loaded, the
weights and the EMA must be finite too (``CheckpointManager.load``); a checkpoint that fails there is set
aside the same way (``run_folder.fall_back``). Then ``check_config`` (with ``check_train_time``) and ``check_data`` refuse a
resume whose config or training data differ from the checkpoint's, before anything is built or
written.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dit4dit_npu.config import Config, ConfigError
from dit4dit_npu.files import hash_files
from dit4dit_npu.train import checkpoint as ckpt_io
from dit4dit_npu.train.errors import TrainingError
from dit4dit_npu.transforms.policy_io import PolicyIO, PolicyIOError

RNG_FILE = "state/random_states_{rank}.pkl"  # accelerate's name for each rank's RNG state
RNG_MISSING = "is missing (the RNG state: the run would not continue exactly)"


@dataclass(frozen=True)
class ResumePoint:
    path: Path | None  # the checkpoint to continue from; None = fresh run
    damaged: list[tuple[Path, str]] = field(default_factory=list)  # newer ones skipped, with why
    notice: str | None = None  # why ``path``'s files could not be (fully) verified, when they could not


HASH_MISMATCH = "does not match the content hash recorded when it was saved (damaged in place: same size, other bytes)"


def checkpoint_problem(ckpt: Path, content: bool = True) -> str | None:
    """None if ``ckpt`` can be resumed from, else one line naming the bad file and what is wrong.
    ``content=False`` skips the hashes (reading every byte): sizes and small files only."""
    return inspect_checkpoint(ckpt, content)[0]


def inspect_checkpoint(ckpt: Path, content: bool = True) -> tuple[str | None, str | None]:
    """(``checkpoint_problem``, a notice when ``ckpt``'s files could not be verified: no manifest,
    a sizes-only one, or a damaged one)."""
    manifest = ckpt / ckpt_io.MANIFEST
    notice = None
    if not manifest.is_file():
        notice = (f"resume: {ckpt} has no {ckpt_io.MANIFEST} (saved by an older version): its files' sizes and content "
                  "cannot be verified; resuming it unverified")
    else:
        why = None
        try:
            sizes, hashes, sealed = ckpt_io.read_manifest(ckpt)
        except ckpt_io.ManifestHashError as e:
            why = str(e)
        except (OSError, ValueError, KeyError, TypeError) as e:
            why = f"unreadable: {type(e).__name__}: {ckpt_io.one_line(e, 120)}"
        if why is not None:  # the manifest, not the files it lists: nothing to check them against
            notice = (f"resume: {manifest} is damaged ({why}), so the files of {ckpt} cannot be verified against it; "
                      "resuming it unverified")
            sizes, hashes, sealed = {}, {}, False
        else:
            if not hashes:
                notice = (f"resume: {manifest} records sizes only (saved by an older version): a file damaged in place "
                          f"cannot be found; resuming {ckpt} with its sizes checked, its content unverified")
        problem = _listed_problem(ckpt, sizes, hashes, sealed, content)
        if problem is not None:
            return problem, None
    return _readable_problem(ckpt), notice


def _listed_problem(ckpt: Path, sizes: dict[str, int], hashes: dict[str, str], sealed: bool, content: bool) -> str | None:
    """The first file the manifest lists that is missing, of another size or other content."""
    for rel, size in sizes.items():
        p = ckpt / rel
        if not p.is_file():
            return f"{p} {RNG_MISSING if rel.startswith('state/random_states_') else 'is missing'}"
        if p.stat().st_size != size:
            return f"{p} is truncated or damaged ({p.stat().st_size} bytes, {size} when saved)"
    if content and hashes:
        try:
            now = hash_files([ckpt / rel for rel in hashes])
        except OSError as e:
            return f"{ckpt} cannot be read to verify it ({ckpt_io.one_line(e, 120)})"
        for rel in sorted(hashes):
            if now[ckpt / rel] != hashes[rel]:
                # a manifest without its own hash (older versions) may be the damaged one
                return f"{ckpt / rel} {HASH_MISMATCH}" + ("" if sealed else f" (or its entry in {ckpt_io.MANIFEST})")
    return None


def _readable_problem(ckpt: Path) -> str | None:
    """Checked also when a manifest exists: a manifest-less checkpoint (older versions) has only these."""
    state_path = ckpt / ckpt_io.TRAINER_STATE
    if not state_path.is_file():
        return f"{state_path} is missing"
    try:
        state = ckpt_io.read_trainer_state(ckpt)
        int(state["step"]), state["scheduler"], state["sampler"]
    except Exception as e:  # torch.load raises many types for a torn file; all mean "unreadable"
        return f"{state_path} is unreadable ({type(e).__name__}: {ckpt_io.one_line(e, 120)})"
    try:
        fp = ckpt_io.read_fingerprint(ckpt)
        if not isinstance(fp, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        return f"{ckpt / ckpt_io.FINGERPRINT} is missing"
    except (OSError, ValueError) as e:
        return f"{ckpt / ckpt_io.FINGERPRINT} is unreadable ({type(e).__name__})"
    for rank in range(int(state.get("world_size", 1))):
        rng = ckpt / RNG_FILE.format(rank=rank)
        if not rng.is_file():
            return f"{rng} {RNG_MISSING}"
        problem = _rng_problem(rng)
        if problem is not None:
            return f"{rng} {problem}"
    return None


def _rng_problem(rng: Path) -> str | None:
    """accelerate's ``load_state`` skips an RNG file it cannot read with one info log line, and the
    run continues inexactly: read it here as it does (a few KB per rank). Checkpoints with hashes
    are covered by them; this is for those without (older versions)."""
    from accelerate.utils import load

    try:
        states = load(rng)
        missing = [k for k in ("random_state", "numpy_random_seed", "torch_manual_seed") if k not in states]
    except Exception as e:  # torch.load/pickle raise many types (with long texts) for a damaged file
        return f"is unreadable ({type(e).__name__}; the RNG state: the run would not continue exactly)"
    if missing:
        return f"is unreadable (no {missing}; the RNG state: the run would not continue exactly)"
    return None


def choose(run_dir: Path) -> ResumePoint:
    """The newest whole checkpoint of ``run_dir`` (and the damaged newer ones), or an error when
    there are checkpoints but none is whole (a fresh start would prune them)."""
    damaged = []
    for _, path in reversed(ckpt_io.step_folders(run_dir)):
        problem, notice = inspect_checkpoint(path)
        if problem is None:
            return ResumePoint(path, damaged, notice)
        damaged.append((path, problem))
    if damaged:
        raise TrainingError(
            f"no complete checkpoint to resume in {ckpt_io.checkpoints_dir(run_dir)}: "
            + "; ".join(f"{p.name}: {why}" for p, why in damaged)
            + " (move them away to start the run fresh)"
        )
    return ResumePoint(None)


def find_resume(cfg: Config) -> ResumePoint:
    """trainer.resume: null -> fresh, "auto" -> newest whole checkpoint (or fresh), else that path."""
    r = cfg.trainer.resume
    if r is None:
        return ResumePoint(None)
    if r == "auto":
        return choose(cfg.run_dir)
    p = Path(r)
    if not p.is_dir():
        raise ConfigError(f"trainer.resume: checkpoint folder not found: {p}")
    problem, notice = inspect_checkpoint(p)
    if problem is not None:
        raise ConfigError(f"trainer.resume: {p} cannot be resumed from: {problem}")
    return ResumePoint(p, notice=notice)


def set_aside(damaged: list[tuple[Path, str]]) -> list[str]:
    """Rename damaged checkpoints out of the ``step_*`` namespace (rank 0): nothing later reads
    them as the latest policy, a later save of that step does not collide, and no byte is lost."""
    done = []
    for path, problem in damaged:
        target = path.with_name(ckpt_io.DAMAGED + path.name)
        n = 1
        while target.exists():
            n += 1
            target = path.with_name(f"{ckpt_io.DAMAGED}{n}-{path.name}")
        os.replace(path, target)
        done.append(f"resume: {problem}; moved {path.name} to {target.name}")
    return done


# --------------------------------------------------------------------------------------------
# Agreement checks
# --------------------------------------------------------------------------------------------


def check_config(ckpt: Path, cfg: Config) -> None:
    diffs = ckpt_io.config_diffs(ckpt_io.read_fingerprint(ckpt), ckpt_io.fingerprint(cfg))
    if diffs:
        raise ConfigError(f"checkpoint {ckpt} was made with another config: " + "; ".join(diffs[:5]))
    check_train_time(ckpt, cfg)


def check_train_time(ckpt: Path, cfg: Config) -> None:
    """A run with a budget or time checkpoints (trainer.max_train_time_s, trainer.save_every_s)
    continues the checkpoint's count of training seconds: refused when the checkpoint does not
    record it, or counted it on the other trainer.train_time_clock (wall seconds continued as CPU
    seconds, or back, end the budget where neither count says). Here, with the config, because
    this is before the run folder's config.yaml is rewritten and anything is built. A checkpoint
    that records its seconds but not its clock (versions that had both clocks and did not record
    which) may have counted on either: not refused. Without a budget the count drives nothing."""
    t = cfg.trainer
    if t.max_train_time_s is None and t.save_every_s is None:
        return
    state = ckpt_io.read_trainer_state(ckpt)
    if state.get("train_time_s") is None:
        raise TrainingError(
            f"{ckpt} does not record its training time (saved by an older version): resume it without "
            "trainer.max_train_time_s and trainer.save_every_s, or start a new run (another run_id)"
        )
    was = state.get("train_time_clock", t.train_time_clock)
    if was != t.train_time_clock:
        raise TrainingError(
            f"{ckpt} counted its training seconds by trainer.train_time_clock={was}, this run by "
            f"{t.train_time_clock}: resume it with trainer.train_time_clock={was}, or start a new run (another run_id)"
        )


def check_data(ckpt: Path, data_fp: dict[str, Any]) -> str | None:
    """Refuse a resume whose training data changed since ``ckpt``: new or edited episodes move
    the normalization statistics or the split under a model trained on the old ones. Returns a
    note when the checkpoint predates data fingerprints (nothing could be compared)."""
    if ckpt_io.read_fingerprint(ckpt).get("data") is None:
        return f"note: {ckpt} records no data fingerprint (older version): data changes cannot be detected"
    what = data_change(ckpt, data_fp)
    if what:
        raise TrainingError(
            f"the training data changed since checkpoint {ckpt}: {what}; resume with the data it was "
            "trained on, or start a new run (another run_id)"
        )
    return None


def data_change(ckpt: Path, data_fp: dict[str, Any]) -> str | None:
    """What differs between the data ``ckpt`` was trained on and ``data_fp`` (``data_fingerprint``);
    None when nothing does, or when ``ckpt`` predates data fingerprints."""
    saved = ckpt_io.read_fingerprint(ckpt).get("data")
    return None if saved is None else _data_change(saved, json.loads(json.dumps(data_fp)))


def _data_change(saved: dict[str, Any], now: dict[str, Any]) -> str | None:
    for i, (a, b) in enumerate(zip(saved.get("split", []), now["split"])):
        for part in ("train", "val"):
            if a.get(part) != b.get(part):
                added = sorted(set(b.get(part, [])) - set(a.get(part, [])))
                gone = sorted(set(a.get(part, [])) - set(b.get(part, [])))
                return f"data_mix[{i}] {part} episodes differ (new: {added[:5]}, gone: {gone[:5]})"
    io_a, io_b = _current_format(saved.get("policy_io", {})), now["policy_io"]
    for feature in sorted(set(io_a.get("stats", {})) | set(io_b.get("stats", {}))):
        sa, sb = io_a.get("stats", {}).get(feature, {}), io_b.get("stats", {}).get(feature, {})
        for stat in sorted(set(sa) | set(sb)):
            if sa.get(stat) != sb.get(stat):
                return f"{feature} statistics differ ({stat}: {_first_difference(sa.get(stat), sb.get(stat))})"
    for key in sorted(set(io_a) | set(io_b)):
        if key != "stats" and io_a.get(key) != io_b.get(key):
            return f"PolicyIO {key} differs (checkpoint {io_a.get(key)!r}, now {io_b.get(key)!r})"
    return None


def _current_format(io: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's PolicyIO in today's policy_io.json format (older ones state the same
    settings as top-level keys); one that does not parse is compared as it is."""
    try:
        return PolicyIO.from_dict(io).to_dict() if io else io
    except PolicyIOError:
        return io


def _first_difference(a: Any, b: Any) -> str:
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        i = int(np.flatnonzero(np.asarray(a) != np.asarray(b))[0])
        return f"dim {i} was {a[i]:.6g}, now {b[i]:.6g}"
    return f"was {a!r}, now {b!r}"
