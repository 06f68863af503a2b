"""Camera views -> one video frame for the video backbone, and pixel-range conversion.

The original put a "wrist" camera beside the primary one only when a key contained "wrist" and
appended any other camera on the *time* axis, where it silently became "future frames" (SPEC A4).
Here every view is tiled spatially, by position, whatever the camera is called.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

ViewLayout = Literal["width", "height", "grid"]


class FrameInputError(ValueError):
    """Frames whose shape/dtype the video backbone cannot take (one clear message each)."""


def grid_shape(num_views: int, layout: ViewLayout) -> tuple[int, int]:
    """(rows, cols) of the tiling. "grid" is near-square, filled row by row."""
    if num_views < 1:
        raise FrameInputError(f"frames: need at least one camera view, got {num_views}")
    if layout == "width":
        return 1, num_views
    if layout == "height":
        return num_views, 1
    if layout == "grid":
        cols = math.ceil(math.sqrt(num_views))
        return math.ceil(num_views / cols), cols
    raise FrameInputError(f"framework.cosmos25.view_layout: got {layout!r}, expected width|height|grid")


def tile_views(frames: torch.Tensor, layout: ViewLayout = "width") -> torch.Tensor:
    """(B, T, V, C, H, W) -> (B, T, C, rows*H, cols*W), view v at cell (v // cols, v % cols).

    Pure function; keeps dtype. Empty grid cells (V not a full rectangle) are zeros.
    """
    if frames.ndim != 6:
        raise FrameInputError(
            f"frames: expected (B, T, V, 3, H, W), got shape {tuple(frames.shape)} "
            "(add the view axis even for one camera)"
        )
    b, t, v, c, h, w = frames.shape
    rows, cols = grid_shape(v, layout)
    if rows * cols != v:  # pad the last grid row with blank views
        pad = frames.new_zeros(b, t, rows * cols - v, c, h, w)
        frames = torch.cat([frames, pad], dim=2)
    x = frames.reshape(b, t, rows, cols, c, h, w)
    x = x.permute(0, 1, 4, 2, 5, 3, 6)  # (B, T, C, rows, H, cols, W)
    return x.reshape(b, t, c, rows * h, cols * w)


def to_unit_float(frames: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] or float [0, 1] -> float32 [0, 1]. The dtype says which, never the values
    (the original guessed the range from ``min() >= 0``, SPEC A21)."""
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
