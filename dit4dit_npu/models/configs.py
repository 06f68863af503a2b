"""What each module takes: model-local configs, plain records with no defaults and no checks.

The run config's ``framework`` sections (``dit4dit_npu/config/framework.py``) own the keys, their
defaults and their checks; ``dit4dit_npu/weights/model_config.py`` derives these records from them (as
torchtitan's builders do), so this package never sees a run config. A field keeps the name of the
run-config key it comes from (``model_config.py`` copies by name), except where the builder resolves a
value (the DiT sizes from ``action_model_type``, the chunk length, LoRA's alpha) or takes it from
another section (``state_noise_std``: ``trainer``).

==================  ======================================  ===========================
record              derived from                            module that takes it
==================  ======================================  ===========================
``BackboneConfig``  ``framework.cosmos25``                  ``CosmosBackbone``
``HeadConfig``      ``framework.action_model`` + trainer    ``FlowMatchingActionHead``
``DiT4DiTConfig``   ``framework.cosmos25``                  ``DiT4DiT`` (composition)
``LoraConfig``      ``framework.cosmos25.lora``             ``add_lora``
``TinySizes``       ``framework.cosmos25.tiny``             ``tiny.py``
==================  ======================================  ===========================

Error messages of the modules still name the run-config key a user would change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class VideoTimeConfig:
    """Time t of the video flow-matching loss (as the original samples it): U[0, 1), or sigmoid(N(0, 1)) with, at
    probability high_sigma_ratio, t replaced by U[high_sigma_min (None = 0.98), 1)."""

    time_distribution: Literal["uniform", "logit_normal"]
    high_sigma_ratio: float | None
    high_sigma_min: float | None


@dataclass
class BackboneConfig:
    extract_layer: int  # block whose output feeds the action head (0-indexed)
    flow_matching: VideoTimeConfig
    conditional_frame_timestep: float
    feature_noise_seed: int | None  # None = unseeded feature-pass noise
    attention_backend: str  # "auto" = the device layer's choice
    condition_latent: Literal["mean", "sample"]
    round_timesteps: bool
    video_loss_batch_fraction: float  # in (0, 1]: the video loss runs on the first ceil(f * B) samples
    video_loss_future_frames: int | None  # future latent frames the video loss predicts; None = all


@dataclass
class DiTBodyConfig:
    """Body of the DiT action head (its sizes are ``HeadConfig``'s, resolved)."""

    num_layers: int
    dropout: float
    final_dropout: bool
    interleave_self_attention: bool
    output_dim: int


@dataclass
class HeadConfig:
    dim: int  # input embedding width
    num_heads: int
    head_dim: int
    hidden_size: int  # state encoder / action decoder MLPs
    chunk_length: int  # action steps predicted per chunk
    add_pos_embed: bool
    max_seq_len: int
    noise_beta_alpha: float
    noise_beta_beta: float
    noise_s: float
    num_timestep_buckets: int
    num_inference_timesteps: int
    repeated_diffusion_steps: int
    # Training only: std of the Gaussian noise on the encoded state (one number, or one per dim;
    # 0 = off); inference always takes the clean state.
    state_noise_std: float | list[float]
    # The head is also conditioned on the noise level of its features (framework.cosmos25.one_pass).
    condition_on_noise_level: bool
    diffusion_model_cfg: DiTBodyConfig


@dataclass
class DiT4DiTConfig:
    training: Literal["joint", "action", "video"]
    backprop_action_to_backbone: bool
    one_pass: bool  # framework.cosmos25.one_pass.enabled
    inference_noise_share: float  # framework.cosmos25.one_pass.inference_noise_share


@dataclass
class LoraConfig:
    rank: int  # > 0: add_lora is only called with adapters on
    alpha: float  # resolved: the adapter output scale is alpha / rank
    dropout: float
    target_modules: list[str]


@dataclass
class TinySizes:
    """Sizes of the tiny random backbone and text encoder (``tiny.py``): the real ones'
    classes, small. Its fields are also the tiny-model cache's key (``weights/tiny_cache.py``)."""

    num_layers: int
    num_attention_heads: int
    attention_head_dim: int
    text_embed_dim: int
    adaln_lora_dim: int
    vae_base_dim: int
    text_hidden_size: int
    text_num_layers: int
    text_num_heads: int
    seed: int
    vae_latents_mean: list[float] | None
    vae_latents_std: list[float] | None

    @property
    def text_head_dim(self) -> int:
        return self.text_hidden_size // self.text_num_heads
