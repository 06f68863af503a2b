"""DiT4DiT model: Cosmos-Predict2.5 video backbone, prompt cache, DiT flow-matching action head.

Pure torch modules: no data loading, no distributed code, no device names (see device.py).
"""

from dit4dit_npu.models.action_head import ActionInputError, FlowMatchingActionHead, resolve_dims
from dit4dit_npu.models.build import (
    build_action_head,
    build_backbone,
    build_dit4dit,
    build_prompt_encoder,
    check_base_model,
    clip_frames,
    save_tiny_base_model,
    text_identity,
)
from dit4dit_npu.models.cosmos import CosmosBackbone
from dit4dit_npu.models.dit4dit import DiT4DiT
from dit4dit_npu.models.text import PromptCache, PromptCacheError, PromptEncoder
from dit4dit_npu.models.views import FrameInputError, tile_views, to_uint8, to_vae_range

__all__ = [
    "ActionInputError",
    "CosmosBackbone",
    "DiT4DiT",
    "FlowMatchingActionHead",
    "FrameInputError",
    "PromptCache",
    "PromptCacheError",
    "PromptEncoder",
    "build_action_head",
    "build_backbone",
    "build_dit4dit",
    "build_prompt_encoder",
    "check_base_model",
    "clip_frames",
    "resolve_dims",
    "save_tiny_base_model",
    "text_identity",
    "tile_views",
    "to_uint8",
    "to_vae_range",
]
