"""The model boundary: the one typed batch that data/, policy/ and train/ hand to the model.

PolicyIO (``transforms/policy_io.py``) makes every batch: it selects and orders the cameras,
resizes them, tiles the views into one frame, encodes and pads the state, normalizes and pads
the actions. The model only converts pixels to its own range and never pads, reorders or guesses
a layout. ``BatchSpec`` is what PolicyIO promises and the model expects; ``Batch.validate`` checks
a batch against it once, at the model boundary, with one clear line per problem.

==================  ==================================  ===========================================
field               shape / dtype                       meaning
==================  ==================================  ===========================================
``frames``          (B, T, 3, H, W) uint8               T clip frames, views already tiled into
                                                        one H x W frame; frame 0 is the current
                                                        observation (inference: T == 1)
``instruction``     list[str], length B                 task text (the prompt-cache key)
``state``           (B, state_width) float32 or None    encoded, padded state (None iff
                                                        state_width == 0)
``action``          (B, chunk_length, action_width)     normalized, padded action chunk
                    float32, training only
``action_mask``     (B, chunk_length, action_width)     True on real action dims (padding False)
                    bool, training only
``latents``         (B, 16, T_lat, H/8, W/8) float in   training only, optional: the clip's VAE
                    the VAE's dtype, or None            posterior mean (un-normalised) from a
                                                        latent cache (``data/latents.py``); the
                                                        model then skips its VAE encode and
                                                        ``frames`` may be None
==================  ==================================  ===========================================

Inference always sends ``frames``. The model checks the latents' exact shape against its VAE.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from dit4dit_npu.errors import DiT4DiTError


class BatchError(DiT4DiTError, ValueError):
    """A batch that does not match the model's ``BatchSpec`` (one line naming the field)."""


@dataclass(frozen=True)
class BatchSpec:
    """Widths and lengths a batch must have; PolicyIO defines them, the model is built from them."""

    state_width: int  # encoded (e.g. sin/cos doubles it) and padded state dims; 0 = no state
    action_width: int  # padded action dims the head predicts
    chunk_length: int  # action steps per chunk (DiT4DiT: future_action_window_size + 1, converted at its import/export)
    num_frames: int  # T of a training clip (inference always sends T = 1)
    frame_size: tuple[int, int]  # (H, W) of the tiled frame


@dataclass
class Batch:
    frames: torch.Tensor | None  # None only in a training batch that brings ``latents``
    instruction: list[str]
    state: torch.Tensor | None = None
    action: torch.Tensor | None = None
    action_mask: torch.Tensor | None = None
    latents: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return len(self.instruction)

    @property
    def has_actions(self) -> bool:
        return self.action is not None

    def to(self, device: torch.device | str, non_blocking: bool = True) -> Batch:
        moved = {
            f.name: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v
            for f in fields(self)
            if (v := getattr(self, f.name)) is not None
        }
        return replace(self, **moved)

    def first_frame(self) -> Batch:
        """The observation part: frame 0 only, no actions (what inference sees)."""
        return Batch(self.frames[:, :1], list(self.instruction), self.state)

    @staticmethod
    def collate(samples: Sequence[dict]) -> Batch:
        """Per-sample dicts (same field names, no batch axis) -> one Batch."""
        if not samples:
            raise BatchError("collate: empty batch")

        def stack(name: str) -> torch.Tensor | None:
            values = [s.get(name) for s in samples]
            if all(v is None for v in values):
                return None
            return torch.stack([torch.as_tensor(v) for v in values])

        return Batch(
            frames=stack("frames"),
            instruction=[str(s["instruction"]) for s in samples],
            state=stack("state"),
            action=stack("action"),
            action_mask=stack("action_mask"),
            latents=stack("latents"),
        )

    def validate(self, spec: BatchSpec, training: bool) -> None:
        """Raise ``BatchError`` on the first field that does not fit ``spec``."""
        b = self.size
        if isinstance(self.instruction, str) or not all(isinstance(s, str) for s in self.instruction):
            raise BatchError("batch.instruction: expected a list of str (one per sample)")
        if self.latents is not None:
            _check_latents(self.latents, b, training)
        f = self.frames
        if f is None and self.latents is not None:
            pass  # a latent-cache training batch: the clip was encoded ahead of time
        elif not isinstance(f, torch.Tensor) or f.ndim != 5 or f.shape[2] != 3 or f.dtype != torch.uint8:
            got = (tuple(f.shape), f.dtype) if isinstance(f, torch.Tensor) else type(f).__name__
            raise BatchError(f"batch.frames: expected uint8 (B, T, 3, H, W) with views tiled, got {got}")
        elif f.shape[0] != b:
            raise BatchError(f"batch.frames: {f.shape[0]} rows but {b} instructions")
        elif tuple(f.shape[-2:]) != tuple(spec.frame_size):
            raise BatchError(f"batch.frames: frame size {tuple(f.shape[-2:])}, expected {tuple(spec.frame_size)}")
        elif training and f.shape[1] != spec.num_frames:
            raise BatchError(f"batch.frames: {f.shape[1]} clip frames, expected {spec.num_frames}")
        _check(self.state, "state", (b, spec.state_width), torch.float32, required=spec.state_width > 0)
        if training:
            shape = (b, spec.chunk_length, spec.action_width)
            _check(self.action, "action", shape, torch.float32, required=True)
            _check(self.action_mask, "action_mask", shape, torch.bool, required=True)


def _check_latents(z: torch.Tensor, b: int, training: bool) -> None:
    if not training:
        raise BatchError("batch.latents: only training batches may bring latents (inference sends frames)")
    if not isinstance(z, torch.Tensor) or z.ndim != 5 or not z.is_floating_point() or z.shape[0] != b:
        got = (tuple(z.shape), z.dtype) if isinstance(z, torch.Tensor) else type(z).__name__
        raise BatchError(f"batch.latents: expected a float (B={b}, C, T_lat, h, w) tensor, got {got}")


def _check(x: torch.Tensor | None, name: str, shape: tuple, dtype: torch.dtype, required: bool) -> None:
    if x is None:
        if required:
            raise BatchError(f"batch.{name}: missing, expected {dtype} {shape}")
        return
    if not required:
        raise BatchError(f"batch.{name}: the model takes no {name} (width 0), got {tuple(x.shape)}")
    if tuple(x.shape) != shape or x.dtype != dtype:
        raise BatchError(f"batch.{name}: expected {dtype} {shape}, got {x.dtype} {tuple(x.shape)}")

