"""The run config's ``datasets`` section: where the episodes are, how a clip and its state and
action vectors are cut and encoded, and how they are batched and split (``VLADataConfig``), each
key declared once with its check. Re-exported by ``schema.py`` with the rest of the schema; like it,
torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from dit4dit_npu.errors import ConfigError, require


@dataclass
class DatasetEntry:
    """One dataset of a mixture: a local LeRobot folder (relative to data_root_dir) and a weight."""

    path: str = ""
    weight: float = 1.0

    def check(self, key: str) -> None:
        require(bool(self.path), f"{key}.path", self.path, "a dataset folder")
        require(math.isfinite(self.weight) and self.weight > 0, f"{key}.weight", self.weight, "a number > 0")


# How one part of a state/action vector is encoded for the model (one declaration, read by the
# PolicyIO builder transforms/encodings.py): sincos (state only), a normalization, binary (on/off at
# datasets.vla_data.gripper_threshold, both ways: DiT4DiT's RoboTwin grippers), or none (raw).
PART_ENCODINGS = ("sincos", "min_max", "mean_std", "q99", "binary", "none")


@dataclass
class VectorPart:
    """Consecutive dims of the state or action vector encoded one way (DiT4DiT: one state/action
    key of its data config). ``norm`` null = the vector's own default (state_norm / action_norm)."""

    size: int = 1
    norm: Literal["sincos", "min_max", "mean_std", "q99", "binary", "none"] | None = None

    def check(self, key: str) -> None:
        require(self.size >= 1, f"{key}.size", self.size, ">= 1")


def crop_problem(crop: list[float]) -> str | None:
    """What is wrong with a camera crop [top, left, height, width] (fractions of the frame), else
    None: the one rule, for configs and for the PolicyIO files that carry crops."""
    if len(crop) != 4 or not all(isinstance(v, int | float) and math.isfinite(v) for v in crop):
        return f"expected [top, left, height, width] as 4 fractions of the frame, got {list(crop)}"
    top, left, height, width = crop
    if top < 0 or left < 0 or height <= 0 or width <= 0 or top + height > 1 or left + width > 1:
        return f"expected 0 <= top, left; height, width > 0; top + height <= 1, left + width <= 1; got {list(crop)}"
    return None


def _check_order(order: list[int] | None, key: str) -> None:
    if order is not None:
        require(sorted(order) == list(range(len(order))), key, order, "a permutation of 0..N-1 (model = robot[order])")


@dataclass
class VLADataConfig:
    data_root_dir: str = "data"
    # The datasets and their weights; empty = every LeRobot dataset folder under data_root_dir (or
    # data_root_dir itself when it is one), weight 1.0 each (data/mixture.py: mixture_entries).
    data_mix: list[DatasetEntry] = field(default_factory=list)
    # Create the generated demo dataset under data_root_dir when it is missing (embedded default).
    generate_demo_if_missing: bool = False
    per_device_batch_size: int = 4
    num_workers: int = 2
    # Frame offsets of the video clip (in frames, converted with each dataset's own fps).
    video_delta_indices: list[int] = field(default_factory=lambda: list(range(8)))
    # Keep every n-th clip frame for the video model (1 + 4k frames after subsampling are ideal).
    action_video_freq_ratio: int = 2
    camera_keys: list[str] = field(
        default_factory=lambda: [
            "observation.images.cam_high",
            "observation.images.cam_left_wrist",
            "observation.images.cam_right_wrist",
        ]
    )
    # A region of interest per camera, cut out of each of its frames before the resize: {camera key:
    # [top, left, height, width]} as fractions of the frame (so one crop fits every resolution),
    # with image_size's aspect ratio; applied by the policy to live frames too.
    camera_crops: dict[str, list[float]] = field(default_factory=dict)
    # Per-view size [H, W] after resize (each divisible by 16 once tiled).
    image_size: list[int] = field(default_factory=lambda: [224, 224])
    # How camera views become one frame: side by side ("width"), stacked ("height"),
    # or a near-square "grid". Any number of views; names do not matter (the original tiled a view only if its key
    # contained "wrist", and stacked any other on the time axis).
    view_layout: Literal["width", "height", "grid"] = "width"
    state_key: str = "observation.state"
    action_key: str = "action"
    # Padded widths of the model's state/action inputs (mixed embodiments share one width);
    # null = no padding (the encoded width: sincos doubles the state dims).
    max_state_dim: int | None = None
    max_action_dim: int | None = None
    # Action normalization: min_max to [-1, 1] (original), mean_std, q99 (q01/q99 to [-1, 1]).
    action_norm: Literal["min_max", "mean_std", "q99"] = "min_max"
    # State input: sincos of raw joints (original), or normalized like actions, or raw.
    state_norm: Literal["sincos", "min_max", "mean_std", "q99", "none"] = "min_max"
    # The state vector as parts, in the robot's dim order (DiT4DiT: its state keys), each encoded
    # its own way; empty = one part, the whole vector, encoded by state_norm. sincos parts become
    # [sin(part), cos(part)] in place: parts of size 1 interleave [sin x0, cos x0, sin x1, ...].
    state_parts: list[VectorPart] = field(default_factory=list)
    # The action vector as parts (no sincos); empty = the whole vector normalized by action_norm.
    # A part with norm none stays in robot units (DiT4DiT's statistics mask False: its grippers).
    action_parts: list[VectorPart] = field(default_factory=list)
    # The model's dim order: model = robot[order] (DiT4DiT's RoboTwin [L6, R6, Lg, Rg] against the
    # dataset's [L6, Lg, R6, Rg]); null = the robot's order.
    state_order: list[int] | None = None
    action_order: list[int] | None = None
    # Predicted action dims (robot order) set to 1.0 at or above gripper_threshold, else 0.0 (its
    # LIBERO client's gripper); binary parts use the same threshold (x > threshold).
    gripper_dims: list[int] = field(default_factory=list)
    gripper_threshold: float = 0.5
    # Un-normalizing predicted actions: "none" = the exact inverse (this project's runs); "normalized"
    # = clip the normalized dims to [-1, 1] first; "all" = clip every dim, passthrough and binary
    # ones too (DiT4DiT's clients, the default of an imported DiT4DiT run).
    action_clip: Literal["none", "normalized", "all"] = "none"
    # Episode-level hold-out: a fraction of each dataset's episodes, or explicit lists
    # ({dataset path: [episode indices]}); deterministic from the seed.
    val_fraction: float = 0.1
    val_episodes: dict[str, list[int]] | None = None
    # A latent cache folder (python -m dit4dit_npu.data.encode_latents): training reads each
    # sample's VAE latents from it instead of decoding and encoding video; null = encode online.
    latent_cache: str | None = None

    @property
    def clip_offsets(self) -> list[int]:
        """Frame offsets of the clip the video model sees: every action_video_freq_ratio-th of
        video_delta_indices (offset 0 = the observation). A PolicyIO stores them as its own."""
        return list(self.video_delta_indices[:: self.action_video_freq_ratio])

    def check(self, key: str) -> None:
        for name in ("max_state_dim", "max_action_dim"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{key}.{name}: got {getattr(self, name)}, expected >= 1 or null")
        offsets = self.video_delta_indices
        if not offsets or offsets[0] != 0:
            raise ConfigError(f"{key}.video_delta_indices: must start with 0 (the conditioning frame)")
        require(all(b > a for a, b in zip(offsets, offsets[1:])), f"{key}.video_delta_indices", offsets,
                "strictly increasing frame offsets")
        if self.action_video_freq_ratio < 1:
            raise ConfigError(f"{key}.action_video_freq_ratio: expected >= 1")
        if len(self.image_size) != 2 or min(self.image_size) <= 0:
            raise ConfigError(f"{key}.image_size: got {self.image_size}, expected [height, width]")
        if not self.camera_keys:
            raise ConfigError(f"{key}.camera_keys: expected at least one camera")
        require(len(set(self.camera_keys)) == len(self.camera_keys), f"{key}.camera_keys", self.camera_keys,
                "no repeats")
        for cam, crop in self.camera_crops.items():
            require(cam in self.camera_keys, f"{key}.camera_crops", cam, f"one of camera_keys {self.camera_keys}")
            problem = crop_problem(crop)
            if problem:
                raise ConfigError(f"{key}.camera_crops.{cam}: {problem}")
        for name in ("state_parts", "action_parts"):
            for i, part in enumerate(getattr(self, name)):
                part.check(f"{key}.{name}[{i}]")
        require(all(p.norm != "sincos" for p in self.action_parts), f"{key}.action_parts",
                [p.norm for p in self.action_parts], "no sincos part (actions are normalized, binary or raw)")
        _check_order(self.state_order, f"{key}.state_order")
        _check_order(self.action_order, f"{key}.action_order")
        require(self.state_order is None or all(p.norm != "sincos" for p in self.state_parts), f"{key}.state_order",
                self.state_order, "null with sincos state parts (reordering is for same-width encodings)")
        require(all(d >= 0 for d in self.gripper_dims) and len(set(self.gripper_dims)) == len(self.gripper_dims),
                f"{key}.gripper_dims", self.gripper_dims, "distinct action dims >= 0")
        require(math.isfinite(self.gripper_threshold), f"{key}.gripper_threshold", self.gripper_threshold, "a number")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"{key}.val_fraction: got {self.val_fraction}, expected in [0, 1)")
        require(self.per_device_batch_size >= 1, f"{key}.per_device_batch_size", self.per_device_batch_size, ">= 1")
        require(self.num_workers >= 0, f"{key}.num_workers", self.num_workers, ">= 0 (0 = load in the main process)")
        for i, entry in enumerate(self.data_mix):
            entry.check(f"{key}.data_mix[{i}]")


@dataclass
class DatasetsConfig:
    vla_data: VLADataConfig = field(default_factory=VLADataConfig)

    def check(self, key: str = "datasets") -> None:
        self.vla_data.check(f"{key}.vla_data")
