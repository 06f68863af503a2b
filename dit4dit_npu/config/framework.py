"""The run config's ``framework`` section: the model's hyperparameters, each declared once.

Keys, defaults and checks live here; the modules take model-local records
(``dit4dit_npu/models/configs.py``) that ``dit4dit_npu/weights/model_config.py`` derives from these
sections (torchtitan style), so the config layer imports no model code:

==============================  ====================================  ===========================
run-config key                  class                                 model record it becomes
==============================  ====================================  ===========================
``framework``                   ``FrameworkConfig``                   ``DiT4DiTConfig``
``framework.cosmos25``          ``Cosmos25Config``                    ``BackboneConfig``
``framework.cosmos25.lora``     ``LoraAdapterConfig``                 ``LoraConfig``
``framework.cosmos25.tiny``     ``TinyCosmosConfig``                  ``TinySizes``
``framework.action_model``      ``ActionModelConfig``                 ``HeadConfig``
==============================  ====================================  ===========================

Key names are DiT4DiT's (its users' YAML and ``config/migrate.py`` map onto these fields). What
a batch brings (state/action widths, clip length, frame size: the ``BatchSpec``) and what other
sections decide (gradient checkpointing, autocast, the training-only state noise) are not fields
here. ``check(key)`` validates a section where it is declared, naming the full run-config key;
the loader calls it. Torch-free: ``import dit4dit_npu.config`` must stay light.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from dit4dit_npu.errors import ConfigError, require

# framework.cosmos25.base_model: random tiny instances of the real classes instead of a folder.
TINY = "tiny"

# action_model_type -> (input embedding dim, attention heads, attention head dim)
PRESETS: dict[str, tuple[int, int, int]] = {
    "DiT-tiny": (64, 4, 16),
    "DiT-S": (384, 6, 64),
    "DiT-B": (768, 12, 64),
    "DiT-L": (1536, 32, 48),
}

# CosmosTransformer3DModel's linears inside each block: self- and cross-attention projections and
# the feed-forward (peft matches a name or a dotted suffix of a module path). The AdaLN-LoRA
# modulation (norm*.linear_*), patch embedding and output head stay frozen: they are small, and
# the conditioning they carry is what the pretrained video model is best at.
DEFAULT_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2"]


# --------------------------------------------------------------------------------------------
# framework.cosmos25: the video backbone
# --------------------------------------------------------------------------------------------


@dataclass
class FlowMatchingConfig:
    """Time t of the video flow-matching loss (as the original samples it): U[0, 1), or sigmoid(N(0, 1)) with, at
    probability high_sigma_ratio, t replaced by U[high_sigma_min (default 0.98), 1)."""

    # "uniform" is what every shipped DiT4DiT run used; "logit_normal" is the YAML default there.
    time_distribution: Literal["uniform", "logit_normal"] = "uniform"
    # With logit_normal: replace t by U[high_sigma_min, 1) with this probability (null = off).
    high_sigma_ratio: float | None = None
    high_sigma_min: float | None = None


@dataclass
class TinyCosmosConfig:
    """Sizes of the tiny random backbone and text encoder: the same diffusers/transformers classes
    as the real one (real values in comments); ``models/tiny.py`` builds them from this alone."""

    num_layers: int = 4  # 28
    num_attention_heads: int = 2  # 16
    attention_head_dim: int = 16  # 128; even and >= 12 (Cosmos' 3-axis RoPE split)
    text_embed_dim: int = 32  # 1024
    adaln_lora_dim: int = 4  # 256
    vae_base_dim: int = 8  # 96
    text_hidden_size: int = 32  # 3584
    text_num_layers: int = 2  # 28
    text_num_heads: int = 2  # 28
    seed: int = 0
    # Per-channel latent statistics (16 each) the model normalizes the tiny VAE's latents with,
    # (z - mean) / std; null = the real Wan2.1 VAE's. A random VAE's latents are ~50x smaller
    # than the real one's: under the real statistics every image becomes the same constant offset
    # plus ~1% of signal, and a policy trained on it ignores its cameras. Measure them on the
    # training images with python -m dit4dit_npu.data.latent_stats.
    vae_latents_mean: list[float] | None = None
    vae_latents_std: list[float] | None = None
    # A safetensors file of fitted weights for the tiny VAE (``dit4dit-fit-tiny-vae``: fitted to a
    # dataset's frames by reconstruction, a stand-in for the real pretrained Wan VAE), loaded over
    # the random init; null = the random VAE. Its content (not its path) keys the tiny-model cache
    # and the latent caches' VAE identity. Measure vae_latents_mean/std again for it.
    vae_weights: str | None = None

    def check(self, key: str) -> None:
        for name in ("vae_latents_mean", "vae_latents_std"):
            v = getattr(self, name)
            require(v is None or (len(v) == 16 and all(math.isfinite(x) for x in v)), f"{key}.{name}", v,
                    "16 numbers (one per latent channel), or null (= the real Wan2.1 VAE's)")
        std = self.vae_latents_std
        require(std is None or all(x > 0 for x in std), f"{key}.vae_latents_std", std, "all > 0")
        # Cosmos' 3-axis RoPE split divides by head_dim // 6 * 2 (ZeroDivisionError below 12).
        require(
            self.attention_head_dim >= 12 and self.attention_head_dim % 2 == 0,
            f"{key}.attention_head_dim", self.attention_head_dim, "even and >= 12",
        )
        if self.text_num_heads < 1 or self.text_hidden_size % self.text_num_heads:
            raise ConfigError(
                f"{key}.text_hidden_size: {self.text_hidden_size} must be divisible by text_num_heads "
                f"({self.text_num_heads})"
            )
        if self.text_head_dim % 8:
            raise ConfigError(
                f"{key}.text_hidden_size: text head dim {self.text_head_dim} (= text_hidden_size / text_num_heads) "
                "must be a multiple of 8 (mrope)"
            )

    @property
    def text_head_dim(self) -> int:
        return self.text_hidden_size // self.text_num_heads


@dataclass
class LoraAdapterConfig:
    """LoRA adapters on the Cosmos transformer through peft: only the adapters (and the action
    head) train, the base transformer stays frozen. rank 0 = off (the whole transformer trains)."""

    rank: int = 0
    # Scale of the adapter output is alpha / rank; null = rank (scale 1).
    alpha: float | None = None
    dropout: float = 0.0
    # Module names or dotted path suffixes inside the transformer (peft's target_modules).
    target_modules: list[str] = field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale_alpha(self) -> float:
        """alpha, or rank when null (scale 1)."""
        return float(self.rank) if self.alpha is None else self.alpha

    def check(self, key: str) -> None:
        require(self.rank >= 0, f"{key}.rank", self.rank, ">= 0 (0 = off)")
        if not self.enabled:
            return
        require(self.alpha is None or (math.isfinite(self.alpha) and self.alpha > 0), f"{key}.alpha",
                self.alpha, "a number > 0, or null (= rank)")
        require(math.isfinite(self.dropout) and 0 <= self.dropout < 1, f"{key}.dropout", self.dropout, "in [0, 1)")
        require(bool(self.target_modules) and all(self.target_modules), f"{key}.target_modules",
                self.target_modules, "module names of the transformer, e.g. [to_q, to_k, to_v, to_out.0]")


@dataclass
class OnePassConfig:
    """One backbone pass per joint training step instead of two: the action head reads block
    ``extract_layer`` of the video flow-matching pass itself (its forward + backward is most of a
    joint step), not a separate feature pass (docs/training.md, "Cheaper joint steps"). It changes
    what the head trains on: off unless chosen."""

    enabled: bool = False
    # Share of each batch's samples (drawn per sample) whose pass runs at the inference noise
    # convention: the future latents are the feature pass's own noise at the feature sigma, the
    # very features predict_action computes. The rest run at the video loss's own t, features the
    # head never sees at inference unless it is told their noise level (below).
    inference_noise_share: float = 0.5
    # Condition the action head on the noise level of its features (a timestep embedding added to
    # the head's own, zero at initialization); inference gives it the feature sigma.
    condition_head_on_noise_level: bool = False

    def check(self, key: str) -> None:
        s = self.inference_noise_share
        require(math.isfinite(s) and 0 <= s <= 1, f"{key}.inference_noise_share", s, "in [0, 1]")
        if not self.enabled:
            default = OnePassConfig()
            for name in ("inference_noise_share", "condition_head_on_noise_level"):
                require(getattr(self, name) == getattr(default, name), f"{key}.{name}", getattr(self, name),
                        f"{getattr(default, name)} (the default) unless {key}.enabled is true: it has no effect otherwise")
            return
        # At share 0 no training sample is at the convention: an unconditioned head would learn on
        # features of random noise levels and be given another kind at inference.
        require(s > 0 or self.condition_head_on_noise_level, f"{key}.inference_noise_share", s,
                "> 0 unless condition_head_on_noise_level is true (at 0 the head never trains on the features "
                "inference gives it and cannot tell their noise level)")


@dataclass
class Cosmos25Config:
    """The video backbone (``CosmosBackbone``), where its weights come from, and what trains."""

    # A local Cosmos-Predict2.5-2B diffusers folder, or "tiny" for random tiny instances.
    base_model: str = TINY
    tiny: TinyCosmosConfig = field(default_factory=TinyCosmosConfig)
    # Block whose output feeds the action head (0-indexed; 17 = the paper's "layer 18").
    extract_layer: int = 17
    # joint: video FM loss trains the backbone, action head on its features.
    # action: frozen-backbone features only (no video loss). video: no action head.
    training: Literal["joint", "action", "video"] = "joint"
    flow_matching: FlowMatchingConfig = field(default_factory=FlowMatchingConfig)
    # Timestep of the clean conditioning frame (the pipeline's conditional_frame_timestep).
    conditional_frame_timestep: float = 1e-4
    # The original's behaviour: the action loss never reaches the video transformer.
    backprop_action_to_backbone: bool = False
    # Seed of the feature-pass noise; null = unseeded like the original (its inference was not repeatable).
    feature_noise_seed: int | None = 42
    max_sequence_length: int = 512
    # auto = the device layer's choice (_native_npu on Ascend); or any diffusers backend name.
    attention_backend: str = "auto"
    # Persisted prompt-embedding cache (safetensors); null = <run dir>/prompt_cache.safetensors.
    prompt_cache: str | None = None
    # Conditioning latent of frame 0: posterior "mean" (deterministic), or a posterior "sample"
    # mean + std * eps as DiT4DiT drew it (set by the DiT4DiT checkpoint import,
    # dit4dit_npu/convert); its video targets stay the mean either way.
    condition_latent: Literal["mean", "sample"] = "mean"
    # Round the feature-pass sigma and the video-loss t to the transformer's compute dtype before
    # the time embedding, as DiT4DiT did (bf16: 0.99502486 -> 0.99609375; no effect in fp32). The
    # conditioning frame's timestep stays fp32 there too.
    round_timesteps: bool = False
    # Share of each training batch the video flow-matching loss runs on: its first
    # ceil(fraction * B) samples (the sampler shuffles, so a random subset). 1.0 = every sample, as
    # the original. The video transformer's forward + backward is most of a training step
    # (docs/performance.md), so 0.5 takes about a third off it, for a noisier estimate of the same
    # loss. It changes the maths (fewer video samples per step): off unless chosen.
    video_loss_batch_fraction: float = 1.0
    # Future latent frames the video loss predicts (each 4 pixel frames of the causal VAE): the
    # first k after the observation; null = all the clip has. Fewer frames = fewer tokens in the
    # video pass and a shorter VAE encode; the action head's feature pass keeps the whole clip
    # unless one_pass is on (then it is this pass, and inference runs on 1 + k latent frames too).
    video_loss_future_frames: int | None = None
    one_pass: OnePassConfig = field(default_factory=OnePassConfig)
    lora: LoraAdapterConfig = field(default_factory=LoraAdapterConfig)

    @property
    def is_tiny(self) -> bool:
        return self.base_model == TINY

    def check(self, key: str) -> None:
        # extract_layer's upper bound is the loaded transformer's depth: CosmosBackbone checks it.
        require(self.extract_layer >= 0, f"{key}.extract_layer", self.extract_layer, ">= 0")
        require(self.max_sequence_length >= 1, f"{key}.max_sequence_length", self.max_sequence_length, ">= 1")
        t = self.conditional_frame_timestep
        require(math.isfinite(t) and 0 <= t < 1, f"{key}.conditional_frame_timestep", t, "in [0, 1)")
        f = self.video_loss_batch_fraction
        require(math.isfinite(f) and 0 < f <= 1, f"{key}.video_loss_batch_fraction", f,
                "in (0, 1] (1.0 = the video loss on every sample)")
        k = self.video_loss_future_frames
        require(k is None or k >= 1, f"{key}.video_loss_future_frames", k, ">= 1, or null (= all the clip's)")
        require(k is None or self.training != "action", f"{key}.video_loss_future_frames", k,
                f"null with {key}.training 'action' (it has no video loss: the option would have no effect)")
        self.one_pass.check(f"{key}.one_pass")
        if self.one_pass.enabled:
            require(self.training == "joint", f"{key}.training", self.training,
                    "'joint' with one_pass.enabled (one pass serves the video loss and the action head)")
            require(f == 1.0, f"{key}.video_loss_batch_fraction", f,
                    "1.0 with one_pass.enabled (the one pass runs every sample: the action head reads them all)")
        if self.is_tiny:  # the tiny sizes mean nothing with a real folder
            self.tiny.check(f"{key}.tiny")
        self.lora.check(f"{key}.lora")
        if self.lora.enabled:
            require(self.training != "action", f"{key}.lora.rank", self.lora.rank,
                    "0 with training 'action' (the transformer is frozen there; LoRA needs joint or video)")


# --------------------------------------------------------------------------------------------
# framework.action_model: the flow-matching action head
# --------------------------------------------------------------------------------------------


@dataclass
class DiffusionModelConfig:
    """Body of the DiT-B action head (GR00T-N1 style, as in the original)."""

    num_layers: int = 16
    dropout: float = 0.2
    final_dropout: bool = True
    interleave_self_attention: bool = True
    # null = from the action_model_type preset.
    num_attention_heads: int | None = None
    attention_head_dim: int | None = None
    output_dim: int = 2560

    def check(self, key: str) -> None:
        require(math.isfinite(self.dropout) and 0 <= self.dropout < 1, f"{key}.dropout", self.dropout, "in [0, 1)")


@dataclass
class ActionModelConfig:
    """The action head (``FlowMatchingActionHead``). Its state/action widths are not set here:
    they are the batch's (PolicyIO pads to datasets.vla_data.max_state_dim / max_action_dim)."""

    action_model_type: Literal["DiT-S", "DiT-B", "DiT-L", "DiT-tiny"] = "DiT-B"
    # null = from the preset (768 for DiT-B).
    input_embedding_dim: int | None = None
    # hidden width of the state encoder and action decoder MLPs
    hidden_size: int = 2560
    # actions per predicted chunk: the one number (DiT4DiT's future_action_window_size is this
    # minus one; config/migrate.py converts its configs, convert/ its checkpoints)
    chunk_length: int = 8
    add_pos_embed: bool = True
    max_seq_len: int = 1024
    # flow matching: t = Beta(alpha, beta) / noise_s, integer timestep floor(t * buckets)
    noise_beta_alpha: float = 1.5
    noise_beta_beta: float = 1.0
    noise_s: float = 0.999
    num_timestep_buckets: int = 1000
    num_inference_timesteps: int = 4
    # R noise draws per backbone feature in training (they share its cross-attention K/V). One
    # source of truth (the original had two and silently read the trainer's).
    repeated_diffusion_steps: int = 4
    diffusion_model_cfg: DiffusionModelConfig = field(default_factory=DiffusionModelConfig)

    # The DiT's sizes: the explicit key, else the action_model_type preset.
    @property
    def dim(self) -> int:
        return self.input_embedding_dim or PRESETS[self.action_model_type][0]

    @property
    def num_heads(self) -> int:
        return self.diffusion_model_cfg.num_attention_heads or PRESETS[self.action_model_type][1]

    @property
    def head_dim(self) -> int:
        return self.diffusion_model_cfg.attention_head_dim or PRESETS[self.action_model_type][2]

    def check(self, key: str) -> None:
        require(self.repeated_diffusion_steps >= 1, f"{key}.repeated_diffusion_steps", self.repeated_diffusion_steps,
                ">= 1")
        require(self.chunk_length >= 1, f"{key}.chunk_length", self.chunk_length, ">= 1 (actions per chunk)")
        require(self.num_inference_timesteps >= 1, f"{key}.num_inference_timesteps", self.num_inference_timesteps,
                ">= 1")
        if self.add_pos_embed and self.chunk_length > self.max_seq_len:
            raise ConfigError(
                f"{key}.max_seq_len: {self.max_seq_len} position embeddings, but the chunk has {self.chunk_length} steps"
            )
        self.diffusion_model_cfg.check(f"{key}.diffusion_model_cfg")


# --------------------------------------------------------------------------------------------
# framework: the composition
# --------------------------------------------------------------------------------------------


@dataclass
class FrameworkConfig:
    """The whole model (``DiT4DiT``): backbone + action head."""

    cosmos25: Cosmos25Config = field(default_factory=Cosmos25Config)
    action_model: ActionModelConfig = field(default_factory=ActionModelConfig)

    def check(self, key: str = "framework") -> None:
        self.cosmos25.check(f"{key}.cosmos25")
        self.action_model.check(f"{key}.action_model")
