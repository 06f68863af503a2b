"""Where the time goes in one training step and one predict_action call, ours, per stage.

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
after. With ``--original-root`` / ``--original-python`` (as ``bench/parity_dit4dit.py``) the original
DiT4DiT runs the same rounds in its own virtualenv, built in its own classes at the config's sizes
(``bench/_profile_original.py``, a long-lived worker told to run one round at a time, so the two
sides interleave: ours, original, ours, ...), and each table shows both sides per stage, the
per-stage ratio and the same-maths ceiling: the original's step if each of its stages ran at its
own time per FLOP but with our FLOPs (stages we skip count 0, stages without FLOPs keep its time).
The last line is then the original's unstaged training step at batch 2 over ours (``speedup: X``);
without the original it is ``speedup: 1.00`` (ours only; no ratio is claimed), said on the line before.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from _common import (
    INFER_STAGES,
    Timer,
    bench_spec,
    observation,
    placeholder,
    plain_predict,
    staged_predict,
    with_cached_latents,
)
from _original import Original, add_original_args, original_spec
from torch.utils.flop_counter import FlopCounterMode

from dit4dit_npu import device as dev
from dit4dit_npu.config import load_config
from dit4dit_npu.models.prompt_cache import PromptCache
from dit4dit_npu.train.memory_plan import ROBOTWIN_DIMS
from dit4dit_npu.transforms import PolicyIO
from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder
from dit4dit_npu.weights.testing import make_batch

os.environ.setdefault("KINETO_LOG_LEVEL", "5")

HERE = Path(__file__).resolve().parent
TRAIN_STAGES = ("prompt embeddings", "VAE encode", "feature pass", "action head fwd", "video flow-matching fwd",
                "action head bwd", "video flow-matching bwd", "optimizer step")


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


# Its stage -> ours where the names differ for the same work (its client side vs our PolicyIO).
SAME_WORK = {"client transforms": "PolicyIO parse"}


def side_by_side(title: str, ours: tuple[dict, dict, list], theirs: tuple[dict, dict, list]) -> float:
    """Per stage: ms ours / original, GFLOP ours / original, the ratio, and the same-maths ceiling
    (its time per FLOP times our FLOPs; a stage we skip 0; a stage without FLOPs keeps its time).
    Returns its unstaged call over ours."""
    (ot, of, op), (tt, tf, tp) = ours, theirs
    om = {s: statistics.median(v) for s, v in ot.items()}
    tm = {s: statistics.median(v) for s, v in tt.items()}
    print(f"\n{title}")
    print("| stage | ms ours | ms original | ratio | GFLOP ours | GFLOP original | ceiling ms |")
    print("|---|---|---|---|---|---|---|")
    ceiling = 0.0
    for s in list(tm) + [s for s in om if s not in tm and s not in SAME_WORK.values()]:
        o = SAME_WORK.get(s, s)
        o_ms, o_f = (1e3 * om[o], of.get(o, 0.0)) if o in om else (None, 0.0)
        t_ms, t_f = (1e3 * tm[s], tf.get(s, 0.0)) if s in tm else (None, 0.0)
        c = None
        if t_ms is not None:
            c = 0.0 if o_ms is None else (t_ms if not t_f else t_ms * o_f / t_f)
            ceiling += c
        name = s if o == s else f"{s} / {o}"
        print(f"| {name} | {'-' if o_ms is None else f'{o_ms:.1f}'} | {'-' if t_ms is None else f'{t_ms:.1f}'} | "
              f"{f'{t_ms / o_ms:.2f}' if o_ms and t_ms else '-'} | {o_f / 1e9:.3f} | {t_f / 1e9:.3f} | "
              f"{'-' if c is None else f'{c:.1f}'} |")
    osum, tsum = 1e3 * sum(om.values()), 1e3 * sum(tm.values())
    print(f"| **sum of stages** | {osum:.1f} | {tsum:.1f} | {tsum / osum:.2f} | {sum(of.values()) / 1e9:.3f} | "
          f"{sum(tf.values()) / 1e9:.3f} | {ceiling:.1f} |")
    ou, tu = 1e3 * statistics.median(op), 1e3 * statistics.median(tp)
    print(f"| unstaged call | {ou:.1f} | {tu:.1f} | {tu / ou:.2f} | | | |")
    print(f"same-maths ceiling: {ceiling:.1f} ms = original's staged sum / {tsum / ceiling:.2f}; "
          f"ours (unstaged) {tu / ou:.2f}x the original")
    return tu / ou


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(HERE / "medium.yaml"))
    p.add_argument("--rounds", type=int, default=5, help="timed rounds (after one warm-up); medians shown")
    p.add_argument("--batch-size", type=int, nargs="+", default=[2, 4], help="training batches (inference is batch 1)")
    p.add_argument("--native", type=int, nargs=2, default=(240, 320), metavar=("H", "W"),
                   help="camera frame size the robot sends (RoboTwin's 240x320)")
    p.add_argument("--threads", type=int, default=1)
    add_original_args(p)
    p.add_argument("--smoke", action="store_true", help="a seconds-long run at tiny sizes: checks that the bench works; its numbers mean nothing")
    p.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = p.parse_args()
    if args.smoke:
        args.config, args.rounds, args.native = str(HERE.parent / "configs/robotwin/dit4dit_robotwin_tiny.yaml"), 1, (60, 80)
        # its one-frame clips (the embedded default's recipe) have no video loss to profile
        args.overrides = ["datasets.vla_data.video_delta_indices=[0, 1, 2, 3, 4, 5, 6, 7, 8]",
                          "datasets.vla_data.action_video_freq_ratio=2",
                          "framework.cosmos25.backprop_action_to_backbone=false", *args.overrides]
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
    batches = {b: make_batch(spec, batch_size=b) for b in args.batch_size}
    instruction = batches[args.batch_size[0]].instruction[0]
    obs = observation(io, tuple(args.native), instruction, 0)
    cache = PromptCache()
    cache.build(sorted({i for b in batches.values() for i in b.instruction}), encoder)
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
    original = None
    if args.original_root is not None:
        original = Original.start(args, original_spec(cfg, spec, io, args.native, instruction, args.threads))

    # FLOPs once per side, which are also the warm-ups
    tflops = {}
    for b, batch in batches.items():
        model.train()
        tflops[b] = Flops()
        staged_train_step(model, batch, opt, lam, tflops[b])  # also the warm-up (optimizer state)
        plain_train_step(model, batch, opt, lam)
    iflops = Flops()
    staged_predict(model, io, obs, 0, iflops)
    plain_predict(model, io, obs, 0)
    cached = {b: with_cached_latents(model, batch) for b, batch in batches.items()}  # as a latent cache delivers it
    for b in batches:
        plain_train_step(model, cached[b], opt, lam)
    theirs_t = {b: original(cmd="train", batch=b, flops=True) for b in batches} if original else {}
    theirs_i = original(cmd="predict", flops=True) if original else {}
    ttimes = {b: {s: [] for s in TRAIN_STAGES} for b in batches}
    tplain, tcached = {b: [] for b in batches}, {b: [] for b in batches}
    itimes, iplain = {s: [] for s in INFER_STAGES}, []
    otimes = {k: {} for k in [*batches, "predict"]}
    oplain = {k: [] for k in [*batches, "predict"]}

    def theirs(key, reply) -> None:
        for s, v in reply["times"].items():
            otimes[key].setdefault(s, []).append(v)
        oplain[key].append(reply["plain"])

    for r in range(args.rounds):  # interleaved: staged and unstaged, ours and the original's, per round
        for b, batch in batches.items():
            model.train()
            t = Timer()
            staged_train_step(model, batch, opt, lam, t)
            for s in TRAIN_STAGES:
                ttimes[b][s].append(t.t[s])
            t0 = time.perf_counter()
            plain_train_step(model, batch, opt, lam)
            tplain[b].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            plain_train_step(model, cached[b], opt, lam)
            tcached[b].append(time.perf_counter() - t0)
            if original:
                theirs(b, original(cmd="train", batch=b))
        # one untimed call first on each side: the first call after training steps runs on caches
        # the step evicted (its stages then read up to 1.5x slower than the unstaged call after it)
        plain_predict(model, io, obs, r)
        if original:
            original(cmd="predict", staged=False)
        t = Timer()
        staged_predict(model, io, obs, r, t)
        for s in INFER_STAGES:
            itimes[s].append(t.t[s])
        t0 = time.perf_counter()
        plain_predict(model, io, obs, r)
        iplain.append(time.perf_counter() - t0)
        if original:
            theirs("predict", original(cmd="predict"))
    model.train()

    for b in batches:
        table(f"training step (batch {b}, uncached), ours, medians of {args.rounds} rounds:",
              TRAIN_STAGES, ttimes[b], tflops[b].t, tplain[b])
    for b in batches:
        print(f"latent-cache step, ours (batch {b}, unstaged): {1e3 * statistics.median(tcached[b]):.1f} ms "
              f"(uncached {1e3 * statistics.median(tplain[b]):.1f} ms)")
    table(f"predict_action end to end (batch 1, {args.native[0]}x{args.native[1]} frames, PolicyIO included), ours, "
          f"medians of {args.rounds} rounds:", INFER_STAGES, itimes, iflops.t, iplain)
    ratio = 1.0
    if original:
        original.close()
        for b in batches:
            x = side_by_side(f"training step (batch {b}, uncached), ours vs the original, medians of {args.rounds} "
                             f"interleaved rounds:", (ttimes[b], tflops[b].t, tplain[b]),
                             (otimes[b], theirs_t[b]["flops"], oplain[b]))
            if b == args.batch_size[0]:
                ratio = x
            c, t = statistics.median(tcached[b]), statistics.median(oplain[b])
            print(f"latent-cache step (ours from cached clip latents, unstaged; the original has no cache): "
                  f"{1e3 * c:.1f} ms vs its uncached {1e3 * t:.1f} ms: {t / c:.2f}x")
        side_by_side(f"predict_action end to end (batch 1, {args.native[0]}x{args.native[1]} frames; ours with PolicyIO, "
                     f"the original with its client side), medians of {args.rounds} interleaved rounds:",
                     (itimes, iflops.t, iplain), (otimes["predict"], theirs_i["flops"], oplain["predict"]))
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    b0 = args.batch_size[0]
    ft, fi = sum(tflops[b0].t.values()) or 1.0, sum(iflops.t.values()) or 1.0
    print(f"FLOP share, training (batch {b0}): " + ", ".join(f"{s} {100 * tflops[b0].t.get(s, 0) / ft:.1f}%" for s in TRAIN_STAGES))
    print("FLOP share, inference: " + ", ".join(f"{s} {100 * iflops.t.get(s, 0) / fi:.1f}%" for s in INFER_STAGES))
    if original:
        print(f"reference: original DiT4DiT {original.commit} at {Path(args.config).stem} size (speedup = its unstaged "
              f"training step / ours, batch {b0}, uncached)")
    else:
        print("reference: none (ours only; give --original-root/--original-python for the original's side)")
    print(f"speedup: {ratio:.2f}")


if __name__ == "__main__":
    main()
