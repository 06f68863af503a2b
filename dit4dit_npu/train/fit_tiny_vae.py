"""Fit the tiny VAE to a config's training frames: a stand-in for the real stack's pretrained Wan VAE.

    dit4dit-fit-tiny-vae --config configs/aloha/dit4dit_aloha_transfer_cube_tiny.yaml \\
        --out configs/aloha/tiny_vae_transfer_cube.safetensors [--steps 500] [--frames 384] [a.b=c ...]
    dit4dit-fit-tiny-vae --smoke --config CFG --out DIR/vae.safetensors [a.b=c ...]   # 4 frames, 3 steps

The tiny VAE of ``framework.cosmos25.tiny`` is random and frozen: its latents may hide what the
policy needs (where the cube is) and its decoder cannot show what the backbone predicts. This
trains it from its random init (the same seed) on ``--frames`` training clips of the config
(exactly what the model encodes: the dataset's views, crops and tiling, evenly spaced over the
training samples) by reconstruction (MSE of the decoded posterior mean in [-1, 1], plus a 1e-6
KL term that keeps the posterior's variance bounded), then writes

- ``OUT`` (safetensors, the VAE's state dict): name it in ``framework.cosmos25.tiny.vae_weights``
  and every run built from that config (training, latent caches, exported policies) uses it, frozen;
- ``OUT`` with ``.stats.txt``: its latent statistics on the same frames, the two config lines
  ``vae_latents_mean: [...]`` / ``vae_latents_std: [...]`` in python -m dit4dit_npu.data.latent_stats's form (the
  random VAE's statistics do not fit a fitted VAE: set both with it);
- ``OUT`` with ``.png`` (or ``--png``): real frames of held-out episodes (training ones without a
  validation split) -> encode -> decode, by the random VAE and by the fitted one, one above the other.

The last line is ``reconstruction MSE random R -> fitted F (PSNR a -> b dB)`` on those frames.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import torch

from dit4dit_npu.config import Config, ConfigError, load_config
from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.files import atomic_path, atomic_write_text

KL_WEIGHT = 1e-6  # as latent-diffusion VAEs: reconstruction rules, the posterior std stays bounded


def random_vae_config(cfg: Config) -> Config:
    """``cfg`` with the random tiny VAE (no fitted weights, no latent statistics) and frames decoded
    online: what the fit starts from and what it measures against."""
    c = cfg.framework.cosmos25
    if not c.is_tiny:
        raise ConfigError("framework.cosmos25.base_model: dit4dit-fit-tiny-vae fits the tiny VAE (base_model: tiny); "
                          f"got {c.base_model}")
    tiny = dataclasses.replace(c.tiny, vae_weights=None, vae_latents_mean=None, vae_latents_std=None)
    framework = dataclasses.replace(cfg.framework, cosmos25=dataclasses.replace(c, tiny=tiny))
    data = dataclasses.replace(cfg.datasets, vla_data=dataclasses.replace(cfg.datasets.vla_data, latent_cache=None))
    return dataclasses.replace(cfg, framework=framework, datasets=data)


def clips(ds: object, n: int) -> torch.Tensor:
    """``n`` clips evenly spaced over ``ds``'s samples, as the model's frames: uint8 (n, T, 3, H, W)
    (kept as bytes: 4x less memory than the VAE's float input, made per batch by ``vae_input``)."""
    idx = np.linspace(0, len(ds) - 1, min(n, len(ds))).round().astype(int)
    return torch.stack([ds[int(i)]["frames"] for i in idx])


def vae_input(frames: torch.Tensor) -> torch.Tensor:
    """uint8 (B, T, 3, H, W) -> (B, 3, T, H, W) in [-1, 1]: the model's own conversion."""
    from dit4dit_npu.models.dit4dit import video_input

    return video_input(frames).float()


def round_trip(vae: torch.nn.Module, video: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(decoded posterior mean, the posterior) of ``video`` (the causal VAE: T padded to 1 + 4k)."""
    from dit4dit_npu.models.vae import pad_to_causal_length, vae_temporal_factor

    x = pad_to_causal_length(video, vae_temporal_factor(vae))
    dist = vae.encode(x).latent_dist
    out = vae.decode(dist.mode(), return_dict=False)[0]
    return out[:, :, : video.shape[2]], dist


@torch.no_grad()
def reconstruction_mse(vae: torch.nn.Module, frames: torch.Tensor, batch: int) -> float:
    """Mean squared error of the round trip in [-1, 1], over every pixel of ``frames``."""
    total = 0.0
    for i in range(0, len(frames), batch):
        x = vae_input(frames[i : i + batch])
        total += torch.mean((round_trip(vae, x)[0] - x) ** 2).item() * len(x)
    return total / len(frames)


def psnr(mse: float) -> float:
    return 10 * math.log10(4.0 / mse)  # [-1, 1] images: peak-to-peak 2


def fit(vae: torch.nn.Module, frames: torch.Tensor, steps: int, batch: int, lr: float, seed: int) -> list[float]:
    """Adam on random minibatches of ``frames`` (whole clips), cosine-decayed learning rate;
    returns the losses."""
    vae.train().requires_grad_(True)
    opt = torch.optim.Adam(vae.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(steps, 1), eta_min=lr / 20)
    g = torch.Generator().manual_seed(seed)
    losses, t0 = [], time.perf_counter()
    for step in range(1, steps + 1):
        x = vae_input(frames[torch.randint(len(frames), (min(batch, len(frames)),), generator=g)])
        out, dist = round_trip(vae, x)
        loss = torch.mean((out - x) ** 2) + KL_WEIGHT * dist.kl().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % max(steps // 10, 1) == 0 or step == steps:
            print(f"step {step}/{steps}: loss {np.mean(losses[-max(steps // 10, 1):]):.5f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    vae.eval().requires_grad_(False)
    return losses


@torch.no_grad()
def latent_stats(vae: torch.nn.Module, frames: torch.Tensor, batch: int) -> tuple[list[float], list[float]]:
    """Per-channel mean/std of the posterior mean of frame 0 of each clip: python -m dit4dit_npu.data.latent_stats's
    measure (the conditioning frame, what every sample encodes)."""
    from dit4dit_npu.models.vae import vae_latents

    z = torch.cat([vae_latents(vae, vae_input(frames[i : i + batch, :1])).float() for i in range(0, len(frames), batch)])
    return z.mean((0, 2, 3, 4)).tolist(), z.std((0, 2, 3, 4)).tolist()


def stats_text(mean: list[float], std: list[float]) -> str:
    fmt = ", ".join
    return (f"    vae_latents_mean: [{fmt(f'{x:.4f}' for x in mean)}]\n"
            f"    vae_latents_std: [{fmt(f'{x:.4f}' for x in std)}]\n")


@torch.no_grad()
def round_trip_png(path: Path, frames: torch.Tensor, before: torch.nn.Module, after: torch.nn.Module,
                   errors: tuple[float, float]) -> None:
    """For each of ``frames`` (uint8 (n, 1, 3, H, W)): the real frame, the random VAE's round
    trip, the fitted one's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = vae_input(frames)
    rows = [("real frame", x), (f"random VAE (MSE {errors[0]:.4f})", round_trip(before, x)[0]),
            (f"fitted VAE (MSE {errors[1]:.4f})", round_trip(after, x)[0])]
    h, w = frames.shape[-2:]
    fig, axes = plt.subplots(len(rows), len(frames), squeeze=False,
                             figsize=(max(2.0, 3.2 * len(frames) * w / max(h, w)), 3.0 * len(rows) * h / max(h, w) + 0.6))
    for r, (title, images) in enumerate(rows):
        for col, image in enumerate(images):
            ax = axes[r][col]
            ax.imshow(((image[:, 0].permute(1, 2, 0).clamp(-1, 1) + 1) * 127.5).round().byte().numpy())
            ax.set_xticks([])
            ax.set_yticks([])
            if col == 0:
                ax.set_title(title, loc="left", fontsize=9)
    fig.suptitle("tiny VAE round trip: frame -> encode -> decode (posterior mean)", fontsize=10)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)


def fit_and_save(a: argparse.Namespace) -> None:
    """Fit the config's tiny VAE as the command's flags ``a`` say (checked by ``train/ops_cli.py``),
    then write its weights, statistics and round-trip picture."""
    cfg = random_vae_config(load_config(a.config, a.overrides))
    torch.set_num_threads(1)

    from safetensors.torch import save_file

    from dit4dit_npu.data import build_training_data
    from dit4dit_npu.weights import build_vae
    from dit4dit_npu.weights.tiny_cache import load_vae_weights

    data = build_training_data(cfg)
    t0 = time.perf_counter()
    train = clips(data.train_dataset, a.frames)
    held_out = data.val_dataset is not None and len(data.val_dataset) > 0
    shown = clips(data.val_dataset if held_out else data.train_dataset, max(a.show, 1))[:, :1]  # frame 0 of each
    print(f"{len(train)} clips of {tuple(train.shape[1:])} (T, 3, H, W) from {a.config} "
          f"({time.perf_counter() - t0:.0f} s); the error on {len(shown)} {'held-out' if held_out else 'training'} "
          "frames", flush=True)
    before = build_vae(cfg).float()
    vae = build_vae(cfg).float()
    if a.init is not None:
        try:
            load_vae_weights(vae, a.init)
        except ConfigError as e:  # its words name the config key; the file came from --init here
            raise DiT4DiTError(f"--init: {str(e).split(': ', 1)[1]}") from None
    mse_before = reconstruction_mse(before, shown, a.batch)
    t0 = time.perf_counter()
    fit(vae, train, a.steps, a.batch, a.lr, cfg.seed)
    fit_s = time.perf_counter() - t0
    mse_after = reconstruction_mse(vae, shown, a.batch)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(a.out) as tmp:
        save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, str(tmp),
                  metadata={"config": str(a.config), "steps": str(a.steps), "frames": str(len(train))})
    mean, std = latent_stats(vae, train, a.batch)
    stats = a.out.with_suffix(".stats.txt")
    atomic_write_text(stats, stats_text(mean, std))
    png = a.png or a.out.with_suffix(".png")
    round_trip_png(png, shown, before, vae, (mse_before, mse_after))
    print(f"fit {a.steps} steps in {fit_s:.0f} s; wrote {a.out} ({a.out.stat().st_size / 1e6:.2f} MB), {png}, "
          f"and {stats}:\n{stats_text(mean, std)}"
          f"use: framework.cosmos25.tiny.vae_weights={a.out} and the two statistics above")
    print(f"reconstruction MSE random {mse_before:.5f} -> fitted {mse_after:.5f} "
          f"(PSNR {psnr(mse_before):.1f} -> {psnr(mse_after):.1f} dB)")


if __name__ == "__main__":  # python -m dit4dit_npu.train.fit_tiny_vae: the command is train/ops_cli.py's
    from dit4dit_npu.train.ops_cli import fit_tiny_vae_main

    raise SystemExit(fit_tiny_vae_main())
