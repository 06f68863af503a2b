"""``policy.json``: the manifest of a policy folder (format_version 4), the one place for every
fact inference needs that is not a robot <-> model transform (those are ``policy_io.json``'s)::

    {
      "format_version": 4,
      "step": 5000,                                   # the weights' (and adapter's) step
      "model": {
        "framework": {"cosmos25": {...}, "action_model": {...}},   # the run config's section,
                                                      # base_model the recorded ref ("tiny" or an
                                                      # absolute folder); no chunk length
        "mixed_precision": "bf16"                     # bf16 autocast, or "no" (fp32)
      },
      "data": {                                       # what eval scores, and joint names
        "state_key": "observation.state", "action_key": "action",
        "state_names": [...] | null, "action_names": [...] | null,
        "statistics_tag": "franka" | null, "num_trajectories": 1693 | null,   # an imported run's
        "datasets": {"/abs/dataset": {"held_out_episodes": [...], "train_episodes": [...] | null}}
      },
      "content": {"hash": "sha256/64MiB-pieces",      # every other file loading reads, as written
                  "files": {"model.safetensors": {"size": ..., "sha256": ...}, ...}},
      "manifest_sha256": "..."                        # this file's own hash (files.seal)
    }

The model section is read with the run config's own dataclasses (``FrameworkConfig``, through
the config loader's ``from_dict``: one declaration per key, the same type checks), and nothing
else of the training schema: a renamed trainer or dataset key never breaks an exported policy.
Facts another file owns are not written here, so they cannot disagree: the chunk length, widths,
cameras and statistics (``policy_io.json``), the instructions (``prompt_cache.safetensors``).
Older formats are read by ``legacy.py`` into this same object. The ``content`` section and the
manifest's own hash are the folder's (``folder.py`` writes and checks them; ``integrity.py``).
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dit4dit_npu.config import Config, ConfigError, FrameworkConfig, TrainerConfig, from_dict, validate
from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.files import SELF_HASH

# 2: policy_io.json replaces normalizer.json; 3: one manifest, no config.yaml; 4: content hashes
# of every file loading reads, and of the manifest itself (the version this session's folder
# changes share: what each version requires and how it is read is folder.py's VERSIONS).
FORMAT_VERSION = 4
CONTENT = "content"  # policy.json's section of the other files' sizes and hashes (format 4)
# The run config's declaration of the precision setting (not a second list of its values).
MixedPrecision = typing.get_type_hints(TrainerConfig)["mixed_precision"]
# Keys of the framework section another file of the folder owns: never written to the manifest,
# refused in it. The chunk length is policy_io.json's; the prompt cache is the folder's own file.
OWNED_ELSEWHERE = {
    ("action_model", "chunk_length"): "the chunk length is policy_io.json's chunk_length",
    ("action_model", "future_action_window_size"): "the chunk length is policy_io.json's chunk_length",  # its old name
    ("cosmos25", "prompt_cache"): "the policy's prompts are its prompt_cache.safetensors",
}
# Training-only keys that folders written before they moved to the trainer section carry in their
# framework section (format 3 as written by main up to 8712bd4; a version 2 config.yaml could too); inference never
# read them, so they are dropped on reading, not refused.
TRAINING_ONLY = {("action_model", "state_noise_std")}


class ManifestError(DiT4DiTError, ValueError):
    """A manifest that does not parse (one line naming the key)."""


@dataclass
class ModelSection:
    framework: FrameworkConfig
    mixed_precision: MixedPrecision  # type: ignore[valid-type]


@dataclass
class DatasetRecord:
    held_out_episodes: list[int] = field(default_factory=list)
    train_episodes: list[int] | None = None  # None: not recorded (the split gave held-out only)


@dataclass
class DataSection:
    state_key: str
    action_key: str
    datasets: dict[str, DatasetRecord]
    # Names of the state / action dims (from the first dataset's info.json), for messages.
    state_names: list[str] | None = None
    action_names: list[str] | None = None
    # An imported DiT4DiT run's statistics: their embodiment tag and episode count (what an
    # export back to its format writes again; null for this project's runs).
    statistics_tag: str | None = None
    num_trajectories: int | None = None


@dataclass
class PolicyManifest:
    """A policy's manifest in memory, whichever format version it was read from."""

    step: int
    model: ModelSection
    data: DataSection

    @property
    def framework(self) -> FrameworkConfig:
        return self.model.framework

    @property
    def base_model(self) -> str:
        return self.model.framework.cosmos25.base_model

    def to_json(self) -> dict[str, Any]:
        out = {"format_version": FORMAT_VERSION, **dataclasses.asdict(self)}
        for (section, key), _ in OWNED_ELSEWHERE.items():
            out["model"]["framework"][section].pop(key, None)  # (a former name is in no dataclass)
        return out


REQUIRED = {"": ("format_version", "step", "model", "data"), "model.": ("framework", "mixed_precision"),
            "data.": ("state_key", "action_key", "datasets")}


def parse_manifest(raw: Any, chunk_length: int) -> PolicyManifest:
    """A format_version 3 or 4 ``policy.json`` (parsed JSON) -> PolicyManifest; ``chunk_length`` is
    policy_io.json's, filled into the framework section the model is built from."""
    for prefix, keys in REQUIRED.items():
        node = raw.get(prefix.rstrip(".")) if prefix else raw
        if not isinstance(node, dict):
            raise ManifestError(f"{prefix.rstrip('.') or 'the top level'}: expected a mapping, got {node!r}")
        missing = [prefix + k for k in keys if k not in node]
        if missing:
            raise ManifestError(f"missing {missing}")
    framework = raw["model"]["framework"]
    for (section, key), owner in OWNED_ELSEWHERE.items():
        if isinstance(framework, dict) and isinstance(framework.get(section), dict) and key in framework[section]:
            raise ManifestError(f"model.framework.{section}.{key} does not belong here: {owner}")
    # the version and the hashes are the folder's (folder.py checked them), not the manifest's
    return typed_manifest({k: v for k, v in raw.items() if k not in ("format_version", CONTENT, SELF_HASH)}, chunk_length)


def typed_manifest(raw: dict[str, Any], chunk_length: int) -> PolicyManifest:
    """Typed parse (unknown keys and wrong types refused, naming the key) of a manifest-shaped
    mapping without its format_version, with the chunk length set from the PolicyIO."""
    raw = copy.deepcopy(raw)  # the caller's parsed JSON stays as read
    framework = raw["model"].get("framework") if isinstance(raw.get("model"), dict) else None
    for section, key in TRAINING_ONLY:
        if isinstance(framework, dict) and isinstance(framework.get(section), dict):
            framework[section].pop(key, None)
    try:
        manifest = from_dict(PolicyManifest, raw)
    except ConfigError as e:
        # the loader's words for a run config ("config key", a section's prefix "a.b.: ...")
        raise ManifestError(str(e).replace("config key", "key").replace(".: ", ": ")) from None
    manifest.model.framework.action_model.chunk_length = chunk_length
    try:
        validate(inference_config(manifest.model))  # the framework's range checks, as at training
    except ConfigError as e:  # it names run-config keys: framework.* is model.framework.* here
        raise ManifestError(f"model.{e}" if str(e).startswith("framework.") else str(e)) from None
    return manifest


def inference_config(model: ModelSection) -> Config:
    """The run config the model builders (``weights/build.py``) take, holding the manifest's model
    section; every other section keeps its defaults, which no builder reads at inference (the
    one adapter between the manifest and the builders)."""
    cfg = Config(framework=copy.deepcopy(model.framework))
    cfg.trainer.mixed_precision = model.mixed_precision
    cfg.trainer.enable_gradient_checkpointing = False  # a training-only setting
    return cfg


def base_model_ref(base_model: str) -> str:
    # A relative folder is relative to where training ran; record it absolute so the policy loads
    # from anywhere. "tiny" (and anything that is not an existing folder) is kept verbatim.
    p = Path(base_model).expanduser()
    return str(p.resolve()) if base_model != "tiny" and p.is_dir() else base_model


def manifest_of_run(
    cfg: Config, split: dict[str, Any], dataset_paths: list[str] | list[Path], step: int,
    state_names: list[str] | None, action_names: list[str] | None,
    statistics_tag: str | None = None, num_trajectories: int | None = None,
) -> PolicyManifest:
    """The manifest of a policy exported from a run (or an import) configured by ``cfg``.

    ``split`` maps each dataset path to ``{"train": [...], "val": [...]}`` (or directly to the
    held-out episode list); the held-out episodes are what ``dit4dit_npu.eval`` evaluates on."""
    framework = copy.deepcopy(cfg.framework)
    framework.cosmos25.base_model = base_model_ref(framework.cosmos25.base_model)
    fitted = framework.cosmos25.tiny.vae_weights  # a fitted tiny VAE: referred to, like the base model
    if fitted is not None:
        framework.cosmos25.tiny.vae_weights = str(Path(fitted).expanduser().resolve())
    framework.cosmos25.prompt_cache = None
    datasets = {}
    for given in dataset_paths:
        resolved = str(Path(given).resolve())
        entry = split.get(str(given), split.get(resolved, []))
        held_out = entry.get("val", []) if isinstance(entry, dict) else entry
        train = entry.get("train") if isinstance(entry, dict) else None
        datasets[resolved] = DatasetRecord(
            sorted(int(e) for e in held_out), None if train is None else sorted(int(e) for e in train)
        )
    d = cfg.datasets.vla_data
    return PolicyManifest(
        step=int(step),
        model=ModelSection(framework, cfg.trainer.mixed_precision),
        data=DataSection(d.state_key, d.action_key, datasets, state_names, action_names, statistics_tag,
                         num_trajectories),
    )
