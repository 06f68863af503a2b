"""Policy folders of older formats, read into today's ``PolicyManifest`` so they load and act as
they did (``tests/fixtures/policy_v2`` holds folders version 2 wrote, with its actions).

format_version 2 (written before policy.json recorded content hashes, which version 3 added):

    policy.json     format_version, base_model, step, datasets, held_out_episodes,
                    train_episodes, instructions, state_names, action_names
    config.yaml     the whole resolved run config
    + model.safetensors, adapter/, policy_io.json, prompt_cache.safetensors as in version 3

Only what version 3 keeps is read: config.yaml's ``framework`` section (typed, as version 3's),
``trainer.mixed_precision`` and the two dataset keys; every other key of it is ignored, so a
config key renamed since never breaks an old policy. Its ``instructions`` (the prompt cache's
keys) and the chunk length (policy_io.json's) were copies and are not read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dit4dit_npu.config import read_yaml
from dit4dit_npu.policy.manifest import OWNED_ELSEWHERE, ManifestError, PolicyManifest, typed_manifest

CONFIG_V2 = "config.yaml"


def _get(node: Any, path: str) -> Any:
    """``a.b.c`` of nested mappings; ManifestError naming the key when absent."""
    for i, part in enumerate(parts := path.split(".")):
        if not isinstance(node, dict) or part not in node:
            where = ".".join(parts[:i]) or "the top level"
            raise ManifestError(f"{path}: missing (expected a mapping with {part!r} at {where})")
        node = node[part]
    return node


def _mapping(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ManifestError(f"{key}: expected a mapping, got {value!r}")
    return value


def read_v2(policy_json: dict[str, Any], config: Path, chunk_length: int) -> PolicyManifest:
    """A version 2 folder's policy.json (parsed) and config.yaml -> the manifest version 3 would
    have written for it. Raises ManifestError naming the key, ConfigError for unreadable YAML."""
    raw = read_yaml(config)
    framework = _mapping(_get(raw, "framework"), "framework")
    for (section, key), _ in OWNED_ELSEWHERE.items():
        if isinstance(framework.get(section), dict):
            framework[section].pop(key, None)
    if "base_model" in policy_json:  # the ref recorded at export (absolute), not the run's own
        framework.setdefault("cosmos25", {})["base_model"] = policy_json["base_model"]
    try:
        return typed_manifest(_v3_shape(policy_json, raw, framework), chunk_length)
    except ManifestError as e:  # keys named as in config.yaml, not in version 3's manifest
        text = str(e).replace("model.mixed_precision", "trainer.mixed_precision").replace("model.framework", "framework")
        raise ManifestError(text) from None


def _v3_shape(policy_json: dict[str, Any], raw: dict[str, Any], framework: dict[str, Any]) -> dict[str, Any]:
    held_out = _mapping(policy_json.get("held_out_episodes") or {}, "held_out_episodes")
    train = _mapping(policy_json.get("train_episodes") or {}, "train_episodes")
    datasets = {
        str(p): {"held_out_episodes": held_out.get(str(p), []), "train_episodes": train.get(str(p))}
        for p in policy_json.get("datasets") or list(held_out)
    }
    return {
        "step": policy_json.get("step"),
        "model": {"framework": framework, "mixed_precision": _get(raw, "trainer.mixed_precision")},
        "data": {
            "state_key": _get(raw, "datasets.vla_data.state_key"),
            "action_key": _get(raw, "datasets.vla_data.action_key"),
            "datasets": datasets,
            "state_names": policy_json.get("state_names"),
            "action_names": policy_json.get("action_names"),
        },
    }
