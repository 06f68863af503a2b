"""PolicyIO: every transform between robot data and model tensors, in both directions.

One object, built once from the training data's statistics and the config, saved with every
checkpoint and policy folder (``policy_io.json``), and called by the dataset (``camera_views``,
``encode_sample``: training samples and the latent cache), the policy (``parse_observation`` /
``encode_parsed`` / ``decode_actions``) and evaluation alike, so training and deployment cannot
drift apart. It is an ordered list of steps (``steps.py``: CropViews, ResizeViews, TileViews,
EncodeState, EncodeAction, each serializing itself) plus the facts they share: the cameras in
model order, the clip (frame offsets of a training sample), the chunk length (the one number;
DiT4DiT's ``future_action_window_size`` is it minus one, converted only at import and export),
the raw statistics and the training videos' sizes.

The model reads its input widths from ``spec`` (a ``BatchSpec``), never from a second copy.
Its file format (``to_dict`` / ``from_dict`` / ``save`` / ``load``, formats 1 to 3) is
``policy_io_json.py``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dit4dit_npu.batch import Batch, BatchSpec
from dit4dit_npu.config import Config, ConfigError
from dit4dit_npu.transforms import encodings
from dit4dit_npu.transforms.feature_stats import FeatureStats
from dit4dit_npu.transforms.images import crop_box
from dit4dit_npu.transforms.observation import ASPECT_TOLERANCE, Observation, parse_observation
from dit4dit_npu.transforms.policy_io_json import FORMAT, PolicyIOJson  # noqa: F401 (FORMAT: read here before)
from dit4dit_npu.transforms.steps import (
    CROPS_KEY,
    ORDER,
    CropViews,
    EncodeAction,
    EncodeState,
    IOStep,
    PolicyIOError,
    ResizeViews,
    TileViews,
)
from dit4dit_npu.transforms.vector import NORM_MODES, Normalize, TooNarrowError, VectorPipeline, padded

STATE_MODES = (*NORM_MODES, "sincos", "none")


@dataclass(eq=False)
class PolicyIO(PolicyIOJson):
    camera_keys: list[str]
    clip_offsets: list[int]  # frame offsets of a training clip; 0 = the observation
    chunk_length: int  # action steps per chunk: the one number (DiT4DiT's window is this - 1)
    stats: dict[str, FeatureStats]  # raw "state" / "action" statistics of the training data
    steps: list[IOStep]  # exactly steps.ORDER: crop, resize, tile, state, action
    # camera -> [[H, W], ...] of the training videos (the live-image aspect-ratio check)
    source_sizes: dict[str, list[list[int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if [type(s) for s in self.steps] != list(ORDER):
            raise PolicyIOError(f"steps {[type(s).__name__ for s in self.steps]}: expected {[c.__name__ for c in ORDER]}")
        self.crop, self.resize, self.tile, self.state_step, self.action_step = self.steps
        if not self.camera_keys:
            raise PolicyIOError("camera_keys: expected at least one camera")
        if not self.clip_offsets or self.clip_offsets[0] != 0:
            raise PolicyIOError(f"clip_offsets {self.clip_offsets}: must start with 0 (the observation frame)")
        if self.chunk_length < 1:
            raise PolicyIOError(f"chunk_length {self.chunk_length}: expected >= 1")
        self.crop.check_cameras(self.camera_keys)

    @classmethod
    def compose(
        cls,
        camera_keys: Sequence[str],
        image_size: Sequence[int],
        view_layout: str,
        clip_offsets: Sequence[int],
        chunk_length: int,
        stats: dict[str, FeatureStats],
        state: VectorPipeline,
        action: VectorPipeline,
        source_sizes: dict[str, list[list[int]]] | None = None,
        resize_method: str = "swscale",
        camera_crops: dict[str, Sequence[float]] | None = None,
    ) -> PolicyIO:
        """The steps from their settings (what formats 1 and 2 stored as top-level keys)."""
        steps = [
            CropViews({k: list(v) for k, v in (camera_crops or {}).items()}),
            ResizeViews(tuple(image_size), resize_method),
            TileViews(view_layout),
            EncodeState(state),
            EncodeAction(action),
        ]
        return cls([str(k) for k in camera_keys], [int(o) for o in clip_offsets], int(chunk_length), dict(stats),
                   steps, dict(source_sizes or {}))

    # The steps' settings, read where a caller needs one (each has one owner: its step).
    @property
    def image_size(self) -> tuple[int, int]:
        return self.resize.size

    @property
    def resize_method(self) -> str:
        return self.resize.method

    @property
    def view_layout(self) -> str:
        return self.tile.layout

    @property
    def camera_crops(self) -> dict[str, list[float]]:
        return self.crop.crops

    @property
    def state(self) -> VectorPipeline:
        return self.state_step.pipeline

    @property
    def action(self) -> VectorPipeline:
        return self.action_step.pipeline

    # ------------------------------------------------------------------ construction

    @classmethod
    def build(
        cls,
        *,
        camera_keys: Sequence[str],
        image_size: Sequence[int],
        view_layout: str,
        clip_offsets: Sequence[int],
        chunk_length: int,
        state_stats: FeatureStats,
        action_stats: FeatureStats,
        state_norm: str,
        action_norm: str,
        max_state_dim: int | None = None,
        max_action_dim: int | None = None,
        source_sizes: dict[str, list[list[int]]] | None = None,
        warn: bool = True,
        state_parts: Sequence[Any] = (),
        action_parts: Sequence[Any] = (),
        state_order: Sequence[int] | None = None,
        action_order: Sequence[int] | None = None,
        gripper_dims: Sequence[int] = (),
        gripper_threshold: float = 0.5,
        action_clip: str = "none",
        resize_method: str = "swscale",
        camera_crops: dict[str, Sequence[float]] | None = None,
    ) -> PolicyIO:
        """state = encode (state_norm, or per part) + reorder + pad; action = normalize (per part)
        + grippers + reorder + clip policy + pad (``encodings.py``; the keys are datasets.vla_data's)."""
        if state_norm not in STATE_MODES:
            raise PolicyIOError(f"state_norm {state_norm!r}: expected one of {list(STATE_MODES)}")
        if action_norm not in NORM_MODES:
            raise PolicyIOError(f"action_norm {action_norm!r}: expected one of {list(NORM_MODES)}")
        try:
            state_steps = encodings.state_steps(state_parts, state_norm, state_stats, state_order, gripper_threshold)
            action_steps = encodings.action_steps(action_parts, action_norm, action_stats, action_order,
                                                  gripper_threshold, gripper_dims, action_clip)
            state = padded(state_steps, state_stats.dim, max_state_dim, "state")
            action = padded(action_steps, action_stats.dim, max_action_dim, "action")
        except encodings.EncodingError as e:
            raise PolicyIOError(str(e)) from None
        except TooNarrowError as e:
            key = f"max_{e.name}_dim"
            raise PolicyIOError(
                f"datasets.vla_data.{key} is {e.width} but the encoded {e.name} has {e.encoded} dims "
                f"({e.in_dim} raw); set {key} >= {e.encoded}, or leave it null for no padding"
            ) from None
        io = cls.compose(
            camera_keys, image_size, view_layout, clip_offsets, chunk_length,
            {"state": state_stats, "action": action_stats}, state, action,
            source_sizes=source_sizes, resize_method=resize_method, camera_crops=camera_crops,
        )
        io.check_crop_aspects()
        if warn:
            io.warn_degenerate()
        return io

    @classmethod
    def from_config(
        cls,
        cfg: Config,
        state_stats: FeatureStats,
        action_stats: FeatureStats,
        source_sizes: dict[str, list[list[int]]] | None = None,
        warn: bool = True,
        resize_method: str = "swscale",
    ) -> PolicyIO:
        """The one adapter from the run config (datasets.vla_data, action chunk) to a PolicyIO."""
        d = cfg.datasets.vla_data
        return cls.build(
            camera_keys=d.camera_keys,
            image_size=d.image_size,
            view_layout=d.view_layout,
            clip_offsets=d.clip_offsets,
            chunk_length=cfg.framework.action_model.chunk_length,
            state_stats=state_stats,
            action_stats=action_stats,
            state_norm=d.state_norm,
            action_norm=d.action_norm,
            max_state_dim=d.max_state_dim,
            max_action_dim=d.max_action_dim,
            source_sizes=source_sizes,
            warn=warn,
            state_parts=d.state_parts,
            action_parts=d.action_parts,
            state_order=d.state_order,
            action_order=d.action_order,
            gripper_dims=d.gripper_dims,
            gripper_threshold=d.gripper_threshold,
            action_clip=d.action_clip,
            resize_method=resize_method,
            camera_crops=d.camera_crops,
        )

    def check_crop_aspects(self) -> None:
        """A crop of a training video must have the views' aspect ratio: a stretched view would be
        one the model trains on but no camera shows."""
        want = self.image_size[1] / self.image_size[0]
        for key, crop in self.camera_crops.items():
            for sh, sw in self.source_sizes.get(key, []):
                y0, y1, x0, x1 = crop_box(sh, sw, crop)
                if abs(((x1 - x0) / (y1 - y0)) / want - 1.0) > ASPECT_TOLERANCE:
                    fit = crop[3] * sw / sh / want
                    raise PolicyIOError(
                        f"{CROPS_KEY}.{key}: {list(crop)} cuts {y1 - y0}x{x1 - x0} (HxW) out of its "
                        f"{sh}x{sw} videos, another aspect ratio than image_size {list(self.image_size)}; "
                        f"with width {crop[3]:g} the height fraction would be {fit:.4f}"
                    )

    def warn_degenerate(self) -> None:
        for name, pipe in (("state", self.state), ("action", self.action)):
            step = pipe.find(Normalize)
            if step is not None and step.degenerate_dims:
                warnings.warn(
                    f"{name} dims {step.degenerate_dims} are constant in the training data ({step.mode}): "
                    "they normalize to 0 and unnormalize to their constant value",
                    stacklevel=3,
                )

    # ------------------------------------------------------------------ shapes

    @property
    def state_dim(self) -> int:
        return self.state.in_dim

    @property
    def action_dim(self) -> int:
        return self.action.in_dim

    @property
    def frame_size(self) -> tuple[int, int]:
        return self.tile.frame_size(self.image_size, len(self.camera_keys))

    @property
    def spec(self) -> BatchSpec:
        """What every batch this PolicyIO makes fits: the one place a BatchSpec is derived."""
        return BatchSpec(
            state_width=self.state.out_dim,
            action_width=self.action.out_dim,
            chunk_length=self.chunk_length,
            num_frames=len(self.clip_offsets),
            frame_size=self.frame_size,
        )

    @property
    def action_mask(self) -> np.ndarray:
        """(action_width,) bool: True on real action dims, False on padding."""
        return self.action.mask()

    # ------------------------------------------------------------------ robot -> model

    def view(self, key: str, image: np.ndarray) -> np.ndarray:
        """One camera image, uint8 (h, w, 3) RGB at any size -> the model's view of it (CropViews,
        then ResizeViews): the one path of every camera's frames, in training and live use."""
        return self.resize(self.crop(key, image))

    def frames(self, views: np.ndarray) -> torch.Tensor:
        """uint8 (..., V, H, W, 3) at ``image_size`` -> uint8 (..., 3, H', W') tiled (TileViews)."""
        if tuple(views.shape[-3:-1]) != self.image_size or views.shape[-4] != len(self.camera_keys):
            raise ValueError(
                f"views: expected (..., {len(self.camera_keys)}, {self.image_size[0]}, {self.image_size[1]}, 3), "
                f"got {views.shape}"
            )
        return torch.from_numpy(np.ascontiguousarray(self.tile(views)))

    def camera_views(self, frames_of: Callable[[str], np.ndarray]) -> np.ndarray:
        """uint8 (N, V, H, W, 3) views at ``image_size``, cameras in model order, from a decoder:
        ``frames_of(key)`` -> uint8 (N, h, w, 3) frames of camera ``key`` as stored, in RGB; each
        then goes through ``view`` as a live image does."""
        return np.stack([np.stack([self.view(key, f) for f in frames_of(key)]) for key in self.camera_keys], axis=1)

    def encode_state(self, state: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.state_step(state).astype(np.float32))

    def normalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """Raw (..., action_dim) -> normalized, padded (..., action_width), float64."""
        return self.action_step(actions)

    def encode_sample(
        self, views: np.ndarray | None, state: np.ndarray, actions: np.ndarray, instruction: str
    ) -> dict[str, Any]:
        """One training sample: views uint8 (T, V, H, W, 3), raw state (S,), raw chunk (H_a, A).
        ``views=None`` (a latent-cache sample, whose clip was encoded ahead of time) gives no frames."""
        if actions.shape[0] != self.chunk_length:
            raise ValueError(f"action chunk has {actions.shape[0]} steps, expected {self.chunk_length}")
        mask = np.broadcast_to(self.action_mask, (self.chunk_length, self.action.out_dim))
        return {
            "frames": self.frames(views) if views is not None else None,
            "instruction": instruction,
            "state": self.encode_state(state) if self.state.out_dim else None,
            "action": torch.from_numpy(self.normalize_actions(actions).astype(np.float32)),
            "action_mask": torch.from_numpy(mask.copy()),
        }

    def parse_observation(self, obs: Any) -> Observation:
        """A robot observation dict (ours or openpi's layout, single or batched) -> checked arrays,
        images resized to ``image_size`` the policy's way. The one place a wire or robot
        observation is read: the policy and the server both call it, once per observation."""
        return parse_observation(obs, self.camera_keys, self.state_dim, self.view, self.image_size,
                                 self.source_sizes, self.camera_crops)

    def encode_parsed(self, o: Observation) -> Batch:
        """A parsed observation -> the inference Batch (T = 1): views tiled, state encoded and padded."""
        return Batch(
            frames=self.frames(o.views)[:, None],
            instruction=list(o.instructions),
            state=self.encode_state(o.state) if self.state.out_dim else None,
        )

    def encode_observation(self, obs: dict[str, Any]) -> tuple[Batch, bool]:
        """A robot observation (single or batched) -> (inference Batch with T = 1, batched?)."""
        o = self.parse_observation(obs)
        return self.encode_parsed(o), o.batched

    # ------------------------------------------------------------------ model -> robot

    def decode_actions(self, normalized: torch.Tensor | np.ndarray) -> np.ndarray:
        """Model output (..., action_width), normalized -> robot units (..., action_dim) float32."""
        if isinstance(normalized, torch.Tensor):
            normalized = normalized.detach().float().cpu().numpy()
        return self.action_step.inverse(normalized).astype(np.float32)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PolicyIO) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return (
            f"PolicyIO(camera_keys={self.camera_keys}, crops {self.camera_crops}, image {self.image_size} tiled {self.view_layout} -> "
            f"{self.frame_size}, clip {self.clip_offsets}, chunk {self.chunk_length}, "
            f"state {self.state}, action {self.action})"
        )



def config_spec(cfg: Config, state_dim: int, action_dim: int) -> BatchSpec:
    """The BatchSpec of the PolicyIO ``cfg`` builds for a robot with ``state_dim`` / ``action_dim``
    raw dims, before any data is read (what a dry run and the benchmarks build models for). The
    statistics only set values, never widths, so placeholders stand in for them."""

    def placeholder(dim: int) -> FeatureStats:  # [-1, 1]: no degenerate dims
        return FeatureStats(*(np.full(dim, v) for v in (-1.0, 1.0, 0.0, 1.0, -1.0, 1.0)), count=0)

    try:
        return PolicyIO.from_config(cfg, placeholder(state_dim), placeholder(action_dim), warn=False).spec
    except PolicyIOError as e:
        raise ConfigError(str(e)) from None
