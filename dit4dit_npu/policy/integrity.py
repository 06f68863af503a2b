"""What the files of one policy folder must still agree on, checked before a policy may act.

Each fact has one file (``manifest.py``), so there are no copies to compare; what remains is what
one file says about another's content. Copied, hand-edited or mixed with files of another run,
each can still parse while the whole is wrong; these checks name the file at fault, so the
policy (not the dataset or the robot) is blamed:

- ``policy.json``'s step vs ``model.safetensors`` (and the adapter): files of two checkpoints.
  Checked from the weight files' headers before their content hashes (``step_problem``): a
  policy.json copied from another checkpoint of the same run still matches its own hash, and
  only the step each side records tells that the files come from two checkpoints, not that a
  weight file was changed after export;
- ``policy_io.json``'s state/action widths vs the action head's weight shapes;
- statistics and weights must be finite: a single NaN makes every action NaN;
- (format_version 4) every file loading reads still has the size and content hash recorded in
  ``policy.json``'s ``content`` section when it was written: a file changed in place (same size,
  other bytes: a LoRA adapter with every weight changed) parses and is finite, only its hash
  tells (``content_section``, ``content_problem``; the hashing itself is ``files.py``'s).
(The adapter against the manifest's LoRA settings: ``adapter.py``.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dit4dit_npu.files import HASH_SCHEME, edges_hash, hash_files
from dit4dit_npu.transforms.feature_stats import STAT_FIELDS
from dit4dit_npu.transforms.policy_io import PolicyIO

# (weight, axis of its shape, what it is the width of): the action head's ends, which PolicyIO's
# widths must fit (models/action_head.py: state MLP, action encoder W1, action decoder).
WIDTH_WEIGHTS = (
    ("action_model.state_encoder.0.weight", 1, "state"),
    ("action_model.action_encoder.W1.weight", 1, "action"),
    ("action_model.action_decoder.2.weight", 0, "action"),
)


def nonfinite_stats(io: PolicyIO) -> str | None:
    """The first statistic that is NaN/inf, or inverted (min above max, q01 above q99, a negative
    std: a writer's bug or an edit; such statistics unnormalize to wrong actions without a word)."""
    for feature, stats in sorted(io.stats.items()):
        for name in STAT_FIELDS:
            bad = np.flatnonzero(~np.isfinite(getattr(stats, name)))
            if len(bad):
                return f"{feature} statistic {name!r} is NaN/inf in dims {bad[:5].tolist()}"
        for low, high in (("min", "max"), ("q01", "q99")):
            bad = np.flatnonzero(getattr(stats, low) > getattr(stats, high))
            if len(bad):
                return f"{feature} statistic {low!r} exceeds {high!r} in dims {bad[:5].tolist()}"
        bad = np.flatnonzero(stats.std < 0)
        if len(bad):
            return f"{feature} statistic 'std' is negative in dims {bad[:5].tolist()}"
    return None


def width_problem(io: PolicyIO, weights: dict[str, Any]) -> str | None:
    """policy_io.json's encoded+padded state/action widths against the action head's weights
    (which set them at training); None when they fit or the weights hold no action head."""
    widths = {"state": io.state.out_dim, "action": io.action.out_dim}
    for key, axis, what in WIDTH_WEIGHTS:
        if key in weights and int(weights[key].shape[axis]) != widths[what]:
            return (
                f"policy_io.json's {what} width is {widths[what]} but the action head in model.safetensors "
                f"takes {int(weights[key].shape[axis])} ({key} {list(weights[key].shape)})"
            )
    if widths["state"] and any(k.startswith("action_model.") for k in weights) and WIDTH_WEIGHTS[0][0] not in weights:
        return f"policy_io.json's state width is {widths['state']} but the action head in model.safetensors takes no state"
    return None


def nonfinite_weights(weights: dict[str, Any]) -> str | None:
    """The first tensor holding NaN/inf (``weights/finite.py``: no second copy of the model)."""
    from dit4dit_npu.weights.finite import nonfinite

    return nonfinite(weights.items())


def feature_names(dataset_paths: Sequence[str | Path], key: str, dim: int) -> list[str] | None:
    """Names of a vector feature's dims from the first dataset's info.json (None when absent);
    warnings about live states name joints with them."""
    for root in dataset_paths:
        try:
            names = json.loads((Path(root) / "meta" / "info.json").read_text())["features"][key].get("names")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if isinstance(names, dict):  # lerobot's {"motors": [...]} form
            names = next(iter(names.values()), None)
        if isinstance(names, list) and len(names) == dim and all(isinstance(n, str) for n in names):
            return names
    return None


def two_checkpoints(file: Path, what: str, saved_step: Any, policy_json: Path, step: Any) -> str:
    return (
        f"{policy_json.parent} holds files of two checkpoints: "
        f"{policy_json} records step {step!r} but {file} holds the {what} of step {saved_step} "
        "(copy every file of one checkpoint's policy folder)"
    )


def step_problem(folder: Path, step: Any, files: Sequence[tuple[str, str]]) -> str | None:
    """The first of ``files`` ((path relative to ``folder``, what it holds)) whose safetensors
    header records a step other than ``step`` (policy.json's), as one line; None when they agree.
    Only headers are read; a file whose header does not read is left to the checks that name it."""
    from safetensors import safe_open

    for rel, what in files:
        try:
            with safe_open(str(folder / rel), framework="pt") as f:
                saved_step = (f.metadata() or {}).get("step")
        except Exception:  # safetensors raises its own error types for a truncated/damaged file
            continue
        if saved_step is not None and str(saved_step) != str(step):
            return two_checkpoints(folder / rel, what, saved_step, folder / "policy.json", step)
    return None


def read_weights(file: Path, step: Any, policy_json: Path, what: str) -> tuple[dict[str, Any] | None, str | None]:
    """(weights, None), or (None, one line saying what is wrong): ``file`` is a readable
    safetensors file of the step ``policy_json`` records, and every tensor in it is finite.
    ``what`` names its content in the message ("weights", "adapter")."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            meta = f.metadata() or {}
            weights = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for a truncated/damaged file
        return None, f"{file}: not a readable safetensors file ({e})"
    saved_step = meta.get("step")
    if saved_step is not None and str(saved_step) != str(step):
        return None, two_checkpoints(file, what, saved_step, policy_json, step)
    bad = nonfinite_weights(weights)
    if bad:
        return None, f"{file}: {bad}; refusing a policy whose actions would be non-finite"
    return weights, None


# Files up to this size are hashed whole at every load: adapters, policy_io.json, the prompt cache
# (~1 GiB at full size with 10 instructions). Larger ones are checked by size and ``edges_hash``
# (the first and last MiB: safetensors' header, with every tensor's name, shape and offset, is at
# the start) unless a full check is asked for (``doctor --policy``, ``convert to-dit4dit``,
# ``from_pretrained(..., full_check=True)``). Measured on the 2-core dev host (docs/policy_format.md):
# a full-size model.safetensors (8.28 GiB of fp32 weights) takes 2.9 s of sha256 when the host is
# idle and its pages cached, 11-26 s under load; 2 GiB takes 3.2-3.7 s under load; a tiny folder 7 ms.
ALWAYS_HASHED_BYTES = 2 * 2**30
CHANGED = "does not match the content hash recorded when the policy was written (changed after export)"


def content_section(folder: Path, files: Sequence[str], always_hashed: int = ALWAYS_HASHED_BYTES) -> dict[str, Any]:
    """policy.json's ``content``: each of ``files`` (relative to ``folder``) with its size and
    content hash, and the edges hash of those too large to hash whole at every load."""
    paths = [folder / rel for rel in files]
    digests = hash_files(paths)
    out = {}
    for rel, p in zip(files, paths):
        size = p.stat().st_size
        out[rel] = {"size": size, "sha256": digests[p]}
        if size > always_hashed:
            out[rel]["edges_sha256"] = edges_hash(p)
    return {"hash": HASH_SCHEME, "files": out}


def content_problem(
    folder: Path, section: Any, read: Sequence[str], full: bool, always_hashed: int = ALWAYS_HASHED_BYTES
) -> str | None:
    """One line naming the first file of ``read`` (the files loading reads, relative to
    ``folder``) that is not as ``section`` (policy.json's ``content``) recorded it, else None.
    ``full`` hashes every file whole; otherwise large ones are checked by size and edges."""
    where = f"{folder / 'policy.json'} content"
    files = section.get("files") if isinstance(section, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, dict) and {"size", "sha256"} <= set(v) for v in files.values()):
        return f"{where}: expected {{'hash': ..., 'files': {{name: {{'size': ..., 'sha256': ...}}}}}}, got {section!r:.120}"
    if section.get("hash") != HASH_SCHEME:
        return f"{where}: hash scheme {section.get('hash')!r}, this version checks {HASH_SCHEME!r}"
    unlisted = [rel for rel in read if rel not in files]
    if unlisted:
        return f"{folder / unlisted[0]} has no content hash in {folder / 'policy.json'} (added after export?)"
    whole = []
    for rel in read:
        p, rec = folder / rel, files[rel]
        size = p.stat().st_size
        if size != rec["size"]:
            return f"{p} has {size} bytes, {rec['size']} when the policy was written (truncated or replaced after export)"
        if full or size <= always_hashed or "edges_sha256" not in rec:
            whole.append(rel)
        elif edges_hash(p) != rec["edges_sha256"]:
            return f"{p} {CHANGED}"
    try:
        digests = hash_files([folder / rel for rel in whole])
    except OSError as e:
        return f"{folder} cannot be read to verify it ({e})"
    for rel in whole:
        if digests[folder / rel] != files[rel]["sha256"]:
            return f"{folder / rel} {CHANGED}"
    return None
