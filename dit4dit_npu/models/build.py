"""Build the model from config: a local Cosmos-Predict2.5-2B diffusers folder, or "tiny".

``framework.cosmos25.base_model`` is either the string ``tiny`` (random tiny instances of the same
classes, a pure function of ``framework.cosmos25.tiny``) or a local diffusers folder with
transformer/, vae/, text_encoder/, tokenizer/, scheduler/ (loaded with ``local_files_only``;
nothing is ever downloaded). An exported policy stores only trainable weights and refers to the
base by this same string.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dit4dit_npu import device as dev
from dit4dit_npu.config import Config, ConfigError
from dit4dit_npu.models import tiny
from dit4dit_npu.models.action_head import FlowMatchingActionHead
from dit4dit_npu.models.cosmos import CosmosBackbone
from dit4dit_npu.models.dit4dit import DiT4DiT
from dit4dit_npu.models.text import PromptEncoder

TINY = "tiny"
# component folder -> file that must exist in it
COMPONENTS = {
    "transformer": "config.json",
    "vae": "config.json",
    "scheduler": "scheduler_config.json",
    "text_encoder": "config.json",
    "tokenizer": "tokenizer_config.json",
}
BACKBONE_PARTS = ("transformer", "vae", "scheduler")
TEXT_PARTS = ("text_encoder", "tokenizer")


def is_tiny(cfg: Config) -> bool:
    return cfg.framework.cosmos25.base_model == TINY


def check_base_model(path: str | Path, parts: tuple[str, ...] = tuple(COMPONENTS)) -> Path:
    """The folder and every needed component exist, else one error naming what is missing."""
    p = Path(path).expanduser()
    expect = ", ".join(f"{c}/" for c in COMPONENTS)
    if not p.is_dir():
        raise ConfigError(
            f"framework.cosmos25.base_model: {str(path)!r} is neither 'tiny' nor a folder (expected a local "
            f"Cosmos-Predict2.5-2B diffusers folder with {expect}; nothing is downloaded)"
        )
    missing = [f"{c}/{f}" for c in parts if not (p / c / (f := COMPONENTS[c])).is_file()]
    if missing:
        raise ConfigError(
            f"framework.cosmos25.base_model: {p} is missing {', '.join(missing)} "
            f"(a Cosmos-Predict2.5-2B diffusers folder has {expect})"
        )
    return p


def _load(loader: Any, path: Path, component: str, **kwargs: Any) -> Any:
    try:
        return loader.from_pretrained(str(path / component), local_files_only=True, **kwargs)
    except (OSError, ValueError) as e:
        raise ConfigError(f"framework.cosmos25.base_model: cannot load {path / component}: {e}") from None


def _frozen_dtype(cfg: Config) -> torch.dtype:
    """Frozen parts (VAE, text encoder) run in bf16 on accelerators, as the original; fp32 on CPU."""
    if dev.device_type() == dev.CPU or cfg.trainer.mixed_precision == "no":
        return torch.float32
    return dev.autocast_dtype()


def build_backbone(cfg: Config) -> CosmosBackbone:
    c = cfg.framework.cosmos25
    if is_tiny(cfg):
        transformer, vae = tiny.build_transformer(c.tiny), tiny.build_vae(c.tiny)
        scheduler = tiny.build_scheduler()
    else:
        from diffusers import AutoencoderKLWan, CosmosTransformer3DModel, UniPCMultistepScheduler

        p = check_base_model(c.base_model, BACKBONE_PARTS)
        # fp32 master weights for the trained transformer; autocast/DeepSpeed handle bf16 compute
        transformer = _load(CosmosTransformer3DModel, p, "transformer", dtype=torch.float32)
        vae = _load(AutoencoderKLWan, p, "vae", dtype=_frozen_dtype(cfg))
        scheduler = _load(UniPCMultistepScheduler, p, "scheduler")
    backbone = CosmosBackbone(
        transformer,
        vae,
        scheduler,
        conditional_frame_timestep=c.conditional_frame_timestep,
        flow_matching=c.flow_matching,
        attention_backend=c.attention_backend,
    )
    if cfg.trainer.enable_gradient_checkpointing:
        transformer.enable_gradient_checkpointing()
    return backbone


def text_identity(cfg: Config) -> str:
    """Names the text encoder weights, so a prompt cache of another model is refused."""
    c = cfg.framework.cosmos25
    if is_tiny(cfg):
        t = c.tiny
        return f"tiny:text{t.text_hidden_size}x{t.text_num_layers}h{t.text_num_heads}:seed{t.seed}"
    p = check_base_model(c.base_model, TEXT_PARTS)
    h = hashlib.sha256()
    for comp in TEXT_PARTS:  # configs + tokenizer content + weight file sizes: cheap, path-independent
        for f in sorted((p / comp).iterdir()):
            if f.suffix in (".json", ".txt", ".model"):
                h.update(f.name.encode() + f.read_bytes())
            elif f.is_file():
                h.update(f"{f.name}:{f.stat().st_size}".encode())
    return f"cosmos25:{h.hexdigest()[:16]}"


def build_prompt_encoder(cfg: Config) -> PromptEncoder:
    """Tokenizer + the Qwen2.5-VL *language model* only: the vision tower and lm_head are dropped
    right after loading (the pipeline never uses them, SPEC B1)."""
    c = cfg.framework.cosmos25
    if is_tiny(cfg):
        tok = tiny.build_tokenizer()
        full = tiny.build_text_encoder(c.tiny, tok, c.max_sequence_length)
    else:
        from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

        p = check_base_model(c.base_model, TEXT_PARTS)
        tok = _load(AutoTokenizer, p, "tokenizer")
        full = _load(Qwen2_5_VLForConditionalGeneration, p, "text_encoder", dtype=_frozen_dtype(cfg))
    language_model: nn.Module = full.model.language_model
    del full  # frees the vision tower and lm_head
    return PromptEncoder(tok, language_model, c.max_sequence_length, identity=text_identity(cfg))


def clip_frames(cfg: Config) -> int:
    """Pixel frames per training clip: video_delta_indices subsampled by action_video_freq_ratio."""
    d = cfg.datasets.vla_data
    return len(range(0, len(d.video_delta_indices), d.action_video_freq_ratio))


def build_action_head(
    cfg: Config, cross_attention_dim: int, reference_copied_repeats: bool = False
) -> nn.Module:
    # seeded from the run seed, without touching the caller's RNG: same config -> same init
    return tiny.seeded(
        cfg.seed + 3,
        lambda: FlowMatchingActionHead(
            cfg.framework.action_model, cross_attention_dim, reference_copied_repeats
        ),
    )


def build_dit4dit(cfg: Config, reference_copied_repeats: bool = False) -> DiT4DiT:
    c = cfg.framework.cosmos25
    backbone = build_backbone(cfg)
    backbone.check_extract_layer(c.extract_layer)
    head = None
    if c.training != "video":
        head = build_action_head(cfg, backbone.hidden_size, reference_copied_repeats)
    encoder = build_prompt_encoder(cfg) if c.reference_text_encoder_per_step else None
    return DiT4DiT(
        backbone,
        head,
        c,
        feature_latent_frames=backbone.latent_frames(clip_frames(cfg)),
        video_loss_weight=cfg.trainer.loss_scale.future_video,
        autocast_enabled=cfg.trainer.mixed_precision == "bf16",
        prompt_encoder=encoder,
    )


def save_tiny_base_model(cfg: Config, path: str | Path) -> Path:
    """Write the tiny base model as a diffusers-layout folder (same layout as the real one), so
    the path loader can be exercised without weights. Returns the folder."""
    if not is_tiny(cfg):
        raise ConfigError("save_tiny_base_model: framework.cosmos25.base_model must be 'tiny'")
    p = Path(path)
    backbone = build_backbone(cfg)
    backbone.transformer.save_pretrained(p / "transformer")
    backbone.vae.save_pretrained(p / "vae")
    backbone.scheduler.save_pretrained(p / "scheduler")
    c = cfg.framework.cosmos25
    tok = tiny.build_tokenizer()
    tok.save_pretrained(p / "tokenizer")
    tiny.build_text_encoder(c.tiny, tok, c.max_sequence_length).save_pretrained(p / "text_encoder")
    (p / "tiny_config.json").write_text(json.dumps(dataclasses.asdict(c.tiny)))
    return p
