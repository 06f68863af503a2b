"""DiT4DiT's ``steps_N_pytorch_model.pt``: read it, split it, rename its trainable tensors to ours,
and check its frozen tensors against the base model.

The file is ``torch.save(model.state_dict())`` of the whole framework (its trainer saved frozen
modules too):

========================================================  ===========================================
DiT4DiT key prefix                                         here
========================================================  ===========================================
``backbone_interface.extractor.transformer.``             ``backbone.transformer.`` (trained)
``action_model.``                                         ``action_model.``, head layers renamed
                                                          (``config.migrate.module_path``)
``backbone_interface.extractor.text_encoder.``            checked against ``<base>/text_encoder``
``backbone_interface.extractor.vae.``                     checked against ``<base>/vae``
========================================================  ===========================================

The frozen parts are referred to by the policy's base-model path, never copied; a checkpoint
whose frozen weights differ from that base model was trained on another one, and is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from dit4dit_npu.config.dit4dit_keys import module_path
from dit4dit_npu.errors import DiT4DiTError

TRANSFORMER = "backbone_interface.extractor.transformer."
TEXT_ENCODER = "backbone_interface.extractor.text_encoder."
VAE = "backbone_interface.extractor.vae."
HEAD = "action_model."


class ConversionError(DiT4DiTError, ValueError):
    """Input that cannot be imported (one line naming the file and what was expected)."""


@dataclass
class OriginalCheckpoint:
    path: Path
    trainable: dict[str, torch.Tensor]  # DiT4DiT names: transformer + action head
    frozen: dict[str, dict[str, torch.Tensor]]  # "text_encoder" / "vae" -> {in-memory name: tensor}


def read_checkpoint(path: Path) -> OriginalCheckpoint:
    if not path.is_file():
        raise ConversionError(f"checkpoint not found: {path}")
    try:  # mmap: the real file is ~21 GB, most of it frozen weights that are only compared
        sd = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # pickle / zip errors have many types; none is recoverable here
        raise ConversionError(f"{path}: not a readable torch checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        got = sorted(sd)[:5] if isinstance(sd, dict) else type(sd).__name__
        raise ConversionError(
            f"{path}: expected a state dict of tensors (DiT4DiT's torch.save(model.state_dict())), got {got}"
        )
    parts: dict[str, dict[str, torch.Tensor]] = {"text_encoder": {}, "vae": {}}
    trainable: dict[str, torch.Tensor] = {}
    other = []
    for key, value in sd.items():
        if key.startswith(TEXT_ENCODER):
            parts["text_encoder"][key[len(TEXT_ENCODER) :]] = value
        elif key.startswith(VAE):
            parts["vae"][key[len(VAE) :]] = value
        elif key.startswith((TRANSFORMER, HEAD)):
            trainable[key] = value
        else:
            other.append(key)
    if not any(k.startswith(TRANSFORMER) for k in trainable) or other:
        found = ", ".join(sorted(other or sd)[:3])
        raise ConversionError(
            f"{path}: not a DiT4DiT checkpoint (expected only {TRANSFORMER}*, {HEAD}*, {TEXT_ENCODER}* and "
            f"{VAE}* keys; found e.g. {found})"
        )
    return OriginalCheckpoint(path, trainable, parts)


def step_of(path: Path) -> int:
    """``steps_<N>_pytorch_model.pt`` -> N (0 when the name does not say)."""
    stem = path.name
    if stem.startswith("steps_") and "_" in stem[6:]:
        digits = stem[6:].split("_", 1)[0]
        if digits.isdigit():
            return int(digits)
    return 0


def our_names(trainable: dict[str, torch.Tensor]) -> dict[str, str]:
    """DiT4DiT key -> our parameter name (every trainable key has one)."""
    out = {}
    for key in trainable:
        name = module_path(key)
        assert name is not None  # only frozen prefixes map to None, and they are not here
        out[key] = name
    return out


def map_trainable(ckpt: OriginalCheckpoint, expected: dict[str, torch.Size], config_name: str) -> dict[str, torch.Tensor]:
    """Rename to ours and check against the model built from the config: every tensor lands on a
    parameter of the same shape, none is left over, none is missing."""
    names = our_names(ckpt.trainable)
    back = {v: k for k, v in names.items()}
    unexpected = sorted(k for k, n in names.items() if n not in expected)
    missing = sorted(n for n in expected if n not in back)
    if unexpected or missing:
        parts = []
        if unexpected:
            parts.append(f"{len(unexpected)} tensor(s) the model has no place for (e.g. {', '.join(unexpected[:3])})")
        if missing:
            parts.append(f"{len(missing)} parameter(s) the checkpoint lacks (e.g. {', '.join(missing[:3])})")
        raise ConversionError(
            f"{ckpt.path.name} does not fit the model of {config_name} (another architecture or size?): "
            + "; ".join(parts)
        )
    for key, name in names.items():
        if tuple(ckpt.trainable[key].shape) != tuple(expected[name]):
            raise ConversionError(
                f"{ckpt.path.name} does not fit the model of {config_name}: {key} has shape "
                f"{tuple(ckpt.trainable[key].shape)}, the config builds {tuple(expected[name])}"
            )
    for key, tensor in ckpt.trainable.items():  # a diverged run: refused here, not written as a policy
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ConversionError(f"{ckpt.path.name}: trained tensor {key} has NaN or inf values (a diverged run?)")
    return {names[k]: v for k, v in ckpt.trainable.items()}


# --------------------------------------------------------------------------------------------
# Frozen parts vs the base model
# --------------------------------------------------------------------------------------------


def _disk_to_memory(component: str, key: str) -> str:
    """Saved text-encoder names -> the in-memory names DiT4DiT's state dict has (transformers
    4.57 and 5.x both save the legacy ``model.*`` / ``visual.*`` layout; newer names pass)."""
    if component != "text_encoder" or key.startswith(("model.language_model.", "model.visual.", "lm_head.")):
        return key
    if key.startswith("visual."):
        return "model." + key
    if key.startswith("model."):
        return "model.language_model." + key[len("model.") :]
    return key


def _safetensors_files(folder: Path) -> list[Path]:
    index = sorted(folder.glob("*.safetensors.index.json"))
    if index:
        try:
            files = json.loads(index[0].read_text())["weight_map"].values()
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConversionError(f"{index[0]}: not a safetensors index with a weight_map ({e})") from None
        return [folder / f for f in dict.fromkeys(files)]
    return sorted(folder.glob("*.safetensors"))


def check_frozen(ckpt: OriginalCheckpoint, base: Path) -> None:
    """Every frozen tensor of the checkpoint equals the base model's (compared in the lower of
    the two precisions: a bf16-trained checkpoint of fp32 base weights still matches), and the
    base model has no tensor the checkpoint lacks."""
    from safetensors import SafetensorError

    for component, tensors in ckpt.frozen.items():
        folder = base / component
        files = _safetensors_files(folder)
        if not files:
            raise ConversionError(f"base model {base}: no {component}/*.safetensors to check the checkpoint's {component} against")
        seen = set()
        for f in files:
            try:
                _check_file(ckpt, component, tensors, f, base, seen)
            except (SafetensorError, OSError) as e:
                raise ConversionError(f"base model {base}: {f.relative_to(base)} is unreadable ({e})") from None
        extra = sorted(set(tensors) - seen)
        if extra:
            raise ConversionError(
                f"{ckpt.path.name}: {component} tensor(s) {extra[:3]} are not in the base model {base}: "
                "it was not trained on this base model (pass that one with --base-model)"
            )


def _check_file(
    ckpt: OriginalCheckpoint, component: str, tensors: dict[str, torch.Tensor], f: Path, base: Path, seen: set[str]
) -> None:
    """Every tensor of one base-model file against the checkpoint's (names added to ``seen``)."""
    from safetensors import safe_open

    with safe_open(str(f), framework="pt") as st:
        for disk_key in st.keys():
            key = _disk_to_memory(component, disk_key)
            seen.add(key)
            if key not in tensors:
                raise ConversionError(
                    f"{ckpt.path.name} has no {component} tensor {key!r} that the base model {base} has: "
                    "it was not trained on this base model (pass that one with --base-model)"
                )
            _compare(ckpt.path.name, component, key, tensors[key], st.get_tensor(disk_key), base)


def _compare(name: str, component: str, key: str, ours: torch.Tensor, base: torch.Tensor, folder: Path) -> None:
    if tuple(ours.shape) != tuple(base.shape):
        raise ConversionError(
            f"{name}: frozen {component} tensor {key} has shape {tuple(ours.shape)}, the base model {folder} has "
            f"{tuple(base.shape)}: it was trained on another base model (pass that one with --base-model)"
        )
    low = ours.dtype if ours.element_size() <= base.element_size() else base.dtype
    a, b = ours.to(low), base.to(low)
    if not torch.equal(a, b):
        diff = float((a.float() - b.float()).abs().max())
        raise ConversionError(
            f"{name}: frozen {component} weights differ from the base model {folder} ({key}: max |diff| {diff:.3g}); "
            "it was trained on another base model (pass that one with --base-model)"
        )
