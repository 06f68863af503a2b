"""The exported policy folder: everything inference needs, nothing it does not.

    <policy>/policy.json               format_version, step, base model, datasets + held-out
                                       episodes, camera keys, sizes and dims (see export_policy)
    <policy>/config.yaml               the resolved training config
    <policy>/model.safetensors         trainable weights only (transformer + action head; the
                                       action head only under LoRA)
    <policy>/adapter/                  LoRA only: the transformer's adapter in peft's layout
                                       (adapter_model.safetensors, adapter_config.json; adapter.py)
    <policy>/policy_io.json            every robot <-> model transform (cameras, sizes, state
                                       encoding, action normalization, padding) and the
                                       training data's statistics it was built from
    <policy>/prompt_cache.safetensors  embeddings of every training instruction

The frozen base model (VAE, text encoder; "tiny" or a local Cosmos folder) is referred to by
path, never copied (the original stored ~21 GB of frozen weights per checkpoint, SPEC B7).
The folder is written to a temporary sibling and renamed into place, so a crash never leaves a
half-written policy that looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dit4dit_npu.config import Config, ConfigError, dump_yaml, load_config
from dit4dit_npu.policy.adapter import ADAPTER_WEIGHTS, adapter_problems, read_adapter, write_adapter
from dit4dit_npu.policy.integrity import config_io_problems, feature_names, nonfinite_stats, read_weights
from dit4dit_npu.transforms.policy_io import PolicyIO, PolicyIOError

FORMAT_VERSION = 2  # 2: policy_io.json replaces normalizer.json
POLICY_JSON, CONFIG, WEIGHTS, POLICY_IO, PROMPTS = (
    "policy.json",
    "config.yaml",
    "model.safetensors",
    "policy_io.json",
    "prompt_cache.safetensors",
)
REQUIRED_FILES = (POLICY_JSON, CONFIG, WEIGHTS, POLICY_IO, PROMPTS)


class PolicyLoadError(RuntimeError):
    """A policy folder that cannot be loaded (missing files, other format version, bad base model)."""


def _base_model_ref(base_model: str) -> str:
    # A relative folder is relative to where training ran; record it absolute so the policy loads
    # from anywhere. "tiny" (and anything that is not an existing folder) is kept verbatim.
    p = Path(base_model).expanduser()
    return str(p.resolve()) if base_model != "tiny" and p.is_dir() else base_model


def export_policy(
    out_dir: str | Path,
    model: Any,
    cfg: Config,
    io: PolicyIO,
    prompt_cache: Any,
    split: dict[str, Any],
    dataset_paths: list[str] | list[Path],
    step: int,
) -> Path:
    """Write the policy folder ``out_dir`` atomically (temp folder + rename); returns it.

    ``split`` maps each dataset path to ``{"train": [...], "val": [...]}`` (or directly to the
    held-out episode list); the held-out episodes are what ``dit4dit_npu.eval`` evaluates on.
    """
    from safetensors.torch import save_file

    from dit4dit_npu.models.lora import has_lora
    from dit4dit_npu.policy.prompts import save_prompt_cache

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        # Own, contiguous CPU storage per tensor: safetensors refuses shared/strided storage.
        weights = {k: v.detach().cpu().clone().contiguous() for k, v in model.trainable_state_dict().items()}
        save_file(weights, str(tmp / WEIGHTS), metadata={"format": "dit4dit_npu.policy", "step": str(step)})
        if has_lora(model.backbone.transformer):
            write_adapter(tmp, model.backbone.transformer, step)
        (tmp / CONFIG).write_text(dump_yaml(cfg))
        io.save(tmp / POLICY_IO)
        save_prompt_cache(prompt_cache, tmp / PROMPTS)

        paths = [str(Path(p).resolve()) for p in dataset_paths]
        held_out, trained_on = {}, {}
        for given, resolved in zip(dataset_paths, paths):
            entry = split.get(str(given), split.get(resolved, []))
            held_out[resolved] = sorted(int(e) for e in (entry.get("val", []) if isinstance(entry, dict) else entry))
            if isinstance(entry, dict) and "train" in entry:
                trained_on[resolved] = sorted(int(e) for e in entry["train"])
        info = {
            "format_version": FORMAT_VERSION,
            "base_model": _base_model_ref(cfg.framework.cosmos25.base_model),
            "step": int(step),
            "datasets": paths,
            "held_out_episodes": held_out,
            "train_episodes": trained_on,
            "instructions": sorted(prompt_cache.instructions),
            # Joint names (from the first dataset's info.json) for warnings about live inputs.
            "state_names": feature_names(paths, cfg.datasets.vla_data.state_key, io.state_dim),
            "action_names": feature_names(paths, cfg.datasets.vla_data.action_key, io.action_dim),
        }
        (tmp / POLICY_JSON).write_text(json.dumps(info, indent=1))
        if out.exists():  # replace: move the old folder aside first so `out` is never half-new
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


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


def read_policy_info(policy_dir: Path) -> dict[str, Any]:
    try:
        info = json.loads((policy_dir / POLICY_JSON).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PolicyLoadError(f"{policy_dir / POLICY_JSON}: unreadable ({e})") from None
    version = info.get("format_version") if isinstance(info, dict) else None
    if version != FORMAT_VERSION:
        raise PolicyLoadError(
            f"{policy_dir}: policy format_version {version!r} is not supported by this dit4dit_npu "
            f"(it reads version {FORMAT_VERSION}); export the checkpoint again with this version"
        )
    missing = [f for f in REQUIRED_FILES if not (policy_dir / f).is_file()]
    if missing:
        raise PolicyLoadError(f"{policy_dir}: policy folder is incomplete, missing {missing}")
    return info


@dataclass
class LoadedPolicy:
    model: Any
    cfg: Config
    io: PolicyIO
    prompt_cache: Any
    info: dict[str, Any]
    path: Path


def load_policy_folder(policy_dir: str | Path, base_model: str | None = None, merge_lora: bool = False) -> LoadedPolicy:
    """Read and validate a policy folder and build its model on the CPU. A LoRA policy loads
    with its adapter on the base transformer; ``merge_lora`` folds the adapter into the base
    weights (plain linears again: no adapter cost per step, the same function up to rounding)."""
    from dit4dit_npu.models.lora import load_adapter_state_dict
    from dit4dit_npu.models.lora import merge_lora as merge
    from dit4dit_npu.policy.prompts import load_prompt_cache
    from dit4dit_npu.weights import build_dit4dit, text_identity

    path = find_policy_dir(policy_dir)
    info = read_policy_info(path)
    base = base_model if base_model is not None else info.get("base_model", "tiny")
    try:
        cfg = load_config(path / CONFIG)
    except ConfigError as e:
        raise PolicyLoadError(f"{path / CONFIG}: {e}") from None
    # Set directly, not as an override string: a path is not a YAML scalar to be parsed.
    cfg.framework.cosmos25.base_model = str(base)
    # The run's training-only settings mean nothing at inference.
    cfg.trainer.enable_gradient_checkpointing = False
    try:
        io = PolicyIO.load(path / POLICY_IO)
    except PolicyIOError as e:
        raise PolicyLoadError(str(e)) from None
    _check_io(path, cfg, io)
    weights = _read_weights(path, info)
    problem = adapter_problems(path, cfg)
    if problem is None and merge_lora and cfg.framework.cosmos25.lora.rank == 0:
        problem = "merge_lora / --merge-lora: this policy has no LoRA adapter to merge"
    if problem is not None:
        raise PolicyLoadError(f"{path}: {problem}")
    adapter = None
    if cfg.framework.cosmos25.lora.rank > 0:
        adapter, problem = read_adapter(path, info.get("step"))
        if problem is not None:
            raise PolicyLoadError(problem)
    try:
        model = build_dit4dit(cfg, io.spec)
    except ConfigError as e:
        hint = "" if base_model else " (pass base_model= / --base-model to point at the Cosmos folder)"
        raise PolicyLoadError(f"cannot build the base model recorded in {path / POLICY_JSON}: {e}{hint}") from None
    try:
        model.load_trainable_state_dict(weights, strict=True)
    except (KeyError, ValueError, RuntimeError) as e:
        raise PolicyLoadError(
            f"{path / WEIGHTS} does not fit the model of {path / CONFIG} and {path / POLICY_IO} "
            f"(state width {io.spec.state_width}, action width {io.spec.action_width}): {e}"
        ) from None
    if adapter is not None:
        try:
            load_adapter_state_dict(model.backbone.transformer, adapter)
        except (KeyError, ValueError) as e:
            raise PolicyLoadError(f"{path / ADAPTER_WEIGHTS} does not fit the LoRA config of {path / CONFIG}: {e}") from None
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
    return LoadedPolicy(model, cfg, io, cache, info, path)


def _check_io(path: Path, cfg: Config, io: PolicyIO) -> None:
    """The PolicyIO must be finite and the one its config describes (not another run's)."""
    bad = nonfinite_stats(io)
    if bad:
        raise PolicyLoadError(f"{path / POLICY_IO}: {bad}; refusing a policy whose actions would be non-finite")
    problems = config_io_problems(cfg, io)
    if problems:
        raise PolicyLoadError(
            f"{path}: {problems[0]} (files of different runs mixed, or edited after export?)"
            + (f" and {len(problems) - 1} more difference(s)" if len(problems) > 1 else "")
        )


def _read_weights(path: Path, info: dict[str, Any]) -> dict[str, Any]:
    """model.safetensors, readable, finite, and of the step policy.json records."""
    weights, problem = read_weights(path / WEIGHTS, info.get("step"), path / POLICY_JSON, "weights")
    if problem is not None:
        raise PolicyLoadError(problem)
    return weights
