"""DiT4DiT model: Cosmos-Predict2.5 video backbone, prompt cache, DiT flow-matching action head.

Pure torch modules: no data loading, no distributed code, no file I/O, no device names (see
device/), no run config. Each module takes a model-local record (``configs.py``: ``BackboneConfig``
-> ``CosmosBackbone``, ``HeadConfig`` -> ``FlowMatchingActionHead``, ``DiT4DiTConfig`` ->
``DiT4DiT``); what a batch brings (the ``BatchSpec`` PolicyIO promises) and what other sections
decide (gradient checkpointing, autocast) are constructor arguments. Deriving the records from a
run config, loading weights (a base-model folder, the tiny-model cache) and assembling the model
is ``dit4dit_npu/weights``'s job, not this package's.
"""

from dit4dit_npu.models.action_head import FlowMatchingActionHead
from dit4dit_npu.models.configs import BackboneConfig, DiT4DiTConfig, HeadConfig
from dit4dit_npu.models.cosmos import CosmosBackbone
from dit4dit_npu.models.dit4dit import DiT4DiT
from dit4dit_npu.models.pixels import FrameInputError, to_uint8, to_vae_range
from dit4dit_npu.models.prompt_cache import PromptCache, PromptCacheError
from dit4dit_npu.models.text import PromptEncoder

__all__ = [
    "BackboneConfig",
    "CosmosBackbone",
    "DiT4DiT",
    "DiT4DiTConfig",
    "FlowMatchingActionHead",
    "FrameInputError",
    "HeadConfig",
    "PromptCache",
    "PromptCacheError",
    "PromptEncoder",
    "to_uint8",
    "to_vae_range",
]
