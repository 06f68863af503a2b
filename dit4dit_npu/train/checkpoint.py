"""Full-state checkpoints: the on-disk layout, written atomically, committed and pruned safely.

Layout of a run folder::

    <run_dir>/config.yaml               resolved config (written at start)
    <run_dir>/metrics.jsonl
    <run_dir>/checkpoints/step_000100/  complete checkpoint (renamed into place when done)
        state/                          accelerate/DeepSpeed state: model, optimizer, RNG of every rank
        policy/                         exported policy folder (inference only needs this)
        fingerprint.json                config and data a resume must agree with
        trainer_state.pt                step, LR scheduler, data cursor, world size, training seconds
        ema.safetensors                 the EMA of the trainable weights (trainer.ema on only)
        manifest.json                   every file above with its size and content hash, and its own
                                        hash (manifest_sha256, files.seal; written last)
    <run_dir>/checkpoints/.tmp-step_000100/       a save in progress; never read
    <run_dir>/checkpoints/.old-step_000100/       the copy a commit is replacing
    <run_dir>/checkpoints/.deleting-step_000100/  a checkpoint being pruned
    <run_dir>/checkpoints/damaged-step_000100/    set aside by a resume that found it damaged

Every change of a ``step_*`` folder is one rename, so a kill at any moment leaves each step
either complete or absent: a crash during a save leaves only ``.tmp-*``, during pruning only
``.deleting-*``, and between the two renames of a replacing commit the ``.old-*`` copy, which
the next start puts back (``clean_stale``). Which checkpoint a resume may use is ``resume.py``.

The manifest's hashes (``files.hash_files``: sha256 in 64 MiB pieces, hashed by parallel
threads) find a file damaged in place, same size and other bytes, which sizes alone cannot;
they are computed once per save, after the files are written (read back from the page cache),
and checked only for the checkpoint a resume is about to use.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from dit4dit_npu.config import Config, to_dict
from dit4dit_npu.files import HASH_SCHEME, SELF_HASH, hash_files, publish_folder, seal, seal_state

STEP_DIR = re.compile(r"^step_(\d+)$")
TRAINER_STATE, FINGERPRINT, MANIFEST = "trainer_state.pt", "fingerprint.json", "manifest.json"
COMPLETE_MARKER = TRAINER_STATE  # a step folder without it is not a checkpoint at all
TMP, OLD, DELETING, DAMAGED = ".tmp-", ".old-", ".deleting-", "damaged-"


# --------------------------------------------------------------------------------------------
# Fingerprints: what must not change between a checkpoint and the run resuming it
# --------------------------------------------------------------------------------------------


def fingerprint(cfg: Config) -> dict[str, Any]:
    """The config keys a resume must agree with (the seed and the split settings included: they
    decide which episodes are held out and the data order)."""
    d = to_dict(cfg.datasets.vla_data)
    return {
        "framework": to_dict(cfg.framework),
        "datasets.vla_data": {
            k: d[k]
            for k in (
                "data_mix", "video_delta_indices", "action_video_freq_ratio", "camera_keys", "image_size",
                "max_state_dim", "max_action_dim", "action_norm", "state_norm", "per_device_batch_size",
                "view_layout", "state_key", "action_key", "val_fraction", "val_episodes",
            )
        },
        "seed": cfg.seed,
        "trainer.gradient_accumulation_steps": cfg.trainer.gradient_accumulation_steps,
        "trainer.learning_rate": cfg.trainer.learning_rate,
        "trainer.freeze_modules": cfg.trainer.freeze_modules,
        # which steps have the video loss: a resume that changed them would continue another objective
        "trainer.video_loss_interval": cfg.trainer.video_loss_interval,
        "trainer.video_loss_span": cfg.trainer.video_loss_span,
        # A resume continues the average it saved: its settings (and whether it exists) must agree.
        "trainer.ema": to_dict(cfg.trainer.ema),
    }


def data_fingerprint(split: list[dict[str, list[int]]], io_dict: dict[str, Any]) -> dict[str, Any]:
    """What the data made of the config: the episode split (per data_mix entry, in order) and the
    PolicyIO with its statistics. New or edited episodes change one of them."""
    return {"split": split, "policy_io": io_dict}


def config_diffs(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Differences, ignoring keys a checkpoint of an older version did not record."""
    return _diff(saved, json.loads(json.dumps(now)))


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) & set(b)):
            out += _diff(a[k], b[k], f"{prefix}.{k}" if prefix else str(k))
        return out
    return [] if a == b else [f"{prefix}: checkpoint {a!r} vs config {b!r}"]


def read_fingerprint(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / FINGERPRINT).read_text())


# --------------------------------------------------------------------------------------------
# Writing one checkpoint
# --------------------------------------------------------------------------------------------


def checkpoints_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def tmp_dir_for(run_dir: Path, step: int) -> Path:
    return checkpoints_dir(run_dir) / f"{TMP}step_{step:06d}"


def final_dir_for(run_dir: Path, step: int) -> Path:
    return checkpoints_dir(run_dir) / f"step_{step:06d}"


def write_trainer_state(
    tmp: Path, cfg: Config, data_fp: dict[str, Any], step: int, scheduler, sampler_state: dict, world_size: int,
    train_time_s: float | None = None,
) -> None:
    (tmp / FINGERPRINT).write_text(json.dumps({**fingerprint(cfg), "data": data_fp}, indent=1))
    state = {
        "step": step, "scheduler": scheduler.state_dict(), "sampler": sampler_state, "world_size": world_size,
        # the schedule's length: a resume with another one follows another curve (CheckpointManager.load)
        "max_train_steps": cfg.trainer.max_train_steps,
        # and what moves it (trainer.lr_schedule_clock; train_time: the budget's share spent)
        "lr_schedule_clock": cfg.trainer.lr_schedule_clock, "max_train_time_s": cfg.trainer.max_train_time_s,
        # training seconds up to this step (train/budget.py: what counts); a resume continues the
        # count, and success curves against training time read it. None: unknown (see TrainClock)
        "train_time_s": train_time_s,
        # the unit of those seconds (trainer.train_time_clock): a resume must count in the same one
        "train_time_clock": cfg.trainer.train_time_clock,
    }
    torch.save(state, tmp / TRAINER_STATE)


def read_trainer_state(ckpt: Path) -> dict:
    return torch.load(ckpt / TRAINER_STATE, weights_only=False)


def write_manifest(folder: Path) -> None:
    """Every file of the finished checkpoint with its size and content hash: a truncated or
    missing file is found at resume from its size alone, one damaged in place from its hash; the
    manifest's own hash tells damage of the manifest from damage of the files it lists."""
    paths = [p for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST]
    known = _policy_hashes(folder / "policy")
    digests = {**known, **hash_files([p for p in paths if p not in known])}
    files = {
        p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": digests[p]} for p in paths
    }
    (folder / MANIFEST).write_text(json.dumps(seal({"hash": HASH_SCHEME, "files": files}), indent=1))


def _policy_hashes(policy: Path) -> dict[Path, str]:
    """The content hashes the policy export just recorded in its policy.json (same scheme, from the
    same bytes, moments ago), for the files still of their recorded size: a full-size policy's
    8 GiB of weights is hashed once per save, not twice. Nothing when it records none."""
    try:
        content = json.loads((policy / "policy.json").read_text()).get("content") or {}
        if content.get("hash") != HASH_SCHEME:
            return {}
        return {policy / rel: str(v["sha256"]) for rel, v in content["files"].items()
                if (policy / rel).is_file() and (policy / rel).stat().st_size == v["size"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


class ManifestHashError(ValueError):
    """A manifest.json that does not match its own hash: it, not its files, was damaged."""


def read_manifest(ckpt: Path) -> tuple[dict[str, int], dict[str, str], bool]:
    """(size of each file, content hash of each file that has one, whether the manifest carries
    its own hash): manifests of older versions list sizes only, or hashes without their own.
    Raises ValueError for a manifest that is not one or does not match its own hash."""
    d = json.loads((ckpt / MANIFEST).read_text())
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    if seal_state(d) == "broken":
        raise ManifestHashError(f"it does not match its own hash, {SELF_HASH}")
    files = d["files"]
    if not isinstance(files, dict):
        raise ValueError("'files' is not a mapping")
    sizes = {rel: int(v["size"] if isinstance(v, dict) else v) for rel, v in files.items()}
    if d.get("hash", HASH_SCHEME) != HASH_SCHEME:
        raise ValueError(f"hash scheme {d.get('hash')!r}, this version checks {HASH_SCHEME!r}")
    hashes = {rel: str(v["sha256"]) for rel, v in files.items() if isinstance(v, dict) and "sha256" in v}
    return sizes, hashes, seal_state(d) == "ok"


def commit(tmp: Path, final: Path) -> None:
    """Rename a finished save into place. Replacing a same-step checkpoint (from a run resumed
    at an earlier step) moves the old copy aside first, so one complete copy always exists."""
    # a kill between the two renames leaves only `old`: clean_stale() puts it back
    publish_folder(tmp, final, aside=final.with_name(OLD + final.name))


def prune(run_dir: Path, keep: int, protect: Path | None = None) -> None:
    """Keep the newest ``keep`` checkpoints, and ``protect``: the newest checkpoint known to be
    good (the one just saved, whose weights were checked finite and whose files were hashed),
    even when newer step numbers exist (a run resumed from an earlier checkpoint than the run
    folder's latest). Each doomed folder is renamed before it is deleted, so a kill half-way
    through a deletion never leaves a half-deleted ``step_*``."""
    for _, path in list_checkpoints(run_dir)[:-keep]:
        if protect is not None and path == protect:
            continue
        doomed = path.with_name(DELETING + path.name)
        shutil.rmtree(doomed, ignore_errors=True)  # a leftover of the same name would block the rename
        os.replace(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Reading the folder
# --------------------------------------------------------------------------------------------


def step_folders(run_dir: Path) -> list[tuple[int, Path]]:
    """Every ``step_*`` folder, complete or damaged, oldest first."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(found)


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Step folders that were committed (have their trainer state), oldest first."""
    return [(s, p) for s, p in step_folders(run_dir) if (p / COMPLETE_MARKER).is_file()]


def clean_stale(run_dir: Path) -> list[str]:
    """At start (rank 0): finish what a killed run left half-done. Returns what was done.

    ``.old-step_N`` without ``step_N`` is the only copy left by a kill inside ``commit``: it is put
    back. Everything else hidden (``.tmp-*``, ``.deleting-*``, an ``.old-*`` whose replacement
    landed) is a partial folder that would only hold the disk: it is removed.
    """
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    done = []
    for p in sorted(root.iterdir()):
        if p.name.startswith(OLD):
            final = p.with_name(p.name[len(OLD) :])
            if not final.exists():
                os.replace(p, final)
                done.append(f"restored {final} from {p.name} (a run was killed while replacing it)")
                continue
        if p.name.startswith((TMP, OLD, DELETING)):
            shutil.rmtree(p, ignore_errors=True)
            done.append(f"removed stale partial folder {p}")
    return done


# --------------------------------------------------------------------------------------------
# Save failures (is_out_of_space: dit4dit_npu.files)
# --------------------------------------------------------------------------------------------


def one_line(e: BaseException, limit: int = 200) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
