"""DiT4DiT model: Cosmos-Predict2.5 video backbone, prompt cache, DiT flow-matching action head.

Pure torch modules: no data loading, no distributed code, no file I/O, no device names (see
device/). Their configs are the run config's ``framework`` sections, declared once in
``configs.py`` (``Cosmos25Config`` -> ``CosmosBackbone``, ``ActionModelConfig`` ->
``FlowMatchingActionHead``, ``FrameworkConfig`` -> ``DiT4DiT``); what a batch brings (the
``BatchSpec`` PolicyIO promises) and what other sections decide (gradient checkpointing,
autocast) are constructor arguments. Loading weights (a base-model folder, the tiny-model cache)
and assembling the model from a run config is ``dit4dit_npu/weights``'s job, not this package's.

Importing the package does not import torch (``config/schema.py`` imports ``configs.py``): each
name below loads its module on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dit4dit_npu.models.action_head import FlowMatchingActionHead
    from dit4dit_npu.models.configs import ActionModelConfig, Cosmos25Config, FrameworkConfig
    from dit4dit_npu.models.cosmos import CosmosBackbone
    from dit4dit_npu.models.dit4dit import DiT4DiT
    from dit4dit_npu.models.pixels import FrameInputError, to_uint8, to_vae_range
    from dit4dit_npu.models.text import PromptEncoder

_HOMES = {
    "ActionModelConfig": "configs",
    "Cosmos25Config": "configs",
    "FrameworkConfig": "configs",
    "CosmosBackbone": "cosmos",
    "DiT4DiT": "dit4dit",
    "FlowMatchingActionHead": "action_head",
    "FrameInputError": "pixels",
    "to_uint8": "pixels",
    "to_vae_range": "pixels",
    "PromptEncoder": "text",
}

__all__ = [
    "ActionModelConfig",
    "Cosmos25Config",
    "CosmosBackbone",
    "DiT4DiT",
    "FlowMatchingActionHead",
    "FrameInputError",
    "FrameworkConfig",
    "PromptEncoder",
    "to_uint8",
    "to_vae_range",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
