"""The run config schema: typed dataclasses, one per YAML section.

Keys are named as in the original DiT4DiT YAML wherever the concept is the same
(`framework.cosmos25.extract_layer`, `trainer.learning_rate.action_model`, ...), so its users
recognise them. Every key here is read by the code; a key that is not in the schema is rejected
by the loader (``loader.py``) with the closest valid name (the original silently ignored about a
dozen dead keys, SPEC C7). A missing key takes its default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal


@dataclass
class FlowMatchingConfig:
    """Time sampling of the video flow-matching loss (SPEC 1.6)."""

    # "uniform" is what every shipped DiT4DiT run used; "logit_normal" is the YAML default there.
    time_distribution: Literal["uniform", "logit_normal"] = "uniform"
    # With logit_normal: replace t by U[high_sigma_min, 1) with this probability (null = off).
    high_sigma_ratio: float | None = None
    high_sigma_min: float | None = None


@dataclass
class TinyCosmosConfig:
    """Sizes of the tiny random backbone (same diffusers/transformers classes as the real one)."""

    num_layers: int = 4
    num_attention_heads: int = 2
    attention_head_dim: int = 16  # must be even and >= 12 (Cosmos 3-axis RoPE split)
    text_embed_dim: int = 32
    adaln_lora_dim: int = 4
    vae_base_dim: int = 8
    text_hidden_size: int = 32
    text_num_layers: int = 2
    text_num_heads: int = 2
    seed: int = 0
    # Per-channel latent statistics (16 each) the model normalizes the tiny VAE's latents with,
    # (z - mean) / std; null = the real Wan2.1 VAE's. A random VAE's latents are ~50x smaller
    # than the real one's: under the real statistics every image becomes the same constant offset
    # plus ~1% of signal, and a policy trained on it ignores its cameras. Measure them on the
    # training images with bench/tiny_vae_stats.py.
    vae_latents_mean: list[float] | None = None
    vae_latents_std: list[float] | None = None


# CosmosTransformer3DModel's linears inside each block: self- and cross-attention projections and
# the feed-forward (peft matches a name or a dotted suffix of a module path). The AdaLN-LoRA
# modulation (norm*.linear_*), patch embedding and output head stay frozen: they are small, and
# the conditioning they carry is what the pretrained video model is best at.
DEFAULT_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2"]


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


@dataclass
class Cosmos25Config:
    # A local Cosmos-Predict2.5-2B diffusers folder, or "tiny" for random tiny instances.
    base_model: str = "tiny"
    tiny: TinyCosmosConfig = field(default_factory=TinyCosmosConfig)
    # Block whose output feeds the action head (0-indexed; 17 = the paper's "layer 18").
    extract_layer: int = 17
    # joint: video FM loss trains the backbone, action head on its features.
    # action: frozen-backbone features only (no video loss). video: no action head.
    training: Literal["joint", "action", "video"] = "joint"
    flow_matching: FlowMatchingConfig = field(default_factory=FlowMatchingConfig)
    conditional_frame_timestep: float = 1e-4
    # Original behaviour (SPEC A1): the action loss never reaches the video transformer.
    backprop_action_to_backbone: bool = False
    # Seed of the feature-pass noise; null = unseeded like the original (SPEC A3).
    feature_noise_seed: int | None = 42
    max_sequence_length: int = 512
    # auto = the device layer's choice (_native_npu on Ascend); or any diffusers backend name.
    attention_backend: str = "auto"
    # Persisted prompt-embedding cache (safetensors); null = <run dir>/prompt_cache.safetensors.
    prompt_cache: str | None = None
    # Conditioning latent of frame 0: posterior "mean", or a posterior "sample" as DiT4DiT drew it
    # (set by the DiT4DiT checkpoint import, dit4dit_npu/convert).
    condition_latent: Literal["mean", "sample"] = "mean"
    # Round the feature-pass sigma and the video-loss t to the transformer's compute dtype before
    # the time embedding, as DiT4DiT did (bf16: 0.99502486 -> 0.99609375; no effect in fp32).
    round_timesteps: bool = False
    lora: LoraAdapterConfig = field(default_factory=LoraAdapterConfig)


@dataclass
class DiffusionModelConfig:
    """Body of the DiT-B action head (SPEC 2.1)."""

    num_layers: int = 16
    dropout: float = 0.2
    final_dropout: bool = True
    interleave_self_attention: bool = True
    # null = from the action_model_type preset.
    num_attention_heads: int | None = None
    attention_head_dim: int | None = None
    output_dim: int = 2560


@dataclass
class ActionModelConfig:
    action_model_type: Literal["DiT-S", "DiT-B", "DiT-L", "DiT-tiny"] = "DiT-B"
    # null = from the preset (768 for DiT-B).
    input_embedding_dim: int | None = None
    hidden_size: int = 2560
    # The head's state/action widths are not set here: they are the batch's (PolicyIO pads to
    # datasets.vla_data.max_state_dim / max_action_dim).
    future_action_window_size: int = 7
    add_pos_embed: bool = True
    max_seq_len: int = 1024
    noise_beta_alpha: float = 1.5
    noise_beta_beta: float = 1.0
    noise_s: float = 0.999
    num_timestep_buckets: int = 1000
    num_inference_timesteps: int = 4
    # One source of truth (the original had two and silently read the trainer's, SPEC A10).
    repeated_diffusion_steps: int = 4
    diffusion_model_cfg: DiffusionModelConfig = field(default_factory=DiffusionModelConfig)

    @property
    def chunk_length(self) -> int:
        return self.future_action_window_size + 1


@dataclass
class FrameworkConfig:
    cosmos25: Cosmos25Config = field(default_factory=Cosmos25Config)
    action_model: ActionModelConfig = field(default_factory=ActionModelConfig)


@dataclass
class DatasetEntry:
    """One dataset of a mixture: a local LeRobot folder (relative to data_root_dir) and a weight."""

    path: str = ""
    weight: float = 1.0


@dataclass
class VLADataConfig:
    data_root_dir: str = "data"
    data_mix: list[DatasetEntry] = field(default_factory=list)
    # Create the generated demo dataset under data_root_dir when it is missing (embedded default).
    generate_demo_if_missing: bool = False
    per_device_batch_size: int = 4
    num_workers: int = 2
    # Frame offsets of the video clip (in frames, converted with each dataset's own fps).
    video_delta_indices: list[int] = field(default_factory=lambda: list(range(8)))
    # Keep every n-th clip frame for the video model (1 + 4k frames after subsampling are ideal).
    action_video_freq_ratio: int = 2
    camera_keys: list[str] = field(
        default_factory=lambda: [
            "observation.images.cam_high",
            "observation.images.cam_left_wrist",
            "observation.images.cam_right_wrist",
        ]
    )
    # Per-view size [H, W] after resize (each divisible by 16 once tiled).
    image_size: list[int] = field(default_factory=lambda: [224, 224])
    # How camera views become one frame: side by side ("width"), stacked ("height"),
    # or a near-square "grid". Any number of views; names do not matter (SPEC A4).
    view_layout: Literal["width", "height", "grid"] = "width"
    state_key: str = "observation.state"
    action_key: str = "action"
    # Padded widths of the model's state/action inputs (mixed embodiments share one width);
    # null = no padding (the encoded width: sincos doubles the state dims).
    max_state_dim: int | None = None
    max_action_dim: int | None = None
    # Action normalization: min_max to [-1, 1] (original), mean_std, q99 (q01/q99 to [-1, 1]).
    action_norm: Literal["min_max", "mean_std", "q99"] = "min_max"
    # State input: sincos of raw joints (original), or normalized like actions, or raw.
    state_norm: Literal["sincos", "min_max", "mean_std", "q99", "none"] = "min_max"
    # Episode-level hold-out: a fraction of each dataset's episodes, or explicit lists
    # ({dataset path: [episode indices]}); deterministic from the seed.
    val_fraction: float = 0.1
    val_episodes: dict[str, list[int]] | None = None
    # A latent cache folder (python -m dit4dit_npu.data.encode_latents): training reads each
    # sample's VAE latents from it instead of decoding and encoding video; null = encode online.
    latent_cache: str | None = None


@dataclass
class DatasetsConfig:
    vla_data: VLADataConfig = field(default_factory=VLADataConfig)


@dataclass
class OptimizerConfig:
    """AdamW (the only optimizer the original ran; its `name` key is not needed)."""

    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 1e-8


@dataclass
class SchedulerKwargs:
    min_lr: float = 5e-7


@dataclass
class LossScaleConfig:
    # total = action_loss + future_video * video_loss  (lambda, SPEC 3.4)
    future_video: float = 1.0


@dataclass
class EMAConfig:
    """Exponential moving average of the trainable weights (train/ema.py). With it on, held-out
    evaluation and the exported policy use the average. decay null = off."""

    # Each update: ema = decay * ema + (1 - decay) * weights. It averages over about
    # update_interval / (1 - decay) steps (0.99, interval 1: the last ~100 steps).
    decay: float | None = None
    # Until this step (inclusive) the average just copies the weights: early weights, far from
    # the final ones, never enter it.
    start_step: int = 0
    # Update every n optimizer steps (cheaper for huge models; the horizon grows by n).
    update_interval: int = 1


@dataclass
class SimEvalConfig:
    """Closed-loop success in simulation during training (dit4dit_npu/sim, needs the sim extra):
    every ``interval`` steps the current weights (the EMA's when on) are exported and run by
    ``python -m dit4dit_npu.sim.eval`` in a subprocess, so a simulator crash cannot kill training.
    task null = off."""

    # A dit4dit_npu.sim task: transfer_cube | insertion.
    task: str | None = None
    episodes: int = 10
    interval: int = 1000
    # Camera [H, W] the scene renders; null = the training videos' size (no resize).
    size: list[int] | None = None
    # Episode i uses scene seed seed + i (demos use seeds >= 100000).
    seed: int = 0
    # Actions executed per policy query; null = the whole chunk.
    replan: int | None = None
    max_steps: int = 400
    workers: int = 1


@dataclass
class TrainerConfig:
    max_train_steps: int = 100_000
    num_warmup_steps: int = 5000
    save_interval: int = 5000
    eval_interval: int = 1000
    logging_frequency: int = 10
    # {base: lr, <dotted module path>: lr}; a path that names no module is an error (SPEC A13).
    learning_rate: dict[str, float] = field(
        default_factory=lambda: {"base": 1e-5, "backbone.transformer": 1e-5, "action_model": 1e-4}
    )
    lr_scheduler_type: Literal["cosine_with_min_lr", "constant_with_warmup", "constant"] = "cosine_with_min_lr"
    scheduler_specific_kwargs: SchedulerKwargs = field(default_factory=SchedulerKwargs)
    freeze_modules: list[str] = field(default_factory=list)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    gradient_clipping: float = 1.0
    gradient_accumulation_steps: int = 1
    enable_gradient_checkpointing: bool = False
    # bf16 autocast on the device type from device.py; "no" = fp32 (default on CPU runs).
    mixed_precision: Literal["bf16", "no"] = "bf16"
    # Path of an accelerate/DeepSpeed json (relative to the repo or absolute); null = no DeepSpeed.
    deepspeed_config: str | None = "configs/deepspeed/zero2.json"
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    # null = fresh run; "auto" = latest checkpoint of this run; or a checkpoint folder.
    resume: str | None = None
    keep_last_checkpoints: int = 2
    # Number of held-out samples scored at each eval_interval (0 = off).
    eval_samples: int = 32
    ema: EMAConfig = field(default_factory=EMAConfig)
    sim_eval: SimEvalConfig = field(default_factory=SimEvalConfig)


@dataclass
class Config:
    run_id: str = "dit4dit"
    run_root_dir: str = "runs"
    seed: int = 42
    trackers: list[Literal["jsonl", "tensorboard", "wandb"]] = field(default_factory=lambda: ["jsonl"])
    wandb_entity: str | None = None
    wandb_project: str = "dit4dit-npu"
    framework: FrameworkConfig = field(default_factory=FrameworkConfig)
    datasets: DatasetsConfig = field(default_factory=DatasetsConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run_root_dir) / self.run_id
