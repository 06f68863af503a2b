"""``bench/train_step.py --options``: the per-step cost of each option that makes a joint (video +
action) training step cheaper, against a no-video step and against today's joint step.

Arms (each its own model, built from the same config and seed, plus the arm's overrides; the
command line's overrides apply to every arm):

- ``no-video``: one-frame clips (``datasets.vla_data.video_delta_indices=[0]``), the sim recipe's
  no-video step: the feature pass of the observation and the action loss;
- ``joint``: today's joint step (feature pass + video flow-matching pass);
- ``one-pass``: ``framework.cosmos25.one_pass.enabled`` (the head reads the video pass's block);
- ``one-pass+level``: the same with the head conditioned on the noise level;
- ``every-2`` / ``every-4``: ``trainer.video_loss_interval`` 2 / 4 (a round runs k steps, the first
  with the video loss: the arm's time is their mean);
- ``joint-skip``: a joint model's step without its video loss, the steps ``video_loss_interval``
  and ``trainer.video_loss_span`` leave it out of (the feature pass reads the clip's future latent
  frames as noise, so it costs more than a no-video step). A span [a, b] of a run counted in steps
  costs f x joint + (1 - f) x joint-skip per step on average (f = b - a); of a run under a time
  budget (the equal-time arms), 1 / (f / joint + (1 - f) / joint-skip) (a share f of the time);
- ``fraction-0.5``: ``framework.cosmos25.video_loss_batch_fraction=0.5`` (for comparison);
- ``future-1``: ``framework.cosmos25.video_loss_future_frames=1``, only where the clip has more than
  one future latent frame (give a longer clip, e.g. ``datasets.vla_data.video_delta_indices=[0, 1,
  2, 3, 4, 5, 6, 7, 8]``).

``--cached``: every arm's batch as a latent cache delivers it (no VAE encode in the step), as the
sim recipe trains. Arms run interleaved round by round (A, B, C, ..., A, B, C, ...) so a shared machine's load hits
them alike; medians are shown. The last line is ``speedup: X.XX``: today's joint step over the
one-pass step.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

import torch
from _common import bench_spec, count_flops, timed

from dit4dit_npu import device as dev
from dit4dit_npu.config import load_config
from dit4dit_npu.models.prompt_cache import PromptCache
from dit4dit_npu.models.vae import vae_latents
from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder
from dit4dit_npu.weights.testing import make_batch

ONE_PASS = "framework.cosmos25.one_pass.enabled=true"
ARMS: dict[str, tuple[list[str], int | None]] = {  # name -> (overrides, video loss every k-th step; None: never)
    "no-video": (["datasets.vla_data.video_delta_indices=[0]"], 1),
    "joint": ([], 1),
    "one-pass": ([ONE_PASS], 1),
    "one-pass+level": ([ONE_PASS, "framework.cosmos25.one_pass.condition_head_on_noise_level=true"], 1),
    "every-2": ([], 2),
    "every-4": ([], 4),
    "joint-skip": ([], None),
    "fraction-0.5": (["framework.cosmos25.video_loss_batch_fraction=0.5"], 1),
    "future-1": (["framework.cosmos25.video_loss_future_frames=1"], 1),
}


@dataclass
class Arm:
    name: str
    model: torch.nn.Module
    batch: object
    opt: torch.optim.Optimizer
    interval: int | None  # None: a joint model's step without its video loss, every step
    video_weight: float

    def step(self, video: bool) -> None:
        out = self.model(self.batch, video_loss=video)
        self.opt.zero_grad(set_to_none=True)
        (out["action_loss"] + self.video_weight * out["video_loss"]).backward()
        self.opt.step()

    def videos(self) -> list[bool]:
        """One period of the video-loss schedule: whether each step has the video loss."""
        return [False] if self.interval is None else [i == 0 for i in range(self.interval)]

    def round(self) -> float:
        """Mean seconds of one step over a period of the video-loss schedule."""
        return sum(timed(lambda: self.step(v)) for v in self.videos()) / len(self.videos())  # noqa: B023


def cached(model, batch):
    """The batch as a latent cache delivers it (bench/train_step.py's "cached" path): the clip's
    VAE posterior mean, no frames; the sim recipe trains so."""
    video = model.video_input(batch.frames.to(model.device))
    return dataclasses.replace(batch, frames=None, latents=vae_latents(model.backbone.vae, video))


def build_arm(
    name: str, config: str, overrides: list[str], batch_size: int, encoder_cache: dict, from_cache: bool = False
) -> Arm | None:
    extra, interval = ARMS[name]
    cfg = load_config(config, overrides + extra)
    spec = bench_spec(cfg)
    dev.seed_everything(0)
    model = build_dit4dit(cfg, spec).to(dev.get_device())
    if name == "future-1" and model.video_latent_frames == model.backbone.latent_frames(spec.num_frames):
        return None  # the clip has one future latent frame: nothing to leave out
    batch = make_batch(spec, batch_size=batch_size)
    if from_cache:
        batch = cached(model, batch)
    key = tuple(sorted(batch.instruction))
    if key not in encoder_cache:
        cache = PromptCache()
        cache.build(batch.instruction, build_prompt_encoder(cfg))
        encoder_cache[key] = cache
    model.set_prompt_cache(encoder_cache[key])
    params = [p for p in model.parameters() if p.requires_grad]
    try:  # fused AdamW where torch has it, as bench/train_step.py
        opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), fused=True)
    except RuntimeError:
        opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95))
    model.train()
    return Arm(name, model, batch, opt, interval, cfg.trainer.loss_scale.future_video)


def run_options(config: str, overrides: list[str], batch_size: int, steps: int, from_cache: bool = False) -> None:
    cfg = load_config(config, overrides)
    if len(cfg.datasets.vla_data.clip_offsets) < 2:
        raise SystemExit("bench/train_step.py --options: the joint arms need future frames: give "
                         "datasets.vla_data.video_delta_indices=[0, 1, 2, 3, 4] (or another multi-frame clip)")
    caches: dict = {}
    arms = [a for name in ARMS if (a := build_arm(name, config, overrides, batch_size, caches, from_cache)) is not None]
    print(f"device: {dev.describe()}  batch={batch_size}  clip={len(cfg.datasets.vla_data.clip_offsets)} frames  "
          f"{'from the latent cache' if from_cache else 'uncached (VAE encode in the step)'}  "
          f"backprop_action_to_backbone={cfg.framework.cosmos25.backprop_action_to_backbone}")
    for a in arms:  # warm-up: allocations, optimizer state
        a.round()
    times: dict[str, list[float]] = {a.name: [] for a in arms}
    for _ in range(steps):  # interleaved round by round
        for a in arms:
            times[a.name].append(a.round())
    med = {n: statistics.median(ts) for n, ts in times.items()}
    flops = {a.name: sum(count_flops(lambda: a.step(v)) for v in a.videos()) / len(a.videos())  # noqa: B023
             for a in arms}
    print(f"{'arm':<15} {'step median s':>14} {'min':>8} {'max':>8} {'x no-video':>11} {'x joint':>8} {'GFLOP':>8}")
    for a in arms:
        n = a.name
        print(f"{n:<15} {med[n]:>14.4f} {min(times[n]):>8.4f} {max(times[n]):>8.4f} {med[n] / med['no-video']:>11.2f} "
              f"{med[n] / med['joint']:>8.2f} {flops[n] / 1e9:>8.2f}")
    print(f"rounds: {steps} interleaved (an every-k arm's round is k steps, its time their mean)")
    print("reference: today's joint step (speedup = its median / the one-pass step's)")
    print(f"speedup: {med['joint'] / med['one-pass']:.2f}")
