"""Pixel-range conversion between batch frames and the VAE.

Camera selection, resizing and view tiling happen before the model (PolicyIO): a batch brings one
tiled uint8 frame per time step. The model only maps pixel ranges, and the dtype alone says which
range a tensor is in (the original guessed it from ``min() >= 0``: wrong for any
[-1, 1] frame without a negative value).
"""

from __future__ import annotations

import torch

from dit4dit_npu.errors import DiT4DiTError


class FrameInputError(DiT4DiTError, ValueError):
    """Pixels of a dtype the model cannot interpret."""


def to_unit_float(frames: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] or float [0, 1] -> float32 [0, 1]."""
    if frames.dtype == torch.uint8:
        return frames.float() / 255.0
    if frames.is_floating_point():
        return frames.float()
    raise FrameInputError(f"frames: expected uint8 or float in [0, 1], got dtype {frames.dtype}")


def to_vae_range(frames: torch.Tensor) -> torch.Tensor:
    """uint8 / float [0, 1] -> float32 [-1, 1] (the VAE's input range)."""
    return to_unit_float(frames) * 2.0 - 1.0


def to_uint8(video: torch.Tensor) -> torch.Tensor:
    """float [-1, 1] -> uint8 [0, 255] (decoded frames)."""
    return ((video.float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
