"""Shared helpers for bench/ scripts: FLOP proportions of the model parts, timing. The real model's
sizes, the batch spec of a config and the memory readings are the memory planner's
(``dit4dit_npu/train/activations.py``, ``memory_plan.py``), imported here for the benches."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from dit4dit_npu import device as dev
from dit4dit_npu.batch import Batch
from dit4dit_npu.models import DiT4DiT, PromptEncoder
from dit4dit_npu.train.activations import FULL_SIZE, QWEN_VOCAB, full_size_text_config, step_peak_mib  # noqa: F401
from dit4dit_npu.train.memory_plan import ROBOTWIN_DIMS  # noqa: F401
from dit4dit_npu.train.memory_plan import plan_spec as bench_spec  # noqa: F401


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
