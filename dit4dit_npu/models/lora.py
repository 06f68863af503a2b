"""LoRA adapters on a transformer through peft: add, read/write the adapter weights, merge.

    add_lora(transformer, cfg)      # a LoraConfig (models/configs.py) with rank > 0

peft replaces each targeted ``nn.Linear`` in place by a ``peft.tuners.lora.Linear`` (the original
layer as ``base_layer`` plus ``lora_A`` / ``lora_B``) and freezes every other parameter of the
module: the transformer keeps its class and forward, and its module paths only gain children
(``...attn1.to_q.lora_A.default``), so module-path config keys (learning rates, freezing) keep
working. No ``PeftModel`` wrapper: it would move every path under ``base_model.model.``.

Adapter weights are stored in peft's own layout (``PeftModel.save_pretrained``'s keys) next to
peft's ``LoraConfig`` JSON, so peft reads an exported adapter too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dit4dit_npu.errors import ConfigError
from dit4dit_npu.models.configs import LoraConfig

ADAPTER_MARK = ".lora_"  # every adapter parameter's name holds it (lora_A / lora_B / lora_embedding_*)
ADAPTER_NAME = "default"  # peft's name of the one adapter
# Keys as ``PeftModel.save_pretrained`` writes them, so peft's ``PeftModel.from_pretrained`` on a
# CosmosTransformer3DModel reads an exported adapter as it is.
PEFT_PREFIX = "base_model.model."


def peft_config(cfg: LoraConfig) -> Any:
    """peft's ``LoraConfig`` of ``framework.cosmos25.lora``."""
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules)
    )


def is_adapter_key(name: str) -> bool:
    return ADAPTER_MARK in name


def has_lora(module: nn.Module) -> bool:
    return any(is_adapter_key(n) for n, _ in module.named_parameters())


def _linear_names(module: nn.Module) -> list[str]:
    return [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]


def _matches(name: str, target: str) -> bool:
    # peft's rule for a list of target names: the whole path, or a dotted suffix of it.
    return name == target or name.endswith("." + target)


def add_lora(transformer: nn.Module, cfg: LoraConfig) -> nn.Module:
    """Inject the adapters in place (peft freezes the rest of ``transformer``); returns it.

    Every target must name at least one linear layer: a typo would otherwise silently train
    fewer layers than asked (peft itself only complains when *no* target matches)."""
    from peft import inject_adapter_in_model

    linears = _linear_names(transformer)
    unmatched = [t for t in cfg.target_modules if not any(_matches(n, t) for n in linears)]
    if unmatched:
        leaves = sorted({n.split(".", 2)[-1] if n.startswith("transformer_blocks.") else n for n in linears})
        raise ConfigError(
            f"framework.cosmos25.lora.target_modules: {unmatched} name no linear layer of the transformer "
            f"(its linears: {leaves})"
        )
    inject_adapter_in_model(peft_config(cfg), transformer)
    # The adapters are fp32 whatever the base's dtype (peft gives them the base's): they are the
    # trained weights, a bf16 base only their frozen context.
    for name, p in transformer.named_parameters():
        if is_adapter_key(name) and p.dtype != torch.float32:
            p.data = p.data.float()
    return transformer


def lora_config(transformer: nn.Module) -> Any:
    """peft's ``LoraConfig`` of the injected adapter (its ``save_pretrained`` writes
    ``adapter_config.json``)."""
    return transformer.peft_config[ADAPTER_NAME]


def adapter_state_dict(transformer: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter weights under the keys ``PeftModel.save_pretrained`` writes
    (``base_model.model.transformer_blocks.0.attn1.to_q.lora_A.weight``)."""
    from peft import get_peft_model_state_dict

    return {PEFT_PREFIX + k: v.detach() for k, v in get_peft_model_state_dict(transformer).items()}


def load_adapter_state_dict(transformer: nn.Module, sd: dict[str, torch.Tensor]) -> None:
    """The inverse of ``adapter_state_dict``, strict: every adapter weight present, of its shape,
    nothing else (``KeyError`` / ``ValueError`` naming the first problems)."""
    from peft import set_peft_model_state_dict

    expected = {k: v.shape for k, v in adapter_state_dict(transformer).items()}
    missing, unexpected = sorted(set(expected) - set(sd)), sorted(set(sd) - set(expected))
    if missing or unexpected:
        raise KeyError(
            f"adapter weights do not match the LoRA config: {len(missing)} missing (e.g. {missing[:2]}), "
            f"{len(unexpected)} unexpected (e.g. {unexpected[:2]})"
        )
    for k, shape in expected.items():
        if sd[k].shape != shape:
            raise ValueError(f"{k}: adapter shape {tuple(sd[k].shape)} != model {tuple(shape)}")
    result = set_peft_model_state_dict(transformer, {k[len(PEFT_PREFIX) :]: v for k, v in sd.items()})
    unloaded = [k for k in result.unexpected_keys if is_adapter_key(k)]
    if unloaded:  # peft's own renaming disagreed with ours: never continue with untrained adapters
        raise KeyError(f"peft did not load adapter weights {unloaded[:2]}")


def merge_lora(transformer: nn.Module) -> int:
    """Fold each adapter into its base weight (W + scale * B @ A) and put the plain layer back:
    the same function, no adapter cost at inference. Returns how many layers were merged."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    merged = 0
    for name, module in list(transformer.named_modules()):
        if isinstance(module, BaseTunerLayer):
            module.merge(safe_merge=True)  # safe: refuses a merge that would put NaN/inf in W
            parent_name, _, attr = name.rpartition(".")
            parent = transformer.get_submodule(parent_name) if parent_name else transformer
            setattr(parent, attr, module.get_base_layer())
            merged += 1
    if hasattr(transformer, "peft_config"):
        del transformer.peft_config  # the module no longer carries an adapter
    return merged
