"""Weights on disk and the model assembled from a run config (``models/`` does no file I/O).

- ``layout.py``: what a Cosmos-Predict2.5-2B diffusers folder holds, and its check;
- ``tiny_cache.py``: the tiny base model written once as such a folder (per sizes; written by each
  node's local rank 0, the node's other ranks wait for it);
- ``base_model.py``: loading a part from the folder (dtype keyword per library), the frozen
  parts' dtype, the identities of the text encoder and VAE weights;
- ``finite.py``: weights with NaN/inf refused at load, naming the file (every part ``load_weights``
  loads, the fitted tiny VAE, an ``init_from`` policy's weights);
- ``build.py``: ``build_dit4dit(cfg, spec)`` and the parts (backbone, VAE, action head, prompt
  encoder, the meta-device skeleton of ``--dry-run``);
- ``compile.py``: the opt-in torch.compile of the built backbone's blocks (``trainer.compile``,
  ``from_pretrained(compile=True)``), applied by the trainer and the policy loader.
"""

from dit4dit_npu.weights.base_model import (
    base_model_folder,
    frozen_dtype,
    load_weights,
    text_identity,
    vae_identity,
)
from dit4dit_npu.weights.build import (
    build_action_head,
    build_backbone,
    build_dit4dit,
    build_prompt_encoder,
    build_skeleton,
    build_vae,
)
from dit4dit_npu.weights.layout import check_base_model
from dit4dit_npu.weights.tiny_cache import (
    TINY_CACHE_ENV,
    save_tiny_base_model,
    tiny_base_model,
    tiny_cache_root,
)

__all__ = [
    "TINY_CACHE_ENV",
    "base_model_folder",
    "build_action_head",
    "build_backbone",
    "build_dit4dit",
    "build_prompt_encoder",
    "build_skeleton",
    "build_vae",
    "check_base_model",
    "frozen_dtype",
    "load_weights",
    "save_tiny_base_model",
    "text_identity",
    "tiny_base_model",
    "tiny_cache_root",
    "vae_identity",
]
