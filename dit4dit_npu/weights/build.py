"""The model a run config describes, for batches of a ``BatchSpec``, with its weights loaded.

    model = build_dit4dit(cfg, spec)      # spec: the BatchSpec PolicyIO promises (widths, lengths)

The modules take model-local records (``models/configs.py``) derived from the run config's
``framework`` sections by ``model_config.py``; what comes from elsewhere is passed explicitly: the
widths from ``spec``, gradient checkpointing, autocast and the state noise from ``trainer``.
Weights load from the base-model folder (``base_model.py``).
"""

from __future__ import annotations

import torch

from dit4dit_npu.batch import BatchSpec
from dit4dit_npu.config import Config
from dit4dit_npu.models import tiny
from dit4dit_npu.models.action_head import FlowMatchingActionHead
from dit4dit_npu.models.cosmos import CosmosBackbone
from dit4dit_npu.models.dit4dit import DiT4DiT
from dit4dit_npu.models.lora import add_lora
from dit4dit_npu.models.text import PromptEncoder
from dit4dit_npu.weights.base_model import (
    base_model_folder,
    from_config,
    frozen_dtype,
    load,
    load_weights,
    text_identity,
)
from dit4dit_npu.weights.layout import BACKBONE_PARTS, TEXT_PARTS, check_base_model
from dit4dit_npu.weights.model_config import (
    backbone_config,
    dit4dit_config,
    lora_adapter_config,
    run_head_config,
    tiny_sizes,
)


def build_backbone(cfg: Config, load_transformer: bool = True) -> CosmosBackbone:
    """The video backbone with the base folder's weights. ``load_transformer=False``: the
    transformer as a module tree on the meta device, for a caller that then assigns every one of
    its weights (``DiT4DiT.load_trainable_state_dict``: a policy folder that holds the trained
    transformer); reading the base folder's copy would cost its size in time and memory (8.3 GB
    in fp32 at full size) only to be overwritten."""
    from diffusers import CosmosTransformer3DModel, UniPCMultistepScheduler

    c = cfg.framework.cosmos25
    p = base_model_folder(cfg, BACKBONE_PARTS)
    # fp32 master weights for the trained transformer; autocast/DeepSpeed handle bf16 compute.
    # Under LoRA the base transformer is frozen like the VAE (half the memory on accelerators);
    # the adapters are fp32.
    dtype = frozen_dtype(cfg) if c.lora.enabled else torch.float32
    if load_transformer:
        transformer = load_weights(CosmosTransformer3DModel, p, "transformer", dtype)
    elif c.lora.enabled:
        raise ValueError("load_transformer=False with LoRA: its frozen base transformer is the base folder's")
    else:
        with torch.device("meta"):  # fp32, as the trained weights are
            transformer = from_config(CosmosTransformer3DModel, p, "transformer")
    vae = build_vae(cfg)
    scheduler = load(UniPCMultistepScheduler, p, "scheduler")
    if c.lora.enabled:
        add_lora(transformer, lora_adapter_config(c.lora))
    return CosmosBackbone(transformer, vae, scheduler, backbone_config(c), cfg.trainer.enable_gradient_checkpointing)


def build_vae(cfg: Config) -> torch.nn.Module:
    """The frozen Wan VAE alone (eval mode), in the dtype training runs it in: what the latent
    cache encoder needs, without the 2B transformer."""
    from diffusers import AutoencoderKLWan

    vae = load_weights(AutoencoderKLWan, base_model_folder(cfg, ("vae",)), "vae", frozen_dtype(cfg))
    return vae.eval().requires_grad_(False)


def build_action_head(cfg: Config, spec: BatchSpec, cross_attention_dim: int) -> FlowMatchingActionHead:
    a = run_head_config(cfg)
    # seeded from the run seed, without touching the caller's RNG: same config -> same init
    return tiny.seeded(
        cfg.seed + 3, lambda: FlowMatchingActionHead(a, cross_attention_dim, spec.state_width, spec.action_width)
    )


def build_dit4dit(cfg: Config, spec: BatchSpec, load_transformer: bool = True) -> DiT4DiT:
    """The model for batches that fit ``spec`` (widths, chunk and clip length, frame size);
    ``load_transformer``: ``build_backbone``'s."""
    backbone = build_backbone(cfg, load_transformer)
    head = None
    if cfg.framework.cosmos25.training != "video":
        head = build_action_head(cfg, spec, backbone.hidden_size)
    return DiT4DiT(backbone, head, dit4dit_config(cfg.framework), spec, autocast=cfg.trainer.autocast)


def build_skeleton(cfg: Config, spec: BatchSpec) -> DiT4DiT:
    """The model's module tree on the meta device: built from the base folder's configs (or the
    tiny sizes) without reading or allocating a weight, so ``--dry-run`` runs every check the
    real build runs (base folder, extract_layer, frame size, head sizes) and the module paths of
    learning rates and freeze_modules resolve against the real tree, in a second."""
    from diffusers import AutoencoderKLWan, CosmosTransformer3DModel, UniPCMultistepScheduler

    c = cfg.framework.cosmos25
    if c.is_tiny:
        with torch.device("meta"):
            transformer, vae = tiny.build_transformer(tiny_sizes(c.tiny)), tiny.build_vae(tiny_sizes(c.tiny))
        scheduler = tiny.build_scheduler()
    else:
        p = check_base_model(c.base_model, BACKBONE_PARTS)
        with torch.device("meta"):
            transformer = from_config(CosmosTransformer3DModel, p, "transformer")
            vae = from_config(AutoencoderKLWan, p, "vae")
        scheduler = load(UniPCMultistepScheduler, p, "scheduler")
    if c.lora.enabled:
        with torch.device("meta"):
            add_lora(transformer, lora_adapter_config(c.lora))
    # not on meta: the backbone reads the scheduler's sigma
    backbone = CosmosBackbone(transformer, vae, scheduler, backbone_config(c), cfg.trainer.enable_gradient_checkpointing)
    head = None
    if c.training != "video":
        with torch.device("meta"):
            head = FlowMatchingActionHead(run_head_config(cfg), backbone.hidden_size, spec.state_width, spec.action_width)
    return DiT4DiT(backbone, head, dit4dit_config(cfg.framework), spec, autocast=cfg.trainer.autocast)


def build_prompt_encoder(cfg: Config) -> PromptEncoder:
    """Tokenizer + the Qwen2.5-VL *language model* only: the vision tower and lm_head are dropped
    right after loading (the pipeline never uses them)."""
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    c = cfg.framework.cosmos25
    p = base_model_folder(cfg, TEXT_PARTS)
    tok = load(AutoTokenizer, p, "tokenizer")
    full = load_weights(Qwen2_5_VLForConditionalGeneration, p, "text_encoder", frozen_dtype(cfg))
    language_model = full.model.language_model
    del full  # frees the vision tower and lm_head
    return PromptEncoder(tok, language_model, c.max_sequence_length, identity=text_identity(cfg))
