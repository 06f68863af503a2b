"""DiT4DiT model: Cosmos-Predict2.5 video backbone, prompt encoder, DiT flow-matching action head.

Pure torch modules with model-local configs: no data loading, no distributed code, no file I/O,
no device names (see dit4dit_npu/device/), no knowledge of the run config. ``build.py`` is the one adapter
from the run config (plus the ``BatchSpec`` PolicyIO promises) and the one place weights load.
"""

from dit4dit_npu.models.action_head import ActionHeadConfig, FlowMatchingActionHead
from dit4dit_npu.models.build import (
    action_head_config,
    backbone_config,
    build_action_head,
    build_backbone,
    build_dit4dit,
    build_prompt_encoder,
    build_skeleton,
    build_vae,
    check_base_model,
    dit4dit_config,
    save_tiny_base_model,
    text_identity,
    tiny_base_model,
    vae_identity,
)
from dit4dit_npu.models.cosmos import BackboneConfig, CosmosBackbone
from dit4dit_npu.models.dit4dit import DiT4DiT, DiT4DiTConfig
from dit4dit_npu.models.errors import ModelConfigError
from dit4dit_npu.models.pixels import FrameInputError, to_uint8, to_vae_range
from dit4dit_npu.models.text import PromptEncoder

__all__ = [
    "ActionHeadConfig",
    "BackboneConfig",
    "CosmosBackbone",
    "DiT4DiT",
    "DiT4DiTConfig",
    "FlowMatchingActionHead",
    "FrameInputError",
    "ModelConfigError",
    "PromptEncoder",
    "action_head_config",
    "backbone_config",
    "build_action_head",
    "build_backbone",
    "build_dit4dit",
    "build_prompt_encoder",
    "build_skeleton",
    "build_vae",
    "check_base_model",
    "dit4dit_config",
    "save_tiny_base_model",
    "text_identity",
    "tiny_base_model",
    "vae_identity",
    "to_uint8",
    "to_vae_range",
]
