"""Latent statistics of the tiny random VAE on a config's training images, as config lines.

    python -m dit4dit_npu.data.latent_stats --config configs/aloha/dit4dit_aloha_transfer_cube_tiny.yaml \
        [--samples 256] [a.b=c ...]                                    (console script dit4dit-data-latent-stats)
    python -m dit4dit_npu.data.latent_stats --smoke --config CFG [a.b=c ...]   # 4 frames: checks that it runs

The model normalizes VAE latents per channel, (z - mean) / std, with the statistics in the VAE's
config: for the real Wan2.1 VAE, its published ones. A tiny *random* VAE's latents are far
smaller (std ~0.05 against ~2) and off-centre, so under the real statistics every image is the same
constant plus ~1% of signal: the backbone's features, and a policy trained on them, barely depend
on the cameras. This encodes ``--samples`` training frames (evenly spaced over the training
samples, cameras tiled as the model sees them) with the config's tiny VAE and prints
``framework.cosmos25.tiny.vae_latents_mean`` / ``vae_latents_std`` to paste into the config,
then how much of the images survives normalization under the real statistics and under these.
The last line is ``speedup: X.XX`` = the share of the normalized latent that varies between
images under these statistics / under the real ones (how much more the model can see).
"""

from __future__ import annotations

import dataclasses

from dit4dit_npu.config import Config


def report(cfg: Config, config_name: str, samples: int, batch: int) -> list[str]:
    """The lines the command prints: ``samples`` training frames of ``cfg`` encoded ``batch`` at a
    time with its tiny VAE (its configured statistics set aside), the statistics as config lines,
    and the last line ``speedup: X.XX``."""
    import numpy as np
    import torch

    from dit4dit_npu.data.build import build_training_data
    from dit4dit_npu.models.dit4dit import video_input
    from dit4dit_npu.models.vae import vae_latents
    from dit4dit_npu.weights import build_vae

    torch.set_num_threads(1)
    tiny = dataclasses.replace(cfg.framework.cosmos25.tiny, vae_latents_mean=None, vae_latents_std=None)
    cfg = dataclasses.replace(
        cfg, framework=dataclasses.replace(cfg.framework, cosmos25=dataclasses.replace(cfg.framework.cosmos25, tiny=tiny))
    )
    online = dataclasses.replace(cfg.datasets.vla_data, latent_cache=None)
    cfg = dataclasses.replace(cfg, datasets=dataclasses.replace(cfg.datasets, vla_data=online))
    ds = build_training_data(cfg).train_dataset
    vae = build_vae(cfg)
    idx = np.linspace(0, len(ds) - 1, min(samples, len(ds))).round().astype(int)
    latents = []
    for i in range(0, len(idx), batch):
        frames = torch.stack([ds[int(j)]["frames"][:1] for j in idx[i : i + batch]])  # frame 0 of each clip
        latents.append(vae_latents(vae, video_input(frames)).float())
    z = torch.cat(latents)  # (N, 16, 1, h, w)
    mean, std = z.mean((0, 2, 3, 4)), z.std((0, 2, 3, 4))
    real_mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    real_std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)

    def share(m: torch.Tensor, s: torch.Tensor) -> tuple[float, float, float]:
        x = (z - m) / s
        # how much the normalized latent varies between images, next to its typical size
        between, size = float(x.std(0).mean()), float(x.abs().mean())
        return between, size, between / size

    def signal(m: torch.Tensor, s: torch.Tensor) -> str:
        between, size, _ = share(m, s)
        return f"variation between images {between:.3f} on a magnitude of {size:.3f}"

    fmt = ", ".join
    own, real = share(mean.view(1, -1, 1, 1, 1), std.view(1, -1, 1, 1, 1))[2], share(real_mean, real_std)[2]
    return [
        f"{len(idx)} frames of {config_name}: latent std per channel {std.min():.4f}-{std.max():.4f}",
        f"under the real Wan2.1 statistics: {signal(real_mean, real_std)}",
        f"under these: {signal(mean.view(1, -1, 1, 1, 1), std.view(1, -1, 1, 1, 1))}",
        f"    vae_latents_mean: [{fmt(f'{x:.4f}' for x in mean.tolist())}]",
        f"    vae_latents_std: [{fmt(f'{x:.4f}' for x in std.tolist())}]",
        f"speedup: {own / real:.2f}",
    ]


if __name__ == "__main__":  # python -m dit4dit_npu.data.latent_stats: the command is data/cli.py's
    from dit4dit_npu.data.cli import latent_stats_main

    raise SystemExit(latent_stats_main())
