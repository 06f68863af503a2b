"""The policy's small interface for servers: what a parsed request is, what the policy says about
itself, and the input range checks (run once, at parse time).

    parsed = policy.parse(obs, allow_out_of_range=...)        # checked, resized, state range
    parsed = policy.with_rtc(parsed, rtc)                     # optional: real-time chunking (rtc.py)
    chunks = policy.predict_batch([parsed, ...], seed=...)    # one model call, one result each
    policy.describe()                                         # cameras, sizes, widths, chunk ...

A ``ModelSpaceRequest`` (DiT4DiT's own protocol: frames already tiled, state already encoded) goes
through the same ``predict_batch`` and gets the model's normalized chunk back. A server
(``serve/``) calls only these; it never reads the PolicyIO. Inputs far outside the training data
(a state, or a previous chunk, beyond its training range by more than the range's width) are
refused with one line naming the input, the joint, its value and the range; with
``allow_out_of_range`` the same line is carried as a warning (``ParsedRequest.warnings``) that the
caller passes on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dit4dit_npu.errors import DiT4DiTWarning
from dit4dit_npu.policy.rtc import ChunkPrefix, concat_prefixes
from dit4dit_npu.transforms.observation import Observation, PolicyInputError, concat_observations

# A live input whose min-max position (training range -> [-1, 1]) exceeds this in some dim is
# implausible: it lies more than a whole training range beyond either edge. A robot in its normal
# workspace never gets there (its training data covered it); values in other units (degrees for
# radians: x57) or another joint order do, and the model's actions there are extrapolation.
RANGE_LIMIT = 3.0
STATE_RANGE_LIMIT = RANGE_LIMIT  # its former name


class OutOfRangeError(PolicyInputError):
    """An input far outside the training range, refused (``allow_out_of_range=True`` acts on it).
    ``problem`` is the line without the refusal (a server words its own opt-out)."""

    def __init__(self, problem: str, opt_out: str = "allow_out_of_range=True acts on it anyway") -> None:
        super().__init__(f"{problem}; refused ({opt_out})")
        self.problem = problem


class StateOutOfRangeError(OutOfRangeError):
    """A state far outside the training range."""


class PrevChunkOutOfRangeError(OutOfRangeError):
    """A real-time-chunking ``prev_chunk`` far outside the training action range."""


class OutOfRangeWarning(DiT4DiTWarning):
    """An input far outside the training range that the caller allowed."""


class StateRangeWarning(OutOfRangeWarning):
    """A state far outside the training range that the caller allowed."""


class PrevChunkRangeWarning(OutOfRangeWarning):
    """A ``prev_chunk`` far outside the training action range that the caller allowed."""


@dataclass(frozen=True)
class ParsedRequest:
    """A checked request: the parsed observation, its RTC prefix (None: plain sampling), and the
    out-of-range lines the caller allowed (``allow_out_of_range``), to be passed on as warnings."""

    observation: Observation
    prefix: ChunkPrefix | None = None
    warnings: tuple[str, ...] = ()
    allow_out_of_range: bool = False
    # the warning classes of ``warnings``, for callers that raise Python warnings
    categories: tuple[type[OutOfRangeWarning], ...] = field(default=(), compare=False)

    @property
    def rows(self) -> int:
        return self.observation.rows

    @property
    def batched(self) -> bool:
        return self.observation.batched

    def allowed(self, line: str, category: type[OutOfRangeWarning], **changes: Any) -> ParsedRequest:
        return replace(self, warnings=(*self.warnings, line), categories=(*self.categories, category), **changes)

    def out_of_range(self, problem: str, error: type[OutOfRangeError],
                     category: type[OutOfRangeWarning]) -> ParsedRequest:
        """The one opt-out: refuse (``error``), or carry the line as a warning of ``category``."""
        if not self.allow_out_of_range:
            raise error(problem)
        return self.allowed(problem, category)


@dataclass(frozen=True)
class ModelSpaceRequest:
    """Inputs already in the model's space (DiT4DiT's own protocol, whose clients encode and
    un-normalize themselves): ``predict_batch`` answers it with the model's NORMALIZED chunk
    (rows, chunk, action_width), padded dims included, what the original model returned."""

    frames: np.ndarray  # uint8 (B, H, W_tiled, 3): the views already resized and tiled (frame_size)
    state: np.ndarray | None  # float32 (B, state_width) already encoded and padded; None: no state
    instructions: list[str]

    @property
    def rows(self) -> int:
        return len(self.instructions)

    @property
    def batched(self) -> bool:
        return True  # always has a batch axis, as DiT4DiT's examples do


def concat_model_space(parts: Sequence[ModelSpaceRequest]) -> ModelSpaceRequest:
    """Model-space requests that share one model call -> one."""
    if len(parts) == 1:
        return parts[0]
    return ModelSpaceRequest(
        frames=np.concatenate([p.frames for p in parts]),
        state=None if parts[0].state is None else np.concatenate([p.state for p in parts]),
        instructions=[s for p in parts for s in p.instructions],
    )


def concat_requests(parts: Sequence[ParsedRequest]) -> ParsedRequest:
    """Requests that share one model call -> one batched request (all RTC or none, one guidance
    strength: the server's batching key keeps the others apart)."""
    if len(parts) == 1:
        return parts[0]
    prefixes = [p.prefix for p in parts]
    if any(p is None for p in prefixes) and any(p is not None for p in prefixes):
        raise ValueError("requests of one model call must all use real-time chunking or none")
    return ParsedRequest(
        concat_observations([p.observation for p in parts]),
        None if prefixes[0] is None else concat_prefixes(prefixes),
        tuple(w for p in parts for w in p.warnings),
        categories=tuple(c for p in parts for c in p.categories),
    )


def split_rows(out: np.ndarray, parts: Sequence[ParsedRequest | ModelSpaceRequest]) -> list[np.ndarray]:
    """Batched output rows -> one result per request; one sent without a batch axis gets its
    result without one."""
    results, start = [], 0
    for p in parts:
        results.append(out[start : start + p.rows] if p.batched else out[start])
        start += p.rows
    return results


def out_of_range_dims(stats: Any, values: np.ndarray, limit: float = RANGE_LIMIT) -> list[int]:
    """Dims of ``values`` (..., D) whose min-max normalized value exceeds ``limit`` in magnitude
    (dims constant in training are skipped)."""
    center, half = (stats.min + stats.max) / 2, (stats.max - stats.min) / 2
    live = half > 0
    z = np.abs(np.asarray(values, np.float64).reshape(-1, len(half))[:, live] - center[live]) / half[live]
    return np.flatnonzero(live)[(z > limit).any(0)].tolist()


def range_problem(what: str, stats: Any, values: np.ndarray, names: Sequence[str], hint: str) -> str | None:
    """One line naming the dims of ``values`` (..., D) far outside the training range of ``stats``,
    the farthest value of each and its range; None when every dim is plausible."""
    dims = out_of_range_dims(stats, values)
    if not dims:
        return None
    rows = np.asarray(values, np.float64).reshape(-1, len(stats.min))
    center = (stats.min + stats.max) / 2
    parts = []
    for j in dims[:4]:
        v = rows[np.abs(rows[:, j] - center[j]).argmax(), j]  # the farthest row's value
        parts.append(f"{names[j]} = {v:.4g} (trained on [{stats.min[j]:.4g}, {stats.max[j]:.4g}])")
    more = f" and {len(dims) - 4} more dim(s)" if len(dims) > 4 else ""
    return f"{what} far outside the training range (beyond it by more than its width) in {', '.join(parts)}{more}: {hint}"


@dataclass(frozen=True)
class PolicyDescription:
    """What a policy says about itself: each fact once. ``metadata()`` is the dict a server sends
    on connect (its own limits are added by the server); the top-level keys clients read
    (``camera_keys``, ``chunk_length``, ``image_size``, ...) keep their names."""

    format_version: int
    step: int
    base_model: str
    camera_keys: list[str]
    image_size: tuple[int, int]  # (H, W) of each view
    source_image_sizes: dict[str, list[list[int]]]  # the training videos' sizes, per camera
    camera_crops: dict[str, list[float]]  # cut out of whole frames by the policy itself
    state_dim: int
    action_dim: int
    chunk_length: int
    instructions: list[str]
    # the model space (DiT4DiT's own protocol: tiled frames in, normalized padded chunks out)
    frame_size: tuple[int, int]
    view_layout: str
    state_width: int
    action_width: int
    policy_io: dict[str, Any]  # policy_io.json: the steps and the statistics

    def metadata(self) -> dict[str, Any]:
        return {
            "policy": "dit4dit_npu",
            "format_version": self.format_version,
            "camera_keys": list(self.camera_keys),
            "image_size": list(self.image_size),
            "source_image_sizes": self.source_image_sizes,
            "camera_crops": self.camera_crops,
            "state_dim": self.state_dim,
            "action_dim": self.action_dim,
            "chunk_length": self.chunk_length,
            "action_shape": [self.chunk_length, self.action_dim],  # float32, robot units (a batch adds an axis)
            "step": self.step,
            "base_model": self.base_model,
            "instructions": list(self.instructions),
            "observation_keys": [*self.camera_keys, "state", "instruction"],
            "model_space": {
                "frame_size": list(self.frame_size),
                "view_layout": self.view_layout,
                "state_width": self.state_width,
                "action_width": self.action_width,
            },
            "policy_io": self.policy_io,
        }
