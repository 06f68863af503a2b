"""Shared helpers for bench/ scripts: the batch spec of a config, FLOP proportions of the model
parts, memory readings."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from dit4dit_npu import device as dev
from dit4dit_npu.batch import Batch, BatchSpec
from dit4dit_npu.config import Config, TinyCosmosConfig
from dit4dit_npu.models import DiT4DiT, PromptEncoder
from dit4dit_npu.transforms.policy_io import config_spec

# Cosmos-Predict2.5-2B's transformer, Wan2.1's VAE and Qwen2.5-VL-7B's text model
# (cosmos25_tiny_recipe.md §1), as the tiny builder's sizes.
FULL_SIZE = TinyCosmosConfig(
    num_layers=28, num_attention_heads=16, attention_head_dim=128, text_embed_dim=1024, adaln_lora_dim=256,
    vae_base_dim=96, text_hidden_size=3584, text_num_layers=28, text_num_heads=28,
)
QWEN_VOCAB = 152064  # Qwen2.5-VL's vocabulary (the embedding table's rows)


def full_size_text_config(vocab_size: int, layers: int = 28, pad_id: int = 0, eos_id: int = 0) -> dict:
    """Qwen2.5-VL-7B's language model (``Qwen2_5_VLTextConfig`` keyword arguments)."""
    return dict(
        vocab_size=vocab_size, hidden_size=3584, intermediate_size=18944, num_hidden_layers=layers,
        num_attention_heads=28, num_key_value_heads=4, rope_theta=1e6, max_position_embeddings=2048,
        rope_scaling={"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
        bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id,
    )


# RoboTwin's aloha-agilex: 14 absolute joints of state and of action (the width without padding).
ROBOTWIN_DIMS = 14


def bench_spec(cfg: Config) -> BatchSpec:
    """What the data side brings for ``cfg`` with RoboTwin's widths (the benches make random
    batches of this shape; no dataset is read)."""
    return config_spec(cfg, ROBOTWIN_DIMS, ROBOTWIN_DIMS)


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
    7.3 : 2.52 : 2.35 TFLOP = 2.9 : 1 : 0.93, cosmos25_tiny_recipe.md §4)."""
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


def step_peak_mib(fn: Callable[[], object]) -> tuple[float, str]:
    """Peak memory that ``fn`` adds on top of what was live before it (activations, gradients,
    temporaries), in MiB, and how it was measured.

    Accelerator: the caching allocator's peak minus what was allocated at the start. CPU: torch
    keeps no allocator statistics there (and peak RSS is dominated by the ~1 GB of mapped torch
    libraries), so we replay the profiler's per-allocation memory events (every torch CPU
    alloc/free with its size and time) and take the high-water mark of their running sum.
    """
    if dev.device_type() != dev.CPU:
        dev.synchronize()
        base = dev.memory_stats()["allocated_gib"]
        dev.reset_peak_memory()
        fn()
        dev.synchronize()
        return (dev.memory_stats()["peak_allocated_gib"] - base) * 1024, "allocator peak"
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return peak / 2**20, "profiler alloc/free events"


def param_mib(module: torch.nn.Module) -> float:
    return sum(p.numel() * p.element_size() for p in module.parameters()) / 2**20


def timed(fn: Callable[[], object]) -> float:
    """Wall seconds of fn, with the device drained before and after."""
    dev.synchronize()
    t0 = time.perf_counter()
    fn()
    dev.synchronize()
    return time.perf_counter() - t0
