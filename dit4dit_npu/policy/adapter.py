"""The LoRA adapter of a policy folder (``framework.cosmos25.lora.rank > 0``), in peft's layout:

    <policy>/adapter/adapter_model.safetensors   the adapter weights, under the keys
                                                 ``PeftModel.save_pretrained`` writes
    <policy>/adapter/adapter_config.json         peft's ``LoraConfig`` (rank, alpha, targets)

so ``PeftModel.from_pretrained(CosmosTransformer3DModel(...), "<policy>/adapter")`` reads it as
it is. The base transformer is frozen under LoRA and referred to by path like the VAE;
``model.safetensors`` then holds the action head only. ``folder.py`` writes and loads the
folder; this file owns the adapter's files and what they must agree on (the LoRA settings of
the manifest's model section).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dit4dit_npu.config import LoraAdapterConfig
from dit4dit_npu.policy.integrity import read_weights

ADAPTER_DIR = "adapter"
ADAPTER_WEIGHTS = f"{ADAPTER_DIR}/adapter_model.safetensors"  # peft's SAFETENSORS_WEIGHTS_NAME
ADAPTER_CONFIG = f"{ADAPTER_DIR}/adapter_config.json"  # peft's CONFIG_NAME
ADAPTER_FILES = (ADAPTER_WEIGHTS, ADAPTER_CONFIG)


def write_adapter(folder: Path, transformer: Any, step: int) -> None:
    """The adapter of ``transformer`` (injected by ``models/lora.py``) into ``folder/adapter/``."""
    from safetensors.torch import save_file

    from dit4dit_npu.models.lora import adapter_state_dict, lora_config

    (folder / ADAPTER_DIR).mkdir()
    weights = {k: v.detach().cpu().clone().contiguous() for k, v in adapter_state_dict(transformer).items()}
    # "format": "pt" is what peft's own save writes (and what its loader expects).
    save_file(weights, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt", "step": str(step)})
    lora_config(transformer).save_pretrained(str(folder / ADAPTER_DIR))


def adapter_problems(folder: Path, lo: LoraAdapterConfig, source: str) -> str | None:
    """The adapter files must be there exactly when the manifest's LoRA rank is > 0, and say the
    same rank, alpha and target modules; None when they agree. ``source`` names where the
    settings were read (``policy.json model.framework.cosmos25.lora``, or an old format's file)."""
    present = [f for f in ADAPTER_FILES if (folder / f).is_file()]
    if lo.rank == 0:
        if present:
            return f"{folder / ADAPTER_DIR} holds a LoRA adapter but {source} has rank 0 (files of different runs mixed?)"
        return None
    missing = [f for f in ADAPTER_FILES if f not in present]
    if missing:
        return f"policy folder is incomplete: {source} has LoRA adapters (rank {lo.rank}) but {missing} are missing"
    try:
        saved = json.loads((folder / ADAPTER_CONFIG).read_text())
        got = (saved["r"], float(saved["lora_alpha"]), sorted(saved["target_modules"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{folder / ADAPTER_CONFIG}: unreadable ({type(e).__name__}: {e})"
    alpha = float(lo.alpha if lo.alpha is not None else lo.rank)
    want = (lo.rank, alpha, sorted(lo.target_modules))
    if got != want:
        return (
            f"{folder / ADAPTER_CONFIG} (r, lora_alpha, target_modules) = {got} but {source} "
            f"says {want} (files of different runs mixed, or edited after export?)"
        )
    return None


def read_adapter(folder: Path, step: Any) -> tuple[dict[str, Any] | None, str | None]:
    """(adapter weights, None), or (None, one line saying what is wrong): readable, finite, and
    of the step ``policy.json`` records."""
    return read_weights(folder / ADAPTER_WEIGHTS, step, folder / "policy.json", "adapter")
