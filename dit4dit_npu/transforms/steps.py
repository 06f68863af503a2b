"""The steps of a PolicyIO, in the order they run: each a small object that applies itself and
serializes itself (``to_dict`` / ``STEPS[d["step"]].from_dict``) into ``policy_io.json``.

Robot -> model, for a training sample and a live observation alike::

    CropViews     camera -> [top, left, height, width] fractions cut out of its whole frames
    ResizeViews   every view to the model's image size (one resize method: images.RESIZE_METHODS)
    TileViews     the views, cameras in model order, into one channels-first frame
    EncodeState   raw state -> encoded (normalize / sin-cos / ...), reordered, zero-padded
    EncodeAction  raw chunk -> normalized, padded; its ``inverse`` turns predicted chunks back
                  into robot units (model -> robot runs this one step backwards)

Every camera takes the same path in training and live use: its frames decoded to RGB at the size
the video stores (the dataset) or as sent (a robot), then CropViews and ResizeViews. The steps
hold settings only; the statistics that Encode* normalize with are the PolicyIO's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dit4dit_npu.config.datasets import crop_problem
from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.transforms.feature_stats import FeatureStats
from dit4dit_npu.transforms.images import (
    RESIZE_METHODS,
    VIEW_LAYOUTS,
    crop_rgb,
    resize_rgb,
    tile_views,
    tiled_size,
)
from dit4dit_npu.transforms.vector import VectorPipeline

CROPS_KEY = "datasets.vla_data.camera_crops"


class PolicyIOError(DiT4DiTError, ValueError):
    """A PolicyIO that cannot be built or read (one line naming the setting or file)."""


class IOStep:
    """One step: ``name`` is its tag in policy_io.json."""

    name: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, d: dict[str, Any], stats: dict[str, FeatureStats]) -> IOStep:
        raise NotImplementedError


@dataclass
class CropViews(IOStep):
    """A fixed region of interest per camera (fractions of the frame, so one crop fits any
    resolution); cameras without one pass whole."""

    name: ClassVar[str] = "crop_views"
    crops: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.crops = {str(k): [float(v) for v in c] for k, c in dict(self.crops).items()}
        for key, crop in self.crops.items():
            problem = crop_problem(crop)
            if problem:
                raise PolicyIOError(f"{CROPS_KEY}.{key}: {problem}")

    def check_cameras(self, camera_keys: Sequence[str]) -> None:
        for key in self.crops:
            if key not in camera_keys:
                raise PolicyIOError(f"{CROPS_KEY}: {key!r} is not one of the camera_keys {list(camera_keys)}")

    def __call__(self, key: str, image: np.ndarray) -> np.ndarray:
        return crop_rgb(image, self.crops.get(key))

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.name, "crops": self.crops}

    @classmethod
    def from_dict(cls, d: dict[str, Any], stats: dict[str, FeatureStats]) -> CropViews:
        return cls(d["crops"])


@dataclass
class ResizeViews(IOStep):
    """Every view to ``size`` (H, W); ``method``: "swscale" (this project's) or "torch_bilinear"
    (DiT4DiT's training resize, set by its checkpoint import). A view already at the size passes."""

    name: ClassVar[str] = "resize_views"
    size: tuple[int, int]
    method: str = "swscale"

    def __post_init__(self) -> None:
        self.size = (int(self.size[0]), int(self.size[1]))
        if self.method not in RESIZE_METHODS:
            raise PolicyIOError(f"resize_method {self.method!r}: expected one of {list(RESIZE_METHODS)}")

    def __call__(self, image: np.ndarray) -> np.ndarray:
        return resize_rgb(np.ascontiguousarray(image), self.size, self.method)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.name, "size": list(self.size), "method": self.method}

    @classmethod
    def from_dict(cls, d: dict[str, Any], stats: dict[str, FeatureStats]) -> ResizeViews:
        return cls(tuple(d["size"]), d["method"])


@dataclass
class TileViews(IOStep):
    """uint8 (..., V, H, W, 3) -> (..., 3, rows*H, cols*W) by ``layout`` (images.VIEW_LAYOUTS)."""

    name: ClassVar[str] = "tile_views"
    layout: str = "width"

    def __post_init__(self) -> None:
        if self.layout not in VIEW_LAYOUTS:
            raise PolicyIOError(f"view_layout {self.layout!r}: expected one of {list(VIEW_LAYOUTS)}")

    def __call__(self, views: np.ndarray) -> np.ndarray:
        return tile_views(views, self.layout)

    def frame_size(self, image_size: Sequence[int], num_views: int) -> tuple[int, int]:
        return tiled_size(image_size, num_views, self.layout)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.name, "layout": self.layout}

    @classmethod
    def from_dict(cls, d: dict[str, Any], stats: dict[str, FeatureStats]) -> TileViews:
        return cls(d["layout"])


@dataclass
class EncodeState(IOStep):
    """Raw state (..., state_dim) -> the model's (..., state_width) by its vector steps."""

    name: ClassVar[str] = "encode_state"
    feature: ClassVar[str] = "state"
    pipeline: VectorPipeline

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.pipeline.forward(x)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.name, "vector": self.pipeline.to_config()}

    @classmethod
    def from_dict(cls, d: dict[str, Any], stats: dict[str, FeatureStats]) -> IOStep:
        return cls(VectorPipeline.from_config(d["vector"], stats[cls.feature]))


@dataclass
class EncodeAction(EncodeState):
    """Raw chunk (..., action_dim) -> normalized, padded (..., action_width); ``inverse``: back."""

    name: ClassVar[str] = "encode_action"
    feature: ClassVar[str] = "action"

    def inverse(self, y: np.ndarray) -> np.ndarray:
        return self.pipeline.inverse(y)


# The steps in the one order they run (and are written).
ORDER: tuple[type[IOStep], ...] = (CropViews, ResizeViews, TileViews, EncodeState, EncodeAction)
STEPS: dict[str, type[IOStep]] = {cls.name: cls for cls in ORDER}


def steps_from_dicts(items: Any, stats: dict[str, FeatureStats]) -> list[IOStep]:
    """policy_io.json's ``steps`` -> the step objects; each kind exactly once, in ``ORDER``."""
    if not isinstance(items, list):
        raise PolicyIOError(f"malformed PolicyIO: steps must be a list, got {type(items).__name__}")
    names = [d.get("step") if isinstance(d, dict) else None for d in items]
    want = [cls.name for cls in ORDER]
    if names != want:
        raise PolicyIOError(f"malformed PolicyIO: steps {names}, expected exactly {want} in that order")
    return [STEPS[d["step"]].from_dict(d, stats) for d in items]
