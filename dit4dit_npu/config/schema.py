"""The run config schema: typed dataclasses, one per YAML section.

Keys are named as in the original DiT4DiT YAML wherever the concept is the same
(`framework.cosmos25.extract_layer`, `trainer.learning_rate.action_model`, ...), so its users
recognise them. Every key here is read by the code; a key that is not in the schema is rejected
by the loader (``loader.py``) with the closest valid name (the original silently ignored about a
dozen dead keys). A missing key takes its default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

# The model's and the data's sections have their own files (framework.py, datasets.py); re-exported
# here so that the whole schema reads from one place.
from dit4dit_npu.config.datasets import DatasetEntry, DatasetsConfig, VectorPart, VLADataConfig
from dit4dit_npu.config.framework import (
    ActionModelConfig,
    Cosmos25Config,
    DiffusionModelConfig,
    FlowMatchingConfig,
    FrameworkConfig,
    LoraAdapterConfig,
    OnePassConfig,
    TinyCosmosConfig,
)
from dit4dit_npu.errors import ConfigError, require

__all__ = [
    "ActionModelConfig",
    "Config",
    "Cosmos25Config",
    "DatasetEntry",
    "DatasetsConfig",
    "DiffusionModelConfig",
    "EMAConfig",
    "FlowMatchingConfig",
    "FrameworkConfig",
    "LoraAdapterConfig",
    "LossScaleConfig",
    "OnePassConfig",
    "OptimizerConfig",
    "SchedulerKwargs",
    "SimEvalConfig",
    "TinyCosmosConfig",
    "TrainerConfig",
    "VLADataConfig",
    "VectorPart",
]


@dataclass
class OptimizerConfig:
    """AdamW (the only optimizer the original ran; its `name` key is not needed)."""

    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 1e-8

    def check(self, key: str) -> None:
        require(len(self.betas) == 2 and all(math.isfinite(b) and 0 <= b < 1 for b in self.betas), f"{key}.betas",
                self.betas, "[beta1, beta2], each in [0, 1)")
        require(math.isfinite(self.eps) and self.eps > 0, f"{key}.eps", self.eps, "> 0")
        require(math.isfinite(self.weight_decay) and self.weight_decay >= 0, f"{key}.weight_decay",
                self.weight_decay, ">= 0")


@dataclass
class SchedulerKwargs:
    min_lr: float = 5e-7

    def check(self, key: str) -> None:
        require(math.isfinite(self.min_lr) and self.min_lr >= 0, f"{key}.min_lr", self.min_lr, ">= 0")


@dataclass
class LossScaleConfig:
    # total = action_loss + future_video * video_loss  (the original's lambda)
    future_video: float = 1.0

    def check(self, key: str) -> None:
        fv = self.future_video
        require(math.isfinite(fv) and fv >= 0, f"{key}.future_video", fv, ">= 0")


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

    def check(self, key: str) -> None:
        if self.decay is not None:
            require(math.isfinite(self.decay) and 0 < self.decay < 1, f"{key}.decay", self.decay,
                    "in (0, 1), or null (= off)")
        require(self.start_step >= 0, f"{key}.start_step", self.start_step, ">= 0")
        require(self.update_interval >= 1, f"{key}.update_interval", self.update_interval, ">= 1")


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

    def check(self, key: str) -> None:
        for name in ("episodes", "interval", "max_steps", "workers"):
            require(getattr(self, name) >= 1, f"{key}.{name}", getattr(self, name), ">= 1")
        require(self.replan is None or self.replan >= 1, f"{key}.replan", self.replan, ">= 1, or null (= whole chunk)")
        require(self.seed >= 0, f"{key}.seed", self.seed, ">= 0")
        require(
            self.size is None or (len(self.size) == 2 and all(x >= 16 and x % 2 == 0 for x in self.size)),
            f"{key}.size", self.size, "[height, width], each even and >= 16, or null (= the training size)",
        )


@dataclass
class TrainerConfig:
    max_train_steps: int = 100_000
    num_warmup_steps: int = 5000
    save_interval: int = 5000
    eval_interval: int = 1000
    logging_frequency: int = 10
    # {base: lr, <dotted module path>: lr}; a path that names no module is an error (the original ignored
    # a mistyped path silently).
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
    # torch.compile each transformer block of the video backbone (dit4dit_npu/weights/compile.py):
    # the same losses, faster steps where inductor fuses the elementwise work (CPU: docs/
    # performance.md), after a one-off warm-up of the first steps. Refused on Ascend NPU until a
    # device run shows it works; inference has its own switch (from_pretrained(compile=True), --compile).
    compile: bool = False
    # bf16 autocast on the device type from dit4dit_npu.device; "no" = fp32 (default on CPU runs).
    mixed_precision: Literal["bf16", "no"] = "bf16"
    # Path of an accelerate/DeepSpeed json (relative to the repo or absolute); null = no DeepSpeed.
    deepspeed_config: str | None = "configs/deepspeed/zero2.json"
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    # Joint training: the video loss on every k-th optimizer step only (steps 0, k, 2k, ...); the
    # others are no-video steps (the action loss, from the feature pass of the observation alone),
    # which cost about what a one-frame-clip step costs. 1 = every step. The weight stays
    # loss_scale.future_video on the steps that have it (on average future_video / k per step), and
    # metrics.jsonl's video_loss averages the no-video steps' 0 in.
    video_loss_interval: int = 1
    # Joint training: the video loss only on the steps taken while the run's share of its training
    # lies in [start, end) (0 = the first step; 1 = the end of max_train_steps or of
    # max_train_time_s, whichever comes first: the LR schedule's position under
    # lr_schedule_clock=train_time); the other steps are no-video steps, as video_loss_interval's.
    # [0, 0.5]: the video objective shapes the backbone in the first half, the head then gets
    # no-video steps at their cost; [0.5, 1]: the other way round. With video_loss_interval > 1
    # a step needs both. [0, 1] = every step.
    video_loss_span: list[float] = field(default_factory=lambda: [0.0, 1.0])
    # A budget of training seconds (equal-time comparisons of objectives whose steps cost
    # differently): the run stops at the first step boundary past it (or at max_train_steps),
    # saves a whole checkpoint and exports its policy there. Training seconds leave out start-up,
    # data/cache/model building, evaluations and saves (train/budget.py); each checkpoint records
    # them, and a resumed run continues the count. null = no budget.
    max_train_time_s: float | None = None
    # A checkpoint at the first step boundary past every multiple of this many training seconds,
    # besides save_interval's: one run gives a curve against training time. null = off.
    save_every_s: float | None = None
    # What moves the LR schedule: "steps" over max_train_steps (the original's); "train_time"
    # (needs max_train_time_s) the further of the step count and the budget's share spent
    # (train/optim.py schedule_position), so a costlier arm of an equal-time comparison anneals too.
    lr_schedule_clock: Literal["steps", "train_time"] = "steps"
    # What a training second is: "wall", the loop's wall time; "process_cpu", the process's CPU
    # time (a data-loader worker's not counted), which gives runs sharing cores equal compute.
    train_time_clock: Literal["wall", "process_cpu"] = "wall"
    # null = fresh run; "auto" = latest checkpoint of this run; or a checkpoint folder.
    resume: str | None = None
    # A policy folder (or a checkpoint or run folder holding one) whose weights a fresh run starts
    # from: a video-pretraining run's transformer, or a trained policy to fine-tune
    # (dit4dit_npu/train/init_from.py). Parameters it does not hold keep their initialization; a
    # resume ignores it (its checkpoint already holds the weights).
    init_from: str | None = None
    keep_last_checkpoints: int = 2
    # How long (seconds) a rank waits in a collective (all-reduce, barrier) for the other ranks
    # before the job stops with one line naming the wait: a rank that stalls (a hung card, a
    # stopped process) otherwise holds every other card for the backend's default, 30 min (gloo,
    # hccl) or 10 min (nccl). It must exceed the longest time one rank legitimately works alone
    # while the others wait (rank 0 exporting and hashing a checkpoint, encoding the prompt cache
    # on a first start, a trainer.sim_eval episode batch): docs/operations.md has the reasoning.
    collective_timeout_s: float = 600.0
    # Number of held-out samples scored at each eval_interval (0 = off).
    eval_samples: int = 32
    ema: EMAConfig = field(default_factory=EMAConfig)
    sim_eval: SimEvalConfig = field(default_factory=SimEvalConfig)
    # Augmentation (training only; the policy folder never carries it). Gaussian noise of this std
    # added to the encoded state (normalized units) of each of the R noisy samples before the
    # action head's state encoder; one number for every dim, or one per encoded state dim (0 keeps
    # a dim clean, e.g. grippers). A policy trained on a few demonstrations with a clean state
    # learns to tell them apart by the state alone (the state a few steps into a reach says which
    # demo it is) and ignores its cameras, so in closed loop it replays an average reach; noise
    # blurs that shortcut and leaves the cameras to say where to go. 0 = off (the original's
    # behaviour, bit for bit); inference always takes the clean state. (Was
    # framework.action_model.state_noise_std: still read, with a notice, config/migrate.py.)
    state_noise_std: float | list[float] = 0.0
    # A run in which a trainable module gets no loss (the video transformer with no video loss and
    # the action loss detached from its features; training 'video' with future_video 0) would log
    # grad_norm 0 and save that module as it started: it is refused at its start
    # (config/objective.py). true runs it anyway.
    allow_untrained_modules: bool = False

    @property
    def autocast(self) -> bool:
        """bf16 autocast around the backbone (what the model is built with)."""
        return self.mixed_precision == "bf16"

    def check(self, key: str = "trainer") -> None:
        if "base" not in self.learning_rate:
            raise ConfigError(f"{key}.learning_rate: needs a 'base' entry")
        for name, lr in self.learning_rate.items():
            require(math.isfinite(lr) and lr > 0, f"{key}.learning_rate.{name}", lr, "a number > 0")
        self.scheduler_specific_kwargs.check(f"{key}.scheduler_specific_kwargs")
        for name in ("max_train_steps", "save_interval", "eval_interval", "logging_frequency",
                     "gradient_accumulation_steps", "keep_last_checkpoints", "video_loss_interval"):
            if (v := getattr(self, name)) < 1:
                hint = " (turn evaluation off with trainer.eval_samples=0)" if name == "eval_interval" else ""
                raise ConfigError(f"{key}.{name}: got {v}, expected >= 1{hint}")
        for name in ("max_train_time_s", "save_every_s"):
            v = getattr(self, name)
            require(v is None or (math.isfinite(v) and v > 0), f"{key}.{name}", v, "a number of seconds > 0, or null (= off)")
        if self.lr_schedule_clock == "train_time" and self.max_train_time_s is None:
            raise ConfigError(f"{key}.lr_schedule_clock: train_time needs {key}.max_train_time_s (a budget of training "
                              "seconds for the schedule to end at); set it, or lr_schedule_clock=steps")
        require(self.num_warmup_steps >= 0, f"{key}.num_warmup_steps", self.num_warmup_steps, ">= 0")
        require(math.isfinite(self.collective_timeout_s) and self.collective_timeout_s > 0,
                f"{key}.collective_timeout_s", self.collective_timeout_s, "a number of seconds > 0")
        require(self.eval_samples >= 0, f"{key}.eval_samples", self.eval_samples, ">= 0 (0 = no evaluation)")
        require(math.isfinite(self.gradient_clipping) and self.gradient_clipping > 0, f"{key}.gradient_clipping",
                self.gradient_clipping, "> 0")
        self.loss_scale.check(f"{key}.loss_scale")
        self.optimizer.check(f"{key}.optimizer")
        self.ema.check(f"{key}.ema")
        self.sim_eval.check(f"{key}.sim_eval")
        span = self.video_loss_span
        require(len(span) == 2 and all(math.isfinite(v) for v in span) and 0 <= span[0] < span[1] <= 1,
                f"{key}.video_loss_span", span, "[start, end] with 0 <= start < end <= 1 (shares of the training; [0, 1] = every step)")
        stds = self.state_noise_std if isinstance(self.state_noise_std, list) else [self.state_noise_std]
        require(bool(stds) and all(math.isfinite(v) and v >= 0 for v in stds), f"{key}.state_noise_std",
                self.state_noise_std, "a number >= 0 (0 = off), or a non-empty list of them (one per encoded state dim)")


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
