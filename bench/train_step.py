"""Training-step time and peak memory: our path vs the reference-faithful path, same model, same batch.

    python bench/train_step.py [--config bench/medium.yaml] [--steps 5] [key=value overrides ...]
    python bench/train_step.py --config configs/robotwin/dit4dit_robotwin_tiny.yaml --batch-size 8
    python bench/train_step.py --full-size [--peak-tflops 989]   # accelerator: random-init real sizes, bf16
    python bench/train_step.py --smoke   # seconds: the tiny config, batch 2, 1 timed step per path, no projection
    python bench/train_step.py --options [--cached] [--smoke]   # the cheaper joint-step options (bench/_joint_options.py)

"reference" is the original DiT4DiT's step (B1-B5 of ``bench/reference.py``), built by ``bench/reference.py`` from the
same modules and weights: the text encoder every step; a full-depth feature pass with autograd on
(its graph kept alive until the loss); a second, per-sample VAE encode of the zero-padded
conditioning clip (stochastic sample) besides the batched ground-truth encode; and R materialised
copies of the features for the action head. "ours" is ``DiT4DiT.forward``: the prompt cache, an
early-exit no-grad feature pass, one batched VAE encode and shared K/V for the R repeats. Both run
forward + backward + AdamW step on the same model and optimizer, alternating step by step so
machine noise hits both alike; the median is shown.

"cached" is ours on the same batch with its clip latents precomputed, as a latent cache
(``datasets.vla_data.latent_cache``, ``python -m dit4dit_npu.data.encode_latents``) delivers them:
the step skips its VAE encode and nothing else changes. (Training from the cache also skips the
loader's video decoding, not timed here: no dataset is read.) Unless ``--no-projection``, the
saving is also projected to the real config from FLOPs: the full-size model built on the meta
device (no memory, no compute) and its training step counted with FlopCounterMode, with and without
the encode.

Memory: the peak a training step adds on top of the resident state (weights, optimizer state,
prompt cache): the allocator's peak on an accelerator; on CPU, where torch keeps no allocator
statistics and peak RSS is dominated by the mapped torch libraries, the high-water mark of the
profiler's alloc/free events (``_common.step_peak_mib``). Resident memory differs too: the
reference keeps the text encoder loaded, ours frees it once the prompt cache is built (shown).

``--full-size`` builds the real architecture with random weights (Cosmos-Predict2.5-2B transformer,
Wan2.1 VAE, a Qwen2.5-VL-7B-sized text model; ``bench/latency.py``'s builder) from the real RoboTwin
config, backbone in bf16 and the action head in fp32, and also prints MFU against ``--peak-tflops``.

``--options`` instead times the options that make a joint step cheaper (one backbone pass, the
video loss every k-th step, on fewer future frames, on part of the batch) against a no-video step
and today's joint step (``bench/_joint_options.py``); its last line is ``speedup: X.XX`` of the
one-pass step against today's joint step.

The last line is exactly ``speedup: X.XX`` (reference median step time / ours). With
``--original-root`` / ``--original-python`` (as ``bench/parity_dit4dit.py``) the original DiT4DiT's own
step runs in its virtualenv too (``bench/_original.py``), interleaved step by step, and the ratio is
against it (ours and the latent-cache step both shown); the line before the last names the reference.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _common import (
    bench_spec,
    build_full_size,
    count_flops,
    param_mib,
    part_flops,
    placeholder,
    step_peak_mib,
    timed,
    with_cached_latents,
)
from _original import Original, add_original_args, original_spec
from reference import ReferenceDiT4DiT

from dit4dit_npu import device as dev
from dit4dit_npu.batch import Batch
from dit4dit_npu.config import load_config
from dit4dit_npu.console import run
from dit4dit_npu.models.prompt_cache import PromptCache
from dit4dit_npu.models.vae import vae_latents
from dit4dit_npu.train.memory_plan import ROBOTWIN_DIMS
from dit4dit_npu.transforms import PolicyIO
from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder
from dit4dit_npu.weights.compile import compile_backbone
from dit4dit_npu.weights.testing import make_batch

# quiet the profiler's per-session log lines (set before torch loads kineto)
os.environ.setdefault("KINETO_LOG_LEVEL", "5")

HERE = Path(__file__).resolve().parent
REAL_CONFIG = HERE.parent / "configs/robotwin/dit4dit_robotwin.yaml"
PATHS = ("ours", "cached", "reference")


def setup(args: argparse.Namespace):
    torch.set_num_threads(args.threads)
    dev.seed_everything(0)
    cfg = load_config(args.config, args.overrides)
    if cfg.framework.cosmos25.training != "joint":
        raise SystemExit(
            "bench/train_step.py compares joint training steps: set framework.cosmos25.training=joint"
        )
    device = dev.get_device()
    spec = bench_spec(cfg)
    if args.full_size:
        model, encoder = build_full_size(cfg, spec, device, torch.bfloat16, args.full_size_layers)
    else:
        model = build_dit4dit(cfg, spec).to(device)
        encoder = build_prompt_encoder(cfg).to(device)
    batch = make_batch(spec, batch_size=args.batch_size)
    cache = PromptCache()
    t0 = time.perf_counter()
    cache.build(batch.instruction, encoder)
    print(f"prompt cache: {len(cache)} instruction(s) encoded once, {time.perf_counter() - t0:.3f} s")
    model.set_prompt_cache(cache)
    if args.compile:  # trainer.compile's per-block compile; the rebuild shares these blocks, so it is compiled too
        compile_backbone(model, "--compile")
        print("--compile: the backbone's blocks compiled per block (trainer.compile); the warm-up step is not timed")
    params = [p for p in model.parameters() if p.requires_grad]
    # Fused AdamW wherever torch has it (CPU too): the optimizer is the same for both paths, and
    # on an accelerator it is a few % of a step; the unfused CPU loop would dilute the comparison.
    try:
        opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), fused=True)
    except RuntimeError:
        opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95))
    model.train()
    steps = {"ours": model, "cached": model, "reference": ReferenceDiT4DiT(model, encoder)}
    batches = {"ours": batch, "cached": with_cached_latents(model, batch), "reference": batch}
    return cfg, model, encoder, batches, opt, cache, steps


def train_step(step: Callable[[Batch], dict], batch: Batch, opt: torch.optim.Optimizer, video_weight: float) -> None:
    out = step(batch)
    opt.zero_grad(set_to_none=True)
    (out["action_loss"] + video_weight * out["video_loss"]).backward()
    opt.step()


def full_size_projection() -> None:
    """The latent cache's saving at the real config, from FLOPs: the full-size model on the meta
    device, one sample's training step (forward + backward, gradient checkpointing as configured)
    counted with and without the VAE encode."""
    cfg = load_config(REAL_CONFIG)
    spec = bench_spec(cfg)
    meta = torch.device("meta")
    model, _ = build_full_size(cfg, spec, meta, torch.bfloat16)
    batch = make_batch(spec, batch_size=1)
    cache = PromptCache()
    for text in batch.instruction:  # a real prompt embedding's shape (512 x 28 * 3584), on meta
        cache.add(text, torch.zeros(cfg.framework.cosmos25.max_sequence_length, 28 * 3584, dtype=torch.bfloat16))
    model.set_prompt_cache(cache.to(meta))
    model.train()
    video = model.video_input(batch.frames.to(meta))
    cached = dataclasses.replace(batch, frames=None, latents=vae_latents(model.backbone.vae, video))

    def step(b: Batch) -> None:
        out = model(b)
        (out["action_loss"] + out["video_loss"]).backward()

    vae, online, with_cache = (count_flops(f) for f in (lambda: vae_latents(model.backbone.vae, video),
                                                         lambda: step(batch), lambda: step(cached)))
    gc = "on" if cfg.trainer.enable_gradient_checkpointing else "off"
    h, w = spec.frame_size
    print(
        f"full-size projection (real config on the meta device: {spec.num_frames} frames of {h}x{w}, "
        f"gradient checkpointing {gc}; per sample): VAE encode {vae / 1e12:.2f} TFLOP of a {online / 1e12:.2f} "
        f"TFLOP training step = {100 * vae / online:.1f}%; from the cache {with_cache / 1e12:.2f} TFLOP, "
        f"{online / with_cache:.2f}x fewer FLOPs (the step-time saving where compute-bound)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help="default: bench/medium.yaml (the real config with --full-size)")
    p.add_argument("--full-size", action="store_true", help="random-init real-size model in bf16 (accelerator)")
    p.add_argument("--full-size-layers", type=int, default=28, help=argparse.SUPPRESS)  # CPU smoke tests only
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak bf16 TFLOP/s, for MFU")
    p.add_argument("--steps", type=int, default=5, help="timed steps per path (after one warm-up each)")
    p.add_argument("--batch-size", type=int, default=4, help="per-device batch (the shipped runs used 4)")
    # 1 thread: on a shared 2-core box, 2 intra-op threads made steps 5-20x slower and erratic
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-projection", action="store_true", help="skip the meta-device full-size FLOP projection")
    p.add_argument("--compile", action="store_true", help="compile ours as trainer.compile does (its warm-up untimed)")
    p.add_argument("--options", action="store_true", help="time the cheaper joint-step options instead (bench/_joint_options.py)")
    p.add_argument("--cached", action="store_true", help="with --options: every arm from the latent cache (no VAE encode)")
    p.add_argument("--smoke", action="store_true", help="a seconds-long run at tiny sizes (overrides the size options): checks that the bench works; its numbers mean nothing")
    add_original_args(p)
    p.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = p.parse_args()
    if args.smoke:
        args.config, args.steps, args.batch_size, args.threads = str(HERE.parent / "configs/robotwin/dit4dit_robotwin_tiny.yaml"), 1, 2, 1
        args.no_projection = True  # the full-size FLOP count on the meta device alone takes ~15 s
    if args.config is None:
        args.config = str(REAL_CONFIG if args.full_size else HERE / "medium.yaml")
    if args.options:
        from _joint_options import run_options  # same directory

        torch.set_num_threads(args.threads)
        # the tiny config trains one-frame clips: the smoke gives the joint arms 9 frames (2 future latents)
        clip = ["datasets.vla_data.video_delta_indices=[0, 1, 2, 3, 4, 5, 6, 7, 8]",
                "datasets.vla_data.action_video_freq_ratio=1"] if args.smoke else []
        run_options(args.config, clip + args.overrides, args.batch_size, args.steps, args.cached)
        return
    cfg, model, encoder, batches, opt, cache, steps = setup(args)
    batch = batches["ours"]
    lam = cfg.trainer.loss_scale.future_video

    def run(path: str) -> None:
        train_step(steps[path], batches[path], opt, lam)

    f = part_flops(model, encoder, batch)
    tr = f["transformer_fwd"]
    layer = model.backbone.cfg.extract_layer
    print(f"device: {dev.describe()}  threads={args.threads}  batch={args.batch_size}")
    print(
        f"per-sample FLOPs: text encoder {f['text_encoder'] / 1e9:.3f} G, transformer forward {tr / 1e9:.3f} G "
        f"({f['tokens']} video tokens), VAE encode {f['vae_encode'] / 1e9:.3f} G"
    )
    print(
        f"proportions text : transformer : VAE = {f['text_encoder'] / tr:.2f} : 1 : {f['vae_encode'] / tr:.2f} "
        f"(real model 2.90 : 1 : 0.93); extract_layer {layer} of {model.backbone.num_layers} blocks "
        f"= {(layer + 1) / model.backbone.num_layers:.2f} of depth (real 18/28 = 0.64)"
    )

    original = None
    if args.original_root is not None and not args.full_size:  # its own step, in its venv (bench/_original.py)
        io = PolicyIO.from_config(cfg, placeholder(ROBOTWIN_DIMS), placeholder(ROBOTWIN_DIMS), warn=False)
        original = Original.start(args, original_spec(cfg, bench_spec(cfg), io, (240, 320), batch.instruction[0], args.threads))
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    times: dict[str, list[float]] = {path: [] for path in PATHS}
    theirs: list[float] = []
    for path in PATHS:  # warm-up (allocations, optimizer state)
        run(path)
    if original:
        original(cmd="train", batch=args.batch_size, staged=False)
    for _ in range(max(args.steps, 5) if original else args.steps):  # interleaved, step by step
        for path in PATHS:
            times[path].append(timed(lambda: run(path)))  # noqa: B023 (called at once)
        if original:
            theirs.append(original(cmd="train", batch=args.batch_size, staged=False)["plain"])
    med = {path: statistics.median(ts) for path, ts in times.items()}

    mem, flops = {}, {}
    for path in PATHS:
        mem[path], how = step_peak_mib(lambda: run(path))  # noqa: B023 (called at once)
        flops[path] = count_flops(lambda: run(path))  # noqa: B023
    resident = {
        "ours": param_mib(model) + cache.nbytes / 2**20,
        "reference": param_mib(model) + param_mib(encoder.language_model),
    }
    resident["cached"] = resident["ours"]
    print(
        f"{'path':<10} {'step median s':>14} {'min':>8} {'max':>8} {'samples/s':>10} {'step GFLOP':>11} "
        f"{'step peak MiB':>14} {'resident MiB':>13}"
    )
    for path in PATHS:
        print(
            f"{path:<10} {med[path]:>14.4f} {min(times[path]):>8.4f} {max(times[path]):>8.4f} "
            f"{args.batch_size / med[path]:>10.2f} {flops[path] / 1e9:>11.2f} {mem[path]:>14.1f} "
            f"{resident[path]:>13.1f}"
        )
    print(
        f"step peak = memory a step adds over the resident state ({how}); resident = model weights + "
        "prompt cache (ours) or + text encoder (reference); optimizer state is equal and excluded"
    )
    print(f"FLOP ratio reference/ours (device-independent): {flops['reference'] / flops['ours']:.2f}")
    print(
        f"latent cache: step {med['ours']:.4f} s -> {med['cached']:.4f} s, {args.batch_size / med['ours']:.2f} -> "
        f"{args.batch_size / med['cached']:.2f} samples/s ({med['ours'] / med['cached']:.2f}x; FLOPs "
        f"{flops['ours'] / 1e9:.2f} -> {flops['cached'] / 1e9:.2f} G, -{100 * (1 - flops['cached'] / flops['ours']):.1f}%)"
    )
    if not args.no_projection and not args.full_size:
        full_size_projection()
    if args.peak_tflops:
        for path in PATHS:
            mfu = flops[path] / med[path] / (args.peak_tflops * 1e12)
            print(f"MFU {path}: {100 * mfu:.1f}% of {args.peak_tflops:g} TFLOP/s ({flops[path] / med[path] / 1e12:.1f} TFLOP/s)")
    if original:
        original.close()
        t = statistics.median(theirs)
        print(f"the original DiT4DiT's own step (forward, backward, clip, AdamW as its trainer): median {t:.4f} s over "
              f"{len(theirs)} interleaved steps; ours {t / med['ours']:.2f}x, from the latent cache {t / med['cached']:.2f}x "
              f"(its step has no cache), bench/reference.py's rebuild {t / med['reference']:.2f}x; load average after: "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"reference: original DiT4DiT {original.commit} at {Path(args.config).stem} size, training step batch "
              f"{args.batch_size}, uncached (speedup = its median / ours)")
        print(f"speedup: {t / med['ours']:.2f}")
        return
    print("reference: bench/reference.py (a rebuild of the original's per-step work in our modules; give "
          "--original-root/--original-python for the original itself)")
    print(f"speedup: {med['reference'] / med['ours']:.2f}")


if __name__ == "__main__":
    raise SystemExit(run(main))  # user errors: one line, exit code 2 (dit4dit_npu.console)
