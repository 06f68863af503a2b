"""Camera images -> the one frame the video backbone sees: resize, then tile the views.

- ``swscale_rgb`` is the ONE resize path: training frames are resized inside the decoder's
  YUV->RGB conversion with it, live images with ``resize_rgb``, so inference sees images resized
  exactly as in training (bilinear; swscale widens the kernel when downscaling, so it does not
  alias).
- ``crop_rgb`` cuts a fixed region of interest out of a camera frame before that resize (a
  camera's ``crop``: [top, left, height, width] as fractions of the frame, so one crop fits the
  frame at any resolution); training frames and live images are cut by the same function.
- ``tile_views`` puts the camera views side by side ("width"), stacked ("height") or on a
  near-square "grid", by position, whatever the cameras are called. The original placed a view
  beside the primary one only if its key contained "wrist" and appended any other camera on the
  *time* axis, where it became "future frames".
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Literal

import av
import numpy as np
from av.video.reformatter import VideoReformatter
from einops import rearrange

ViewLayout = Literal["width", "height", "grid"]
VIEW_LAYOUTS = ("width", "height", "grid")

INTERPOLATION = "BILINEAR"  # swscale filter for every resize (decode-time and live images)
# How live images are resized: "swscale" (this project's training frames: the same path, so
# inference matches training), or "torch_bilinear", DiT4DiT's training resize (imported policies).
RESIZE_METHODS = ("swscale", "torch_bilinear")
# PyAV 17 made ``reformat`` multithreaded (sws_scale_frame) and gave it a ``threads`` argument, whose
# default pool deadlocks a forked DataLoader worker that inherits it: one thread. Before 17 it ran
# on one thread and takes no such argument (lerobot 0.6 pins av < 16: the side environment of
# scripts/lerobot_check.sh runs 15.1).
_ONE_THREAD = {"threads": 1} if int(av.__version__.split(".")[0]) >= 17 else {}


def swscale_rgb(frame: av.VideoFrame, size_hw: Sequence[int] | None, reformatter: VideoReformatter) -> np.ndarray:
    """One swscale pass: pixel-format conversion to rgb24 and (optional) resize together.

    A long-lived ``VideoReformatter`` keeps its swscale context between frames (a fresh one per
    frame costs ~5x the conversion). One swscale thread (``_ONE_THREAD``): workers are the parallelism.
    """
    if size_hw is None:
        return reformatter.reformat(frame, format="rgb24", **_ONE_THREAD).to_ndarray()
    h, w = int(size_hw[0]), int(size_hw[1])
    rgb = reformatter.reformat(frame, width=w, height=h, format="rgb24", interpolation=INTERPOLATION, **_ONE_THREAD)
    return rgb.to_ndarray()


_local = threading.local()  # one reformatter per thread: swscale contexts are not thread-safe


def resize_rgb(image: np.ndarray, size_hw: Sequence[int], method: str = "swscale") -> np.ndarray:
    """Resize a uint8 (H, W, 3) RGB image to ``size_hw`` exactly as decoded training frames are
    (``method``: see RESIZE_METHODS)."""
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"resize_rgb expects a uint8 (H, W, 3) image, got {image.dtype} {image.shape}")
    if image.shape[:2] == tuple(int(s) for s in size_hw):
        return image
    if method == "torch_bilinear":
        return torch_bilinear_rgb(image, size_hw)
    if method != "swscale":
        raise ValueError(f"resize method {method!r}: expected one of {list(RESIZE_METHODS)}")
    if not hasattr(_local, "reformatter"):
        _local.reformatter = VideoReformatter()
    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
    return swscale_rgb(frame, size_hw, _local.reformatter)


def crop_box(h: int, w: int, crop: Sequence[float]) -> tuple[int, int, int, int]:
    """The pixel rows/columns [y0, y1) x [x0, x1) a fractional crop covers in an h x w frame
    (edges rounded to the nearest pixel, at least one pixel each way)."""
    top, left, height, width = (float(v) for v in crop)
    y0, x0 = min(round(top * h), h - 1), min(round(left * w), w - 1)  # a sliver at the edge: its last pixel
    y1, x1 = max(y0 + 1, round((top + height) * h)), max(x0 + 1, round((left + width) * w))
    return y0, min(y1, h), x0, min(x1, w)


def crop_rgb(image: np.ndarray, crop: Sequence[float] | None) -> np.ndarray:
    """(H, W, 3) -> the region ``crop`` covers (a contiguous copy); None: the image itself."""
    if crop is None:
        return image
    y0, y1, x0, x1 = crop_box(image.shape[0], image.shape[1], crop)
    return np.ascontiguousarray(image[y0:y1, x0:x1])


def torch_bilinear_rgb(image: np.ndarray, size_hw: Sequence[int]) -> np.ndarray:
    """DiT4DiT's training resize: ``F.interpolate(bilinear, align_corners=False)`` without
    antialiasing on the [0, 1] float image, rounded back to uint8 (the original kept the floats:
    at most half a grey level apart; images already at the size are not touched, as there)."""
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(np.array(image, copy=True)).permute(2, 0, 1)[None].float() / 255.0  # a writable copy
    y = F.interpolate(x, size=(int(size_hw[0]), int(size_hw[1])), mode="bilinear", align_corners=False)
    return (y[0].permute(1, 2, 0) * 255.0).round().clamp(0, 255).to(torch.uint8).numpy()


def grid_shape(num_views: int, layout: str) -> tuple[int, int]:
    """(rows, cols) of the tiling; "grid" is near-square, filled row by row."""
    if num_views < 1:
        raise ValueError(f"need at least one camera view, got {num_views}")
    if layout == "width":
        return 1, num_views
    if layout == "height":
        return num_views, 1
    if layout == "grid":
        cols = math.ceil(math.sqrt(num_views))
        return math.ceil(num_views / cols), cols
    raise ValueError(f"view_layout {layout!r}: expected one of {list(VIEW_LAYOUTS)}")


def tiled_size(image_size: Sequence[int], num_views: int, layout: str) -> tuple[int, int]:
    rows, cols = grid_shape(num_views, layout)
    return rows * int(image_size[0]), cols * int(image_size[1])


def tile_views(views: np.ndarray, layout: str) -> np.ndarray:
    """uint8 (..., V, H, W, 3) -> (..., 3, rows*H, cols*W): view v at cell (v // cols, v % cols).

    Empty cells of an incomplete grid are black. Channels-first, as the model takes frames.
    """
    rows, cols = grid_shape(views.shape[-4], layout)
    missing = rows * cols - views.shape[-4]
    if missing:
        blank = np.zeros(views.shape[:-4] + (missing,) + views.shape[-3:], dtype=views.dtype)
        views = np.concatenate([views, blank], axis=-4)
    return rearrange(views, "... (r c) h w ch -> ... ch (r h) (c w)", r=rows, c=cols)


def untile(frame: np.ndarray) -> np.ndarray:
    """(..., 3, H, W) channels-first tiled frame -> (..., H, W, 3) for display."""
    return rearrange(frame, "... ch h w -> ... h w ch")
