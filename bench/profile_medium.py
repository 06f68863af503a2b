"""Where the time goes in one training step and one predict_action call (issue 31, item 1), ours, per stage.

    python bench/profile_medium.py [--config bench/medium.yaml] [--rounds 5] [key=value overrides ...]
    python bench/profile_medium.py --smoke   # seconds: the tiny config, 1 round; its numbers mean nothing

Training (batch 2, uncached: frames in, as ``bench/train_step.py``'s "ours"): ``DiT4DiT.forward``'s
calls made one by one, in its order, each timed (device drained before and after):
prompt embeddings (the prompt-cache lookup, with the batch checks), VAE encode (one batched encode
of the clip), feature pass (early-exit, no grad), action head forward, video flow-matching forward,
then the two backwards apart (their graphs are disjoint: the feature pass runs without grad when
``backprop_action_to_backbone`` is off, as configured) and the AdamW step. Inference (batch 1, end
to end): a robot observation of native-size camera frames (``--native``, RoboTwin's 240x320), raw
state and instruction through PolicyIO (parse: crop + resize + tile + state encoding), the
prompt-cache lookup, the VAE encode of frame 0, the feature pass, the action head's sampling and
PolicyIO's unnormalize, the calls ``Policy`` makes, one by one.

Each stage also wraps ``torch.profiler.record_function`` (its name shows in a profiler trace) and
its FLOPs are counted once with FlopCounterMode (matmul/conv/SDPA, backward included): the FLOP
share of a stage is the same-maths share it would have if every stage ran at one time per FLOP.
The unstaged call (``model(batch)`` + backward + step; ``encode_observation`` + ``predict_action``
+ ``decode_actions``) is timed in the same rounds, so the staging's own cost shows.

Medians of ``--rounds`` rounds (after one warm-up), one thread, the load average printed before and
after. The original DiT4DiT's per-stage profile is not measured here yet (``bench/parity_dit4dit.py``
drives the original in its side virtualenv): the line before last says so and the last line is
``speedup: 1.00`` (the house format; no ratio is claimed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from _common import bench_spec
from torch.profiler import record_function
from torch.utils.flop_counter import FlopCounterMode

from dit4dit_npu import device as dev
from dit4dit_npu.config import load_config
from dit4dit_npu.models.prompt_cache import PromptCache
from dit4dit_npu.train.memory_plan import ROBOTWIN_DIMS
from dit4dit_npu.transforms import FeatureStats, PolicyIO
from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder
from dit4dit_npu.weights.testing import make_batch

os.environ.setdefault("KINETO_LOG_LEVEL", "5")

HERE = Path(__file__).resolve().parent
TRAIN_STAGES = ("prompt embeddings", "VAE encode", "feature pass", "action head fwd", "video flow-matching fwd",
                "action head bwd", "video flow-matching bwd", "optimizer step")
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


class Flops:
    """Stage -> FLOPs (FlopCounterMode around each stage)."""

    def __init__(self) -> None:
        self.t: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        with FlopCounterMode(display=False) as fc:
            yield
        self.t[name] = self.t.get(name, 0.0) + fc.get_total_flops()


def staged_train_step(model, batch, opt, lam: float, stage: Callable) -> None:
    """``train_step.train_step`` with ``DiT4DiT.forward``'s calls one by one (same calls, same order)."""
    bb = model.backbone
    opt.zero_grad(set_to_none=True)
    with stage("prompt embeddings"):
        b = model._checked(batch, training=True)
        prompts = model.prompt_embeddings(b.instruction)
    with stage("VAE encode"):
        latents, cond = model.clip_latents(b)
    with dev.autocast(enabled=model.autocast):
        with stage("feature pass"):
            feats = bb.features(cond, prompts, model.feature_latent_frames, grad=False)
        with stage("action head fwd"):
            action_loss = model.action_model.loss(feats, b.state, b.action, b.action_mask)
        with stage("video flow-matching fwd"):
            video_loss = bb.video_flow_matching_loss(latents, prompts, cond)
    with stage("action head bwd"):
        action_loss.backward()
    with stage("video flow-matching bwd"):
        (lam * video_loss).backward()
    with stage("optimizer step"):
        opt.step()


def plain_train_step(model, batch, opt, lam: float) -> None:
    out = model(batch)
    opt.zero_grad(set_to_none=True)
    (out["action_loss"] + lam * out["video_loss"]).backward()
    opt.step()


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


def table(title: str, stages: tuple[str, ...], times: dict[str, list[float]], flops: dict[str, float],
          plain: list[float]) -> None:
    med = {s: statistics.median(times[s]) for s in stages}
    total, ftotal = sum(med.values()), sum(flops.values()) or 1.0
    print(f"\n{title}")
    print("| stage | ms (median) | time share | GFLOP | FLOP share | GFLOP/s |")
    print("|---|---|---|---|---|---|")
    for s in stages:
        f = flops.get(s, 0.0)
        rate = f"{f / med[s] / 1e9:.1f}" if f else "-"
        print(f"| {s} | {1e3 * med[s]:.1f} | {100 * med[s] / total:.1f}% | {f / 1e9:.3f} | {100 * f / ftotal:.1f}% | {rate} |")
    print(f"| **sum of stages** | {1e3 * total:.1f} | 100% | {ftotal / 1e9:.3f} | 100% | {ftotal / total / 1e9:.1f} |")
    print(f"| unstaged call | {1e3 * statistics.median(plain):.1f} | | | | |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(HERE / "medium.yaml"))
    p.add_argument("--rounds", type=int, default=5, help="timed rounds (after one warm-up); medians shown")
    p.add_argument("--batch-size", type=int, default=2, help="training batch (inference is batch 1)")
    p.add_argument("--native", type=int, nargs=2, default=(240, 320), metavar=("H", "W"),
                   help="camera frame size the robot sends (RoboTwin's 240x320)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="a seconds-long run at tiny sizes: checks that the bench works; its numbers mean nothing")
    p.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = p.parse_args()
    if args.smoke:
        args.config, args.rounds, args.native = str(HERE.parent / "configs/robotwin/dit4dit_robotwin_tiny.yaml"), 1, (60, 80)
    torch.set_num_threads(args.threads)
    dev.seed_everything(0)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    cfg = load_config(args.config, args.overrides)
    if cfg.framework.cosmos25.training != "joint" or cfg.framework.cosmos25.backprop_action_to_backbone:
        raise SystemExit("bench/profile_medium.py profiles joint training with the no-grad feature pass "
                         "(training=joint, backprop_action_to_backbone=false)")
    device = dev.get_device()
    spec = bench_spec(cfg)
    model = build_dit4dit(cfg, spec).to(device)
    encoder = build_prompt_encoder(cfg).to(device)
    io = PolicyIO.from_config(cfg, placeholder(ROBOTWIN_DIMS), placeholder(ROBOTWIN_DIMS), warn=False)
    batch = make_batch(spec, batch_size=args.batch_size)
    obs = observation(io, tuple(args.native), batch.instruction[0], 0)
    cache = PromptCache()
    cache.build(sorted(set(batch.instruction)), encoder)
    model.set_prompt_cache(cache)
    del encoder  # ours frees the text encoder once the prompt cache is built
    params = [q for q in model.parameters() if q.requires_grad]
    try:
        opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), fused=True)
    except RuntimeError:
        opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95))
    lam = cfg.trainer.loss_scale.future_video
    print(f"config: {args.config}  device: {dev.describe()}  threads={args.threads}  training batch={args.batch_size} "
          f"(uncached, frames {spec.num_frames}x{spec.frame_size[0]}x{spec.frame_size[1]})  inference batch=1 from "
          f"{len(io.camera_keys)} cameras of {args.native[0]}x{args.native[1]}")

    model.train()
    tflops, iflops = Flops(), Flops()
    staged_train_step(model, batch, opt, lam, tflops)  # also the warm-up (optimizer state)
    staged_predict(model, io, obs, 0, iflops)
    model.train()
    plain_train_step(model, batch, opt, lam)
    plain_predict(model, io, obs, 0)
    ttimes = {s: [] for s in TRAIN_STAGES}
    itimes = {s: [] for s in INFER_STAGES}
    tplain, iplain = [], []
    for r in range(args.rounds):  # interleaved: staged and unstaged, training and inference, per round
        model.train()
        t = Timer()
        staged_train_step(model, batch, opt, lam, t)
        for s in TRAIN_STAGES:
            ttimes[s].append(t.t[s])
        t0 = time.perf_counter()
        plain_train_step(model, batch, opt, lam)
        tplain.append(time.perf_counter() - t0)
        t = Timer()
        staged_predict(model, io, obs, r, t)
        for s in INFER_STAGES:
            itimes[s].append(t.t[s])
        t0 = time.perf_counter()
        plain_predict(model, io, obs, r)
        iplain.append(time.perf_counter() - t0)
    model.train()

    table(f"training step (batch {args.batch_size}, uncached), medians of {args.rounds} rounds:",
          TRAIN_STAGES, ttimes, tflops.t, tplain)
    table(f"predict_action end to end (batch 1, {args.native[0]}x{args.native[1]} frames, PolicyIO included), "
          f"medians of {args.rounds} rounds:", INFER_STAGES, itimes, iflops.t, iplain)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ft, fi = sum(tflops.t.values()) or 1.0, sum(iflops.t.values()) or 1.0
    print("FLOP share, training: " + ", ".join(f"{s} {100 * tflops.t.get(s, 0) / ft:.1f}%" for s in TRAIN_STAGES))
    print("FLOP share, inference: " + ", ".join(f"{s} {100 * iflops.t.get(s, 0) / fi:.1f}%" for s in INFER_STAGES))
    print("reference: none (ours only; the original's per-stage profile is not measured yet)")
    print("speedup: 1.00")


if __name__ == "__main__":
    main()
