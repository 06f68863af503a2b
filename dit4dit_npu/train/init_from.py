"""``trainer.init_from``: a fresh run that starts from another run's trained weights.

Video pretraining before few-demo training is two runs: one with
``framework.cosmos25.training: video`` (the video loss only: the episodes' actions are never read),
whose exported policy holds the transformer alone, then the action run with
``trainer.init_from`` naming that policy: its transformer, a fresh action head. Fine-tuning a
trained policy on new data is the same with both parts. Only a fresh run reads it: a resumed
run's weights are its own checkpoint's (which started from these), so a resume says it ignores it.

Refused in one line, before the run folder is touched (``check_init_from``): a folder that is not
a whole policy (the policy folder's own checks), a LoRA policy (an adapter is not whole weights),
a policy whose transformer learned another VAE's latents, or latents normalized with other
statistics (the tiny VAE's are config). Refused when loading (``init_weights``,
before the optimizer sees the model): a tensor this model has no parameter for, or one of another
shape (another embodiment's action head, other model sizes). Parameters the policy does not hold
keep their initialization, and the line printed says which modules came from where, and which
blocks of a part the policy holds start fresh (a policy of fewer transformer blocks).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from dit4dit_npu.config import Config, ConfigError
from dit4dit_npu.policy.folder import (
    PolicyLoadError,
    find_policy_dir,
    read_io,
    read_manifest,
    read_policy_json,
)
from dit4dit_npu.policy.integrity import read_weights
from dit4dit_npu.policy.manifest import PolicyManifest, inference_config
from dit4dit_npu.weights import vae_identity

KEY = "trainer.init_from"
WEIGHTS = "model.safetensors"


def check_init_from(cfg: Config) -> tuple[Path, PolicyManifest] | None:
    """The policy folder ``trainer.init_from`` names and its manifest, checked; None when unset."""
    if cfg.trainer.init_from is None:
        return None
    try:
        path = find_policy_dir(cfg.trainer.init_from)
        raw = read_policy_json(path)
        manifest = read_manifest(path, raw, read_io(path))
    except PolicyLoadError as e:
        raise ConfigError(f"{KEY}: {e}") from None
    if manifest.framework.cosmos25.lora.enabled:
        raise ConfigError(f"{KEY}: {path} is a LoRA policy; its adapter is not whole weights to start from")
    ours, theirs = _vae(cfg, "this run's"), _vae(inference_config(manifest.model), f"{path}'s")
    if ours != theirs:
        raise ConfigError(
            f"{KEY}: {path} was trained on the latents of another VAE ({theirs}; this run's: {ours}); "
            "its transformer learned those latents"
        )
    if cfg.framework.cosmos25.is_tiny:  # a real Cosmos folder's statistics are its VAE's (the identity above)
        for stat in ("vae_latents_mean", "vae_latents_std"):
            if getattr(cfg.framework.cosmos25.tiny, stat) != getattr(manifest.framework.cosmos25.tiny, stat):
                raise ConfigError(
                    f"{KEY}: {path} normalized its latents with another framework.cosmos25.tiny.{stat} "
                    f"(its policy.json's); its transformer learned those: set this run's to the same"
                )
    return path, manifest


def init_weights(model: torch.nn.Module, path: Path, manifest: PolicyManifest) -> str:
    """Copy the policy's weights into ``model`` (every tensor must fit a parameter); returns the
    line that says what came from where."""
    weights, problem = read_weights(path / WEIGHTS, manifest.step, path / "policy.json", "weights")
    if problem is not None:
        raise ConfigError(f"{KEY}: {problem}")
    params = dict(model.named_parameters())
    for name, tensor in weights.items():
        if name not in params:
            raise ConfigError(f"{KEY}: {path / WEIGHTS} holds {name}, which this model has no parameter for")
        if tensor.shape != params[name].shape:
            raise ConfigError(
                f"{KEY}: {path / WEIGHTS}: {name} has shape {tuple(tensor.shape)}, this model's "
                f"{tuple(params[name].shape)} (another embodiment or other model sizes)"
            )
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor.to(params[name].dtype))
    loaded = Counter(_module(n) for n in weights)
    total = Counter(_module(n) for n in params)
    parts = ", ".join(
        f"{m} ({k} tensors)" if k == total[m] else f"{m} ({k} of its {total[m]} tensors)" for m, k in sorted(loaded.items())
    )
    fresh = _fresh(params, weights, set(loaded))
    one = len(fresh) == 1 and "." not in fresh[0].removeprefix("backbone.")  # one whole part: "its"
    return f"{KEY}: {parts} from {path} (step {manifest.step})" + (
        f"; {', '.join(fresh)} at {'its' if one else 'their'} initialization (not in the policy)" if fresh else ""
    )


def _module(name: str) -> str:
    """The top-level part a parameter belongs to: backbone.transformer, action_model, ..."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "backbone" else parts[0]


def _fresh(params: dict[str, torch.nn.Parameter], weights: dict[str, torch.Tensor], loaded: set[str]) -> list[str]:
    """What the policy does not hold, named so a line never says a part both came from the policy
    and kept its initialization: a trained part it lacks whole (a video-only policy's action head),
    and, inside a part it does hold, each block it lacks (a policy of fewer transformer blocks:
    ``backbone.transformer.transformer_blocks.2-3``) and a count of any other tensors. Frozen parts
    outside the policy's (the VAE, the text encoder) are the base model's, not fresh."""
    whole = sorted({_module(n) for n, p in params.items() if p.requires_grad and _module(n) not in loaded})
    blocks: dict[str, dict[int, bool]] = {}  # container -> block index -> whether the policy holds any of it
    others: dict[str, list[str]] = {}
    for name in params:
        if _module(name) not in loaded:
            continue
        parts = name.split(".")
        i = next((j for j, part in enumerate(parts) if part.isdigit()), None)
        if i is not None:
            held = blocks.setdefault(".".join(parts[:i]), {})
            held[int(parts[i])] = held.get(int(parts[i]), False) or name in weights
    for name in params:
        if _module(name) in loaded and name not in weights:
            parts = name.split(".")
            i = next((j for j, part in enumerate(parts) if part.isdigit()), None)
            if i is None or blocks[".".join(parts[:i])][int(parts[i])]:
                others.setdefault(_module(name), []).append(name)
    named = [f"{c}.{_ranges([b for b, held in sorted(ix.items()) if not held])}" for c, ix in sorted(blocks.items())
             if not all(ix.values())]
    named += [f"{len(ns)} other tensors of {m} (e.g. {ns[0]})" for m, ns in sorted(others.items())]
    return whole + named


def _ranges(indices: list[int]) -> str:
    """[2, 3, 4, 7] -> '2-4,7'."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _vae(cfg: Config, whose: str) -> str:
    # The dtype it runs in is the last part of the identity; a transformer trained beside a bf16
    # VAE starts a fp32 run just as well.
    try:
        return vae_identity(cfg).rsplit(":", 1)[0]
    except ConfigError as e:
        raise ConfigError(f"{KEY}: cannot identify {whose} VAE: {e}") from None
