"""Explicit noise: every random draw of a ``predict_action`` call or a training forward, given by
the caller so that the call can be replayed exactly and compared with another implementation
(as openpi's and lerobot's ``sample_actions(..., noise=...)``).

Any field left ``None`` is drawn as usual (seeded or from the global RNG). Shapes are checked
once, here, against the batch the noise is for; a wrong shape is one ``NoiseError`` line naming
the field. The layouts are ours and do not depend on how another implementation orders its
draws: the R repeated action-noise draws of a sample are an explicit axis, not a row order.

==================  =================================  ===================================================
field               shape                              draw
==================  =================================  ===================================================
``condition``       (B, 16, 1, h, w)                   eps of the conditioning latent's VAE posterior
                                                       sample (only with condition_latent="sample")
``feature``         (B, 16, T_lat, h, w)               latents of the feature pass (frame 0 is replaced
                                                       by the conditioning latent: its values are unused)
``action``          inference: (B, chunk, A)           Euler start x_1
                    training: (B, R, chunk, A)         eps of repeat r of sample b
``action_time``     (B, R), training only              t of the action flow matching (after / noise_s)
``video_time``      (B,), training only                t of the video flow matching
``video``           (B, 16, T_lat - 1, h, w)           z of the video flow matching (future frames; with
                                                       ``video_loss_future_frames`` k: (B, 16, k, h, w))
``one_pass_draw``   (B,), training only                u ~ U[0, 1) of the one-pass step (``one_pass``):
                                                       sample b runs at the inference noise convention
                                                       when u < ``inference_noise_share``
==================  =================================  ===================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from dit4dit_npu.errors import DiT4DiTError


class NoiseError(DiT4DiTError, ValueError):
    """Explicit noise that does not fit the call (one line naming the field)."""


@dataclass(frozen=True)
class InferenceNoise:
    action: torch.Tensor | None = None
    feature: torch.Tensor | None = None
    condition: torch.Tensor | None = None


@dataclass(frozen=True)
class TrainingNoise:
    action: torch.Tensor | None = None
    action_time: torch.Tensor | None = None
    feature: torch.Tensor | None = None
    condition: torch.Tensor | None = None
    video_time: torch.Tensor | None = None
    video: torch.Tensor | None = None
    one_pass_draw: torch.Tensor | None = None


def noise_from(value: Any, cls: type) -> Any:
    """``None``, an instance of ``cls``, or a mapping of its field names to arrays/tensors."""
    if value is None or isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise NoiseError(f"noise: expected a {cls.__name__} or a dict, got {type(value).__name__}")
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise NoiseError(f"noise: unknown field(s) {unknown}; expected some of {names}")
    out = {}
    for k, v in value.items():
        if v is None:
            continue
        t = torch.from_numpy(np.asarray(v)) if not isinstance(v, torch.Tensor) else v
        if not t.is_floating_point():
            raise NoiseError(f"noise.{k}: expected floats, got dtype {t.dtype}")
        if not torch.isfinite(t).all():
            raise NoiseError(f"noise.{k}: contains NaN or inf")
        out[k] = t.float()
    return cls(**out)


def checked(noise: torch.Tensor | None, name: str, shape: tuple[int, ...], device: torch.device) -> torch.Tensor | None:
    """``noise`` on ``device`` as float32 if it has ``shape``; None stays None."""
    if noise is None:
        return None
    if tuple(noise.shape) != tuple(shape):
        raise NoiseError(f"noise.{name}: expected shape {tuple(shape)}, got {tuple(noise.shape)}")
    return noise.to(device=device, dtype=torch.float32)
