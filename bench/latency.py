"""``predict_action`` latency per stage: our inference path vs the reference-faithful one.

    python bench/latency.py [--iters 20] [--batch-size 1] [--threads 2] [--full-size]
    python bench/latency.py --smoke     # seconds: the tiny config in place of the medium one, 2 calls

The model's part of inference, on a ``Batch`` (tiled uint8 frame, encoded state; PolicyIO's
pre/post-processing is not timed here). Stages (device synchronised between them): text (prompt-
cache lookup; the reference runs the text encoder on every call, B1 in bench/reference.py), VAE encode of the
conditioning frame (the reference encodes it zero-padded to the clip length, per sample, B4),
feature pass (ours stops after ``extract_layer``; the reference runs every block and the output
head with autograd on, B2/B3), action sampling (the Euler steps of the head).

Runs, in one process:
1. the tiny config (``configs/robotwin/dit4dit_robotwin_tiny.yaml``): our path only;
2. the medium config (``bench/medium.yaml``, real proportions at CPU scale): ours vs reference
   (``bench/reference.py``, the same modules and weights), alternating call by call so machine
   noise hits both alike;
3. for our path, the action-sampling stage with real-time-chunking guidance against plain (RTC's
   extra cost: one vector-Jacobian product through the head per Euler step);
4. with ``--full-size`` (meant for a lent accelerator): the real architecture with random weights
   (Cosmos-Predict2.5-2B transformer, Wan2.1 VAE, a 28 x 3584 Qwen2.5-VL text model), backbone in
   bf16, 3 views of 224 x 224 tiled; reports Hz.

Before timing, each staged call is checked against its whole call (``DiT4DiT.predict_action`` /
``ReferenceDiT4DiT.predict_action``: same output), so the stages cannot drift from the real
paths. The last line is ``speedup: X.XX`` = reference p50 / ours p50 of the total on the medium
config (or on the full-size model when it ran; with ``--smoke``, a seconds-long check of this
script, on the tiny config, 3 calls each, whose ratio means little).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import bench_spec, build_full_size, observation, placeholder, plain_predict
from _original import Original, add_original_args, original_spec
from reference import ReferenceDiT4DiT

from dit4dit_npu import device as dev
from dit4dit_npu.batch import Batch, BatchSpec
from dit4dit_npu.config import Config, load_config
from dit4dit_npu.console import run
from dit4dit_npu.models import DiT4DiT
from dit4dit_npu.models.prompt_cache import PromptCache
from dit4dit_npu.models.rtc import PrefixGuidance, prefix_weights
from dit4dit_npu.train.memory_plan import ROBOTWIN_DIMS
from dit4dit_npu.transforms import PolicyIO
from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder
from dit4dit_npu.weights.compile import compile_backbone
from dit4dit_npu.weights.testing import make_batch

REPO = Path(__file__).resolve().parents[1]
STAGES = ("text", "vae_encode", "feature_pass", "action_sampling")


class Laps:
    def __init__(self) -> None:
        dev.synchronize()
        self.t = time.perf_counter()
        self.times: dict[str, float] = {}

    def lap(self, name: str) -> None:
        dev.synchronize()
        now = time.perf_counter()
        self.times[name] = now - self.t
        self.t = now


class Ours:
    """``DiT4DiT.predict_action`` as stages (the same calls, in the same order)."""

    def __init__(self, model: DiT4DiT) -> None:
        self.model = model

    def prompt_embeddings(self, instructions: list[str]) -> torch.Tensor:
        return self.model.prompt_embeddings(instructions)

    def condition(self, video: torch.Tensor) -> torch.Tensor:
        return self.model.backbone.encode_clip(video[:, :, :1])[1]

    def features(self, cond: torch.Tensor, prompts: torch.Tensor, call_seed: int) -> torch.Tensor:
        m = self.model
        with dev.autocast(enabled=m.autocast):
            return m.backbone.features(cond, prompts, m.feature_latent_frames, call_seed=call_seed)

    def predict_action(self, batch: Batch, seed: int) -> torch.Tensor:
        return self.model.predict_action(batch, seed=seed)


class Reference:
    """``ReferenceDiT4DiT.predict_action`` as the same stages."""

    def __init__(self, model: DiT4DiT, encoder: Any) -> None:
        self.model = model
        self.ref = ReferenceDiT4DiT(model, encoder)

    def prompt_embeddings(self, instructions: list[str]) -> torch.Tensor:
        return self.ref.prompt_embeddings(instructions)

    def condition(self, video: torch.Tensor) -> torch.Tensor:
        return self.ref.condition(video)

    def features(self, cond: torch.Tensor, prompts: torch.Tensor, call_seed: int) -> torch.Tensor:
        return self.ref.features(cond, prompts, call_seed)[0]

    def predict_action(self, batch: Batch, seed: int) -> torch.Tensor:
        return self.ref.predict_action(batch, seed=seed)


@torch.no_grad()  # as predict_action: the reference's enable_grad inside then builds its graph
def staged_predict(path: Ours | Reference, batch: Batch, seed: int) -> tuple[torch.Tensor, dict[str, float]]:
    m: DiT4DiT = path.model
    batch.validate(m.spec, training=False)
    batch = batch.to(m.device)
    m.eval()
    laps = Laps()
    prompts = path.prompt_embeddings(batch.instruction)
    laps.lap("text")
    cond = path.condition(m.video_input(batch.frames[:, :1]))
    laps.lap("vae_encode")
    feats = path.features(cond, prompts, seed)
    laps.lap("feature_pass")
    actions = m.action_model.sample(feats, batch.state, torch.Generator().manual_seed(seed))
    laps.lap("action_sampling")
    return actions, laps.times


def measure(
    paths: dict[str, Ours | Reference], batch: Batch, iters: int
) -> dict[str, dict[str, list[float]]]:
    times = {p: {s: [] for s in (*STAGES, "total")} for p in paths}
    for name, path in paths.items():
        torch.manual_seed(0)  # the reference conditioning encode samples the VAE posterior
        want = path.predict_action(batch, seed=0)
        torch.manual_seed(0)
        got, _ = staged_predict(path, batch, 0)  # also the warm-up
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=f"staged {name} path drifted")
    for i in range(iters):
        for name, path in paths.items():
            _, t = staged_predict(path, batch, i)
            for s in STAGES:
                times[name][s].append(t[s])
            times[name]["total"].append(sum(t.values()))
    return times


@torch.no_grad()  # as predict_action; the guided steps turn autograd on for the head alone
def rtc_cost(model: DiT4DiT, batch: Batch, iters: int) -> None:
    """The action-sampling stage plain vs with real-time-chunking guidance (a vector-Jacobian
    product through the head per Euler step), on the same features, alternating call by call. The
    prefix: a chunk of the model itself, half the chunk long, the first quarter frozen."""
    m = model
    b = batch.to(m.device)
    cond, prompts = m._observation(b, seed=0)
    with dev.autocast(enabled=m.autocast):
        feats = m.backbone.features(cond, prompts, m.feature_latent_frames, call_seed=0)
    head = m.action_model
    h = head.chunk_length
    prev = head.sample(feats, b.state, torch.Generator().manual_seed(1))
    weights = prefix_weights(h, max(1, h // 4), h // 2)[None, :, None].expand_as(prev).contiguous()
    guidance = PrefixGuidance(prev, weights)
    runs: dict[str, list[float]] = {"plain": [], "rtc": []}
    for i in range(iters + 1):
        for name, g in (("plain", None), ("rtc", guidance)):
            dev.synchronize()
            t0 = time.perf_counter()
            head.sample(feats, b.state, torch.Generator().manual_seed(i), guidance=g)
            dev.synchronize()
            if i:  # the first round warms up
                runs[name].append(time.perf_counter() - t0)
    plain, rtc = statistics.median(runs["plain"]), statistics.median(runs["rtc"])
    print(f"action_sampling with RTC guidance: {rtc * 1e3:.2f} ms vs {plain * 1e3:.2f} ms plain "
          f"({rtc / plain:.2f}x, +{(rtc - plain) * 1e3:.2f} ms per call, {head.cfg.num_inference_timesteps} VJPs)")


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1e3, q))


def report(title: str, times: dict[str, dict[str, list[float]]], batch_size: int) -> None:
    print(f"\n== {title} (batch {batch_size}; ms, p50 / p95) ==")
    paths = list(times)
    print(f"{'stage':<16}" + "".join(f"{p:>22}" for p in paths))
    for s in (*STAGES, "total"):
        print(f"{s:<16}" + "".join(f"{pct(times[p][s], 50):>11.2f} /{pct(times[p][s], 95):>9.2f}" for p in paths))
    for p in paths:
        p50 = statistics.median(times[p]["total"])
        print(f"{p}: {1.0 / p50:.1f} Hz ({batch_size / p50:.1f} observations/s)")


# --------------------------------------------------------------------------------------------
# Full-size random model (real architecture, no weights)
# --------------------------------------------------------------------------------------------


def run_config(
    title: str, args: argparse.Namespace, spec: BatchSpec, paths: list[str],
    build: Callable[[], tuple[DiT4DiT, Any]],
) -> dict[str, dict[str, list[float]]]:
    t0 = time.perf_counter()
    model, encoder = build()
    batch = make_batch(spec, batch_size=args.batch_size, training=False)
    cache = PromptCache()
    cache.build(batch.instruction, encoder)
    model.set_prompt_cache(cache)
    print(f"\n{title}: built in {time.perf_counter() - t0:.1f} s, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters (+ text encoder), "
          f"frame {spec.frame_size[0]}x{spec.frame_size[1]}")
    available = {"ours": lambda: Ours(model), "reference": lambda: Reference(model, encoder)}
    times = measure({p: available[p]() for p in paths}, batch, args.iters)
    report(title, times, args.batch_size)
    if "ours" in paths:
        rtc_cost(model, batch, args.iters)
    return times


def end_to_end_vs_original(cfg: Config, args: argparse.Namespace) -> float:
    """predict_action end to end (batch 1): ours = PolicyIO parse + ``DiT4DiT.predict_action`` +
    unnormalize, the original = its client side + its ``predict_action`` (bench/_profile_original.py),
    on native-size frames, alternating call by call; returns the original's median over ours."""
    spec = bench_spec(cfg)
    model, encoder = build_dit4dit(cfg, spec).to(dev.get_device()), build_prompt_encoder(cfg)
    io = PolicyIO.from_config(cfg, placeholder(ROBOTWIN_DIMS), placeholder(ROBOTWIN_DIMS), warn=False)
    instruction = make_batch(spec, batch_size=1, training=False).instruction[0]
    obs = observation(io, tuple(args.native), instruction, 0)
    cache = PromptCache()
    cache.build([instruction], encoder)
    model.set_prompt_cache(cache)
    model.train(False)
    if args.compile:  # as from_pretrained(compile=True) / --compile; its warm-up is not timed
        compile_backbone(model, "--compile")
    original = Original.start(args, original_spec(cfg, spec, io, args.native, instruction, args.threads))
    print(f"\nend to end vs the original ({args.native[0]}x{args.native[1]} uint8 x {len(io.camera_keys)} cameras, "
          f"raw state and instruction in, robot-unit actions out); load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    plain_predict(model, io, obs, 0)  # warm-ups
    original(cmd="predict", staged=False)
    ours, theirs = [], []
    for r in range(max(args.iters, 5)):  # interleaved: ours, the original, ours, ...
        t0 = time.perf_counter()
        plain_predict(model, io, obs, r)
        ours.append(time.perf_counter() - t0)
        theirs.append(original(cmd="predict", staged=False)["plain"])
    original.close()
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"ours (PolicyIO included) p50 {1e3 * o:.2f} ms, the original (its client side included) p50 {1e3 * t:.2f} ms "
          f"over {len(ours)} interleaved calls each: {t / o:.2f}x; load average after: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"reference: original DiT4DiT {original.commit} at {Path(args.medium).stem} size, predict_action end to end "
          f"(batch 1, median of {len(ours)} interleaved calls{'; ours with --compile' if args.compile else ''})")
    return t / o


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=20, help="timed calls per path (after a warm-up)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--medium", default=str(REPO / "bench" / "medium.yaml"))
    p.add_argument("--full-size", action="store_true", help="also the real-size random model (accelerator)")
    p.add_argument("--full-size-paths", default="ours,reference", help="paths for --full-size")
    p.add_argument("--full-size-layers", type=int, default=28, help=argparse.SUPPRESS)  # smoke tests only
    p.add_argument("--skip-small", action="store_true", help="skip the tiny config and the medium one against bench/reference.py "
                   "(the end-to-end comparison with the original still runs when given --original-root)")
    p.add_argument("--native", type=int, nargs=2, default=(240, 320), metavar=("H", "W"),
                   help="with the original: camera frame size the robot sends (RoboTwin's 240x320)")
    add_original_args(p)
    p.add_argument("--compile", action="store_true",
                   help="the end-to-end comparison with ours compiled as --compile does (its warm-up untimed)")
    p.add_argument("--smoke", action="store_true", help="a seconds-long run at tiny sizes (overrides the size options): checks that the bench works; its numbers mean nothing")
    args = p.parse_args()
    if args.smoke:
        args.iters, args.threads, args.medium = 2, 1, str(REPO / "configs" / "robotwin" / "dit4dit_robotwin_tiny.yaml")
        args.native = (60, 80)
    torch.set_num_threads(args.threads)
    dev.seed_everything(0)
    device = dev.get_device()
    print(f"device: {dev.describe()}  threads={args.threads}")

    def builder(cfg: Config, spec: BatchSpec) -> Callable[[], tuple[DiT4DiT, Any]]:
        return lambda: (build_dit4dit(cfg, spec).to(device), build_prompt_encoder(cfg).to(device))

    times: dict[str, dict[str, list[float]]] = {}
    if not args.skip_small:
        tiny = load_config(REPO / "configs" / "robotwin" / "dit4dit_robotwin_tiny.yaml")
        tiny_paths = ["ours", "reference"] if args.smoke else ["ours"]
        times = run_config("tiny", args, bench_spec(tiny), tiny_paths, builder(tiny, bench_spec(tiny)))
    if not args.skip_small and not args.smoke:
        medium = load_config(args.medium)
        times = run_config("medium", args, bench_spec(medium), ["ours", "reference"],
                           builder(medium, bench_spec(medium)))
    if args.full_size:
        full = load_config(REPO / "configs" / "robotwin" / "dit4dit_robotwin.yaml")
        spec = bench_spec(full)
        dtype = torch.float32 if dev.device_type() == dev.CPU and not full.trainer.autocast else torch.bfloat16
        paths = [s for s in args.full_size_paths.split(",") if s]
        full_times = run_config("full-size (random weights)", args, spec, paths,
                                lambda: build_full_size(full, spec, device, dtype, args.full_size_layers))
        if "reference" in full_times and "ours" in full_times:
            times = full_times
    # asked for by --original-root (or DIT4DIT_ORIGINAL_ROOT): --skip-small alone does not skip it, but
    # --full-size --skip-small (bench/full_size.sh) keeps its full-size line last, as before
    if args.original_root is not None and not (args.full_size and args.skip_small):
        ratio = end_to_end_vs_original(load_config(args.medium), args)
        print(f"speedup: {ratio:.2f}")
    elif "reference" in times:
        ours, ref = statistics.median(times["ours"]["total"]), statistics.median(times["reference"]["total"])
        print("reference: bench/reference.py (a rebuild of the original's per-call work in our modules; the model's "
              "part only, PolicyIO not timed; give --original-root/--original-python for the original itself)")
        print(f"speedup: {ref / ours:.2f}")


if __name__ == "__main__":
    raise SystemExit(run(main))  # user errors: one line, exit code 2 (dit4dit_npu.console)
