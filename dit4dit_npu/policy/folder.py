"""The exported policy folder: everything inference needs, each fact in one file.

    <policy>/policy.json               the manifest (format_version 4, manifest.py): step, the
                                       model section (framework + precision, base model ref),
                                       datasets + held-out episodes, joint names; the size and
                                       content hash of every file below that loading reads, and
                                       its own hash (``manifest_sha256``)
    <policy>/policy_io.json            every robot <-> model transform (cameras, sizes, clip,
                                       chunk length, state encoding, action normalization,
                                       padding) and the training data's statistics
    <policy>/model.safetensors         trainable weights only (transformer + action head; the
                                       action head only under LoRA)
    <policy>/adapter/                  LoRA only: the transformer's adapter in peft's layout
                                       (adapter_model.safetensors, adapter_config.json; adapter.py)
    <policy>/prompt_cache.safetensors  embeddings of every training instruction
    <policy>/train_config.yaml         the run's whole config, for the record: never read (so
                                       not hashed: editing it changes nothing)

The frozen base model (VAE, text encoder; "tiny" or a local Cosmos folder) is referred to by
path, never copied (the original stored ~21 GB of frozen weights in every checkpoint).
The folder is written to a temporary sibling and renamed into place, so a crash never leaves a
half-written policy that looks complete. Loading reads the manifest and PolicyIO, never the
training schema; it first checks the manifest's own hash and every file's size and hash
(``integrity.content_problem``: large files by their edges unless ``full_check``), so a file
changed after export is one line naming it. Folders of format_version 3 (and 2, through
``legacy.py``) hold no hashes: they load unverified, with one ``UnverifiedPolicyWarning``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dit4dit_npu.config import Config, ConfigError, dump_yaml
from dit4dit_npu.config.objective import TRANSFORMER
from dit4dit_npu.errors import DiT4DiTError, DiT4DiTWarning
from dit4dit_npu.files import SELF_HASH, atomic_folder, seal, seal_state
from dit4dit_npu.policy.adapter import (
    ADAPTER_FILES,
    ADAPTER_WEIGHTS,
    adapter_problems,
    read_adapter,
    write_adapter,
)
from dit4dit_npu.policy.integrity import (
    content_problem,
    content_section,
    feature_names,
    nonfinite_stats,
    read_weights,
    step_problem,
    width_problem,
)
from dit4dit_npu.policy.legacy import CONFIG_V2, read_v2
from dit4dit_npu.policy.manifest import (
    CONTENT,
    FORMAT_VERSION,
    ManifestError,
    PolicyManifest,
    inference_config,
    manifest_of_run,
    parse_manifest,
)
from dit4dit_npu.transforms.policy_io import PolicyIO, PolicyIOError

POLICY_JSON, WEIGHTS, POLICY_IO, PROMPTS, TRAIN_CONFIG = (
    "policy.json",
    "model.safetensors",
    "policy_io.json",
    "prompt_cache.safetensors",
    "train_config.yaml",
)
REQUIRED_FILES = (POLICY_JSON, WEIGHTS, POLICY_IO, PROMPTS)
STEP_FILES = {WEIGHTS: "weights", ADAPTER_WEIGHTS: "adapter"}  # weight files that record their step
TRAIN_CONFIG_NOTE = "the run's config, kept for the record; loading the policy never reads it (policy.json does)"


class PolicyLoadError(DiT4DiTError, RuntimeError):
    """A policy folder that cannot be loaded (missing files, other format version, bad base model)."""


class UnverifiedPolicyWarning(DiT4DiTWarning):
    """A policy folder of a format that records no content hashes: its files load unchecked."""


def _read_v2(path: Path, raw: dict[str, Any], io: PolicyIO) -> PolicyManifest:
    try:
        return read_v2(raw, path / CONFIG_V2, io.chunk_length)
    except (ManifestError, ConfigError) as e:  # a key of either file
        raise PolicyLoadError(f"{path} (format_version 2: {POLICY_JSON} + {CONFIG_V2}): {e}") from None


def _read_v3(path: Path, raw: dict[str, Any], io: PolicyIO) -> PolicyManifest:
    try:
        return parse_manifest(raw, io.chunk_length)
    except ManifestError as e:
        raise PolicyLoadError(f"{path / POLICY_JSON}: {e}") from None


@dataclass(frozen=True)
class FormatVersion:
    """What a readable format_version requires and how its manifest is read. A later change of the
    folder is one more entry (its own reader, or an older reader plus what it drops or renames);
    the files' own formats (policy_io.json's "format", peft's adapter) are their readers' own."""

    files: tuple[str, ...]  # required besides the adapter (checked against the LoRA settings)
    hashed: bool  # records the content hash of each file and of policy.json itself
    read: Callable[[Path, dict[str, Any], PolicyIO], PolicyManifest]  # (folder, policy.json, io)


READABLE_VERSIONS = {
    2: FormatVersion((*REQUIRED_FILES, CONFIG_V2), hashed=False, read=_read_v2),
    3: FormatVersion(REQUIRED_FILES, hashed=False, read=_read_v3),
    FORMAT_VERSION: FormatVersion(REQUIRED_FILES, hashed=True, read=_read_v3),
}


def export_policy(
    out_dir: str | Path,
    model: Any,
    cfg: Config,
    io: PolicyIO,
    prompt_cache: Any,
    split: dict[str, Any],
    dataset_paths: list[str] | list[Path],
    step: int,
    statistics_tag: str | None = None,
    num_trajectories: int | None = None,
) -> Path:
    """Write the policy folder ``out_dir`` (format_version 4) atomically; returns it.

    ``split`` maps each dataset path to ``{"train": [...], "val": [...]}`` (or directly to the
    held-out episode list); the held-out episodes are what ``dit4dit_npu.eval`` evaluates on.
    """
    from safetensors.torch import save_file

    from dit4dit_npu.models.lora import has_lora
    from dit4dit_npu.weights.prompt_cache import save_prompt_cache

    paths = [str(Path(p).resolve()) for p in dataset_paths]
    d = cfg.datasets.vla_data
    manifest = manifest_of_run(
        cfg, split, dataset_paths, step,
        # joint names (from the first dataset's info.json) for messages about live inputs
        state_names=feature_names(paths, d.state_key, io.state_dim),
        action_names=feature_names(paths, d.action_key, io.action_dim),
        statistics_tag=statistics_tag, num_trajectories=num_trajectories,
    )

    # replaces an existing folder: the old one is moved aside first so `out` is never half-new
    with atomic_folder(Path(out_dir)) as tmp:
        # Own, contiguous CPU storage per tensor: safetensors refuses shared/strided storage.
        weights = {k: v.detach().cpu().clone().contiguous() for k, v in model.trainable_state_dict().items()}
        save_file(weights, str(tmp / WEIGHTS), metadata={"format": "dit4dit_npu.policy", "step": str(step)})
        if has_lora(model.backbone.transformer):
            write_adapter(tmp, model.backbone.transformer, step)
        io.save(tmp / POLICY_IO)
        save_prompt_cache(prompt_cache, tmp / PROMPTS)
        (tmp / TRAIN_CONFIG).write_text(f"# {TRAIN_CONFIG_NOTE}\n" + dump_yaml(cfg))
        write_policy_json(tmp, manifest.to_json())
    return Path(out_dir)


def files_read(folder: Path) -> list[str]:
    """The files of a policy folder that loading reads besides policy.json (relative paths)."""
    return [f for f in (WEIGHTS, POLICY_IO, PROMPTS, *ADAPTER_FILES) if (folder / f).is_file()]


def write_policy_json(folder: Path, manifest: dict[str, Any]) -> None:
    """policy.json (written last): the manifest (``PolicyManifest.to_json()``), the size and
    content hash of every file loading reads, as they are in ``folder`` now, and its own hash."""
    content = content_section(folder, files_read(folder))
    (folder / POLICY_JSON).write_text(json.dumps(seal({**manifest, CONTENT: content}), indent=1))


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def find_policy_dir(path: str | Path) -> Path:
    """Accept the policy folder itself, a checkpoint folder holding ``policy/``, or a run folder
    (its latest complete checkpoint)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise PolicyLoadError(f"policy folder not found: {p}")
    if (p / POLICY_JSON).is_file():
        return p
    if (p / "policy" / POLICY_JSON).is_file():
        return p / "policy"
    ckpts = sorted(q for q in (p / "checkpoints").glob("step_*") if (q / "policy" / POLICY_JSON).is_file())
    if ckpts:
        return ckpts[-1] / "policy"
    raise PolicyLoadError(
        f"{p} is not a policy folder: no {POLICY_JSON} in it, in {p / 'policy'} or under {p / 'checkpoints'} "
        f"(an exported policy has {', '.join(REQUIRED_FILES)})"
    )


def model_file(version: int) -> str:
    """The file of a folder of this format_version that holds the model section."""
    return CONFIG_V2 if version == 2 else POLICY_JSON


def framework_key(version: int) -> str:
    """Where the framework section is, in messages: ``policy.json model.framework``."""
    return f"{CONFIG_V2} framework" if version == 2 else f"{POLICY_JSON} model.framework"


def read_manifest(path: Path, raw: dict[str, Any], io: PolicyIO) -> PolicyManifest:
    """The manifest of the policy folder ``path`` from its parsed policy.json, read as its
    format_version is (``READABLE_VERSIONS``); ``io`` is its PolicyIO, whose chunk length the
    model takes."""
    return READABLE_VERSIONS[raw["format_version"]].read(path, raw, io)


def read_policy_json(path: Path, full_check: bool = False) -> dict[str, Any]:
    """policy.json parsed, of a readable format_version, with the files that version requires,
    each as it was written (``check_content``; ``full_check``: large files hashed whole too)."""
    try:
        raw = json.loads((path / POLICY_JSON).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PolicyLoadError(f"{path / POLICY_JSON}: unreadable ({e})") from None
    version = raw.get("format_version") if isinstance(raw, dict) else None
    if isinstance(version, bool) or not isinstance(version, int) or version not in READABLE_VERSIONS:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION
        raise PolicyLoadError(
            f"{path}: policy format_version {version!r} is not supported by this dit4dit_npu (it reads versions "
            f"{sorted(READABLE_VERSIONS)})" + ("; a newer dit4dit_npu wrote it: update this one" if newer else "")
        )
    missing = [f for f in READABLE_VERSIONS[version].files if not (path / f).is_file()]
    if missing:
        raise PolicyLoadError(f"{path}: policy folder is incomplete, missing {missing}")
    check_content(path, raw, full_check)
    return raw


def check_content(path: Path, raw: dict[str, Any], full_check: bool = False) -> None:
    """The manifest's own hash, then every file loading reads against the size and hash it
    recorded: PolicyLoadError naming the file. A format without hashes: one warning, unchecked."""
    version = raw["format_version"]
    if not READABLE_VERSIONS[version].hashed:
        warnings.warn(
            f"{path}: policy format_version {version} records no content hashes, so its files load unverified "
            "(a file changed after export goes unseen; export it again to have them checked)",
            UnverifiedPolicyWarning, stacklevel=5,  # the caller of from_pretrained
        )
        return
    state = seal_state(raw)
    if state != "ok":
        what = "does not match its own content hash" if state == "broken" else "records no content hash of its own"
        raise PolicyLoadError(
            f"{path / POLICY_JSON} {what} ({SELF_HASH}): edited or damaged after export "
            "(to load it with another base model pass base_model= / --base-model instead of editing it)"
        )
    # the steps first: a policy.json of another checkpoint matches its own hash, so only they tell
    # that the files come from two checkpoints (its content hashes would blame the weight file)
    # (a missing or mistyped step is the manifest parser's to name)
    step = raw.get("step")
    problem = None
    if isinstance(step, int) and not isinstance(step, bool):
        problem = step_problem(path, step, [(f, STEP_FILES[f]) for f in files_read(path) if f in STEP_FILES])
    if problem is None:
        problem = content_problem(path, raw.get(CONTENT), files_read(path), full_check)
    if problem is not None:
        raise PolicyLoadError(problem)


def verify_policy(policy_dir: str | Path) -> tuple[bool, str]:
    """Check a policy folder without building its model: every file's full content hash (large
    ones too), the manifest and PolicyIO parse, finite statistics. Returns (whether its content
    could be verified: its format records hashes, what was checked) for ``doctor --policy``;
    raises PolicyLoadError naming the first problem."""
    path = find_policy_dir(policy_dir)
    raw = read_policy_json(path, full_check=True)
    io = read_io(path)
    manifest = read_manifest(path, raw, io)
    version = raw["format_version"]
    if not READABLE_VERSIONS[version].hashed:
        # nothing vouches for the weights: read them as loading does (readable, finite, widths)
        _read_weights(path, manifest.step, io)
        return False, (f"{path}: format_version {version} parses and its {WEIGHTS} reads, but it records no "
                       "content hashes: its files are unverified")
    n = len(files_read(path))
    return True, f"{path}: format_version {version}; {POLICY_JSON} and its {n} files match their content hashes"


@dataclass
class LoadedPolicy:
    model: Any
    manifest: PolicyManifest
    io: PolicyIO
    prompt_cache: Any
    path: Path


def load_policy_folder(
    policy_dir: str | Path, base_model: str | None = None, merge_lora: bool = False, full_check: bool = False
) -> LoadedPolicy:
    """Read and validate a policy folder and build its model on the CPU. A LoRA policy loads
    with its adapter on the base transformer; ``merge_lora`` folds the adapter into the base
    weights (plain linears again: no adapter cost per step, the same function up to rounding).
    ``full_check`` hashes files over ``integrity.ALWAYS_HASHED_BYTES`` whole too.

    The transformer's weights are read once: from the policy's own file when it holds them (a
    joint or video run trained them), else from the base folder (``training: action`` and LoRA
    froze them). Read from the policy's file they stay pages of its mapping until written: a
    joint policy's fp32 load allocates no copy of them (docs/performance.md, "Loading a policy"),
    and the loaded model reads the file for as long as it lives, as it reads the base folder's. So
    a folder in use is replaced as ``export_policy`` replaces one (a new folder, renamed into
    place), never by writing over its model.safetensors: a file truncated under a running process
    ends it with SIGBUS."""
    from dit4dit_npu.models.lora import load_adapter_state_dict
    from dit4dit_npu.models.lora import merge_lora as merge
    from dit4dit_npu.weights import build_dit4dit, text_identity
    from dit4dit_npu.weights.prompt_cache import load_prompt_cache

    path = find_policy_dir(policy_dir)
    raw = read_policy_json(path, full_check)  # version and hashes first: nothing unverified is parsed
    io = read_io(path)
    manifest = read_manifest(path, raw, io)
    model_at = model_file(raw["format_version"])
    if base_model is not None:
        manifest.framework.cosmos25.base_model = str(base_model)
    weights = _read_weights(path, manifest.step, io)
    lora = manifest.framework.cosmos25.lora
    problem = adapter_problems(path, lora, f"{framework_key(raw['format_version'])}.cosmos25.lora")
    if problem is None and merge_lora and lora.rank == 0:
        problem = "merge_lora / --merge-lora: this policy has no LoRA adapter to merge"
    if problem is not None:
        raise PolicyLoadError(f"{path}: {problem}")
    adapter = None
    if lora.rank > 0:
        adapter, problem = read_adapter(path, manifest.step)
        if problem is not None:
            raise PolicyLoadError(problem)
    cfg = inference_config(manifest.model)
    # (a LoRA policy's base is the folder's whatever its file holds: stray keys are refused below)
    own_transformer = lora.rank == 0 and any(k.startswith(f"{TRANSFORMER}.") for k in weights)
    try:
        model = build_dit4dit(cfg, io.spec, load_transformer=not own_transformer)
    except ConfigError as e:
        hint = "" if base_model else " (pass base_model= / --base-model to point at the Cosmos folder)"
        raise PolicyLoadError(f"cannot build the model described in {path / model_at}: {e}{hint}") from None
    try:
        model.load_trainable_state_dict(weights, strict=True)
    except (KeyError, ValueError, RuntimeError) as e:
        raise PolicyLoadError(f"{path / WEIGHTS} does not fit the model of {path / model_at}: {e}") from None
    if adapter is not None:
        try:
            load_adapter_state_dict(model.backbone.transformer, adapter)
        except (KeyError, ValueError) as e:
            raise PolicyLoadError(f"{path / ADAPTER_WEIGHTS} does not fit the LoRA settings of {path / model_at}: {e}") from None
        if merge_lora:
            merge(model.backbone.transformer)
    try:
        expect = text_identity(cfg)
    except ConfigError:  # a base folder without text_encoder/: the cached prompts are all we have
        expect = None
    try:
        cache = load_prompt_cache(path / PROMPTS, expect_identity=expect)
    except ValueError as e:
        raise PolicyLoadError(str(e)) from None
    model.eval()
    return LoadedPolicy(model, manifest, io, cache, path)


def read_io(path: Path) -> PolicyIO:
    """policy_io.json, with finite, ordered statistics."""
    try:
        io = PolicyIO.load(path / POLICY_IO)
    except PolicyIOError as e:
        raise PolicyLoadError(str(e)) from None
    bad = nonfinite_stats(io)
    if bad:
        raise PolicyLoadError(f"{path / POLICY_IO}: {bad}; refusing a policy whose actions would be non-finite or wrong")
    return io


def _read_weights(path: Path, step: int, io: PolicyIO) -> dict[str, Any]:
    """model.safetensors, readable, finite, of the manifest's step, and of PolicyIO's widths."""
    weights, problem = read_weights(path / WEIGHTS, step, path / POLICY_JSON, "weights")
    if problem is not None:
        raise PolicyLoadError(problem)
    problem = width_problem(io, weights)
    if problem is not None:
        raise PolicyLoadError(f"{path}: {problem} (files of different runs mixed, or edited after export?)")
    return weights
