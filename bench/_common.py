"""Shared helpers for bench/ scripts: FLOP proportions of the model parts, timing, the full-size
random model, a robot observation and an end-to-end predict call, a batch as the latent cache
delivers it. The real model's sizes, the batch spec of a config and the memory readings are the
memory planner's (``dit4dit_npu/train/activations.py``, ``memory_plan.py``), imported here for the
benches. What several benches share lives here and nowhere else: a bench imports ``_common``,
``_original`` and ``reference``, never another bench (``tests/test_bench_imports.py``)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.profiler import record_function
from torch.utils.flop_counter import FlopCounterMode

from dit4dit_npu import device as dev
from dit4dit_npu.batch import Batch, BatchSpec
from dit4dit_npu.config import Config
from dit4dit_npu.models import DiT4DiT, PromptEncoder
from dit4dit_npu.models.vae import vae_latents
from dit4dit_npu.train.activations import FULL_SIZE, QWEN_VOCAB, full_size_text_config, step_peak_mib  # noqa: F401
from dit4dit_npu.train.memory_plan import ROBOTWIN_DIMS  # noqa: F401
from dit4dit_npu.train.memory_plan import plan_spec as bench_spec  # noqa: F401
from dit4dit_npu.transforms import FeatureStats, PolicyIO

INFER_STAGES = ("PolicyIO parse", "prompt embeddings", "VAE encode", "feature pass", "action sampling", "unnormalize")


class Timer:
    """Stage -> wall seconds of this round (device drained around each stage)."""

    def __init__(self) -> None:
        self.t: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        dev.synchronize()
        t0 = time.perf_counter()
        with record_function(name):
            yield
        dev.synchronize()
        self.t[name] = self.t.get(name, 0.0) + time.perf_counter() - t0


@torch.no_grad()
def staged_predict(model, io: PolicyIO, obs: dict, seed: int, stage: Callable) -> np.ndarray:
    """``Policy``'s call with ``DiT4DiT.predict_action``'s calls one by one (same calls, same order)."""
    bb = model.backbone
    model.train(False)
    with stage("PolicyIO parse"):
        batch, _ = io.encode_observation(obs)
        b = model._checked(batch, training=False)
    with stage("prompt embeddings"):
        prompts = model.prompt_embeddings(b.instruction)
    with stage("VAE encode"):
        cond = bb.encode_clip(model.video_input(b.frames[:, :1]), None, torch.Generator().manual_seed(seed + 1))[1]
    with dev.autocast(enabled=model.autocast):
        with stage("feature pass"):
            feats = bb.features(cond, prompts, model.feature_latent_frames, call_seed=seed)
    with stage("action sampling"):
        normalized = model.action_model.sample(feats, b.state, torch.Generator().manual_seed(seed))
    with stage("unnormalize"):
        return io.decode_actions(normalized)


def first_row(batch: Batch) -> Batch:
    """Sample 0 of a batch, as a batch of one."""
    rows = {f.name: v[:1] for f in dataclasses.fields(batch) if (v := getattr(batch, f.name)) is not None}
    return dataclasses.replace(batch, **rows)


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of one call (matmul/conv/SDPA at 2 per multiply-add), as torch's FlopCounterMode counts."""
    with FlopCounterMode(display=False) as fc:
        fn()
    return int(fc.get_total_flops())


@torch.no_grad()
def part_flops(model: DiT4DiT, encoder: PromptEncoder, batch: Batch) -> dict[str, float]:
    """Per-sample FLOPs of: the text encoder on one prompt, one full transformer forward on the
    training clip, one VAE encode of that clip (the proportions the real model has are
    7.3 : 2.52 : 2.35 TFLOP = 2.9 : 1 : 0.93: Qwen2.5-VL-7B's language model, Cosmos-Predict2.5-2B's
    transformer, Wan2.1's VAE)."""
    one = first_row(batch).to(model.device)
    video = model.video_input(one.frames)
    prompts = encoder.encode(one.instruction).to(model.device)
    bb = model.backbone
    latents = bb.encode_video(video)
    sigma = torch.tensor([0.5], device=model.device)
    inputs = bb.transformer_inputs(latents[:, :, :1], latents, sigma, prompts)
    return {
        "text_encoder": count_flops(lambda: encoder.encode(one.instruction)),
        "transformer_fwd": count_flops(lambda: bb.transformer(**inputs)),
        "vae_encode": count_flops(lambda: bb.encode_video(video)),
        "tokens": latents.shape[2] * latents.shape[3] * latents.shape[4] // 4,
    }


def param_mib(module: torch.nn.Module) -> float:
    return sum(p.numel() * p.element_size() for p in module.parameters()) / 2**20


def timed(fn: Callable[[], object]) -> float:
    """Wall seconds of fn, with the device drained before and after."""
    dev.synchronize()
    t0 = time.perf_counter()
    fn()
    dev.synchronize()
    return time.perf_counter() - t0


def with_cached_latents(model, batch: Batch) -> Batch:
    """The batch as a latent cache delivers it: the clip's VAE posterior mean, no frames."""
    video = model.video_input(batch.frames.to(model.device))
    return dataclasses.replace(batch, frames=None, latents=vae_latents(model.backbone.vae, video))


def plain_predict(model, io: PolicyIO, obs: dict, seed: int) -> np.ndarray:
    batch, _ = io.encode_observation(obs)
    return io.decode_actions(model.predict_action(batch, seed=seed))


def placeholder(dim: int) -> FeatureStats:  # [-1, 1] statistics: values only, widths come from the config
    return FeatureStats(*(np.full(dim, v) for v in (-1.0, 1.0, 0.0, 1.0, -1.0, 1.0)), count=0)


def observation(io: PolicyIO, native: tuple[int, int], instruction: str, seed: int) -> dict:
    """One robot observation: native-size uint8 RGB frames per camera, raw state, the instruction."""
    rng = np.random.default_rng(seed)
    obs: dict = {k: rng.integers(0, 256, (*native, 3), dtype=np.uint8) for k in io.camera_keys}
    obs["state"] = rng.uniform(-1, 1, io.state_dim).astype(np.float32)
    obs["instruction"] = instruction
    return obs


def build_full_size(
    cfg: Config, spec: BatchSpec, device: torch.device, dtype: torch.dtype, layers: int = 28
) -> tuple[DiT4DiT, Any]:
    """Cosmos-Predict2.5-2B transformer + Wan2.1 VAE + a Qwen2.5-VL-7B-sized text model, random,
    built directly on ``device`` from the real configs (``FULL_SIZE``) and composed with the
    ``framework`` sections of ``cfg``. The tokenizer is the tiny one: its
    vocabulary only changes the embedding table, not the per-token compute. ``layers`` < 28 keeps
    every width but fewer blocks (a CPU smoke test of this builder)."""
    from diffusers import AutoencoderKLWan, CosmosTransformer3DModel
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    from dit4dit_npu.models import CosmosBackbone, PromptEncoder
    from dit4dit_npu.models import tiny as tiny_parts
    from dit4dit_npu.weights import build_action_head
    from dit4dit_npu.weights.model_config import backbone_config, dit4dit_config, tiny_sizes

    real = dataclasses.replace(FULL_SIZE, num_layers=layers, text_num_layers=layers)
    c = cfg.framework.cosmos25
    bb_cfg = dataclasses.replace(c, extract_layer=min(c.extract_layer, layers - 1))
    with torch.device(device):
        transformer = CosmosTransformer3DModel(**tiny_parts.transformer_kwargs(tiny_sizes(real))).to(dtype)
        vae = AutoencoderKLWan().to(dtype)  # the class defaults are Wan2.1's
        tok = tiny_parts.build_tokenizer()
        text = Qwen2_5_VLTextModel(
            Qwen2_5_VLTextConfig(**full_size_text_config(len(tok), layers, tok.pad_token_id, tok.eos_token_id))
        ).to(dtype)
    backbone = CosmosBackbone(
        transformer, vae, tiny_parts.build_scheduler(), backbone_config(bb_cfg), cfg.trainer.enable_gradient_checkpointing
    )
    head = build_action_head(cfg, spec, backbone.hidden_size).to(device)
    encoder = PromptEncoder(tok, text, cfg.framework.cosmos25.max_sequence_length, identity="full-size-random")
    framework = dataclasses.replace(cfg.framework, cosmos25=bb_cfg)
    model = DiT4DiT(backbone, head, dit4dit_config(framework), spec, autocast=True)
    return model, encoder
