"""The causal Wan VAE's clip encode: a clip's posterior-mean latents, and the frame-count rule.

Apart from ``cosmos.py`` (the backbone module) because the latent cache's writer, its statistics,
the tiny VAE's fit and the benchmarks encode clips with a bare VAE and no backbone; the backbone
calls the same functions, so both encode a clip one way.
"""

from __future__ import annotations

import torch
from torch import nn

from dit4dit_npu import device as dev


@torch.no_grad()
def vae_latents(vae: nn.Module, video: torch.Tensor) -> torch.Tensor:
    """(B, 3, T, H, W) in [-1, 1] -> the VAE's posterior mean (B, 16, T_lat, H/8, W/8) in the VAE's
    dtype, un-normalised: ``CosmosBackbone.encode_video`` normalises it, and it is exactly what a
    latent cache stores (deterministic, so caching it is exact). T is padded to 1 + 4k first."""
    video = pad_to_causal_length(video, vae_temporal_factor(vae))
    return vae.encode(vae_layout(vae, video)).latent_dist.mode().contiguous()


def vae_layout(vae: nn.Module, video: torch.Tensor) -> torch.Tensor:
    """``video`` in the VAE's dtype and the memory layout its kernels are fastest with on its
    device (``device.video_memory_format``: channels-last on CPU). The values are unchanged."""
    weight = next(vae.parameters())
    return video.to(weight.dtype).contiguous(memory_format=dev.video_memory_format(weight.device))


def pad_to_causal_length(video: torch.Tensor, temporal_factor: int) -> torch.Tensor:
    """(B, 3, T, H, W): pad T to 1 + k * temporal_factor by repeating the last frame (the causal
    VAE would otherwise silently drop the trailing frames)."""
    t = video.shape[2]
    target = causal_length(t, temporal_factor)
    if target == t:
        return video
    return torch.cat([video, video[:, :, -1:].expand(-1, -1, target - t, -1, -1)], dim=2)


def vae_temporal_factor(vae: nn.Module) -> int:
    """Pixel frames per latent frame after the first (Wan: 4)."""
    return 2 ** sum(vae.config.temperal_downsample)


def causal_length(num_frames: int, temporal_factor: int) -> int:
    """``num_frames`` rounded up to 1 + k * temporal_factor: what the causal VAE encodes whole."""
    return (num_frames - 1 + temporal_factor - 1) // temporal_factor * temporal_factor + 1
