"""Small pure steps on state/action vectors (last axis), composed into a ``VectorPipeline``.

Each step maps a (..., D) float array forward (robot data -> model) and back (model -> robot),
knows the width it produces, and how it moves the "real dimension" mask (padding adds False
dims: the action mask comes from the pipeline, never from a second width setting). Steps that
need statistics read them from the feature's ``FeatureStats``, which PolicyIO stores once; a step
serializes only its own settings (``to_config``) and is rebuilt with the stats (``from_config``).

Maths is float64 (the stats are float64); callers cast to the model dtype at the boundary.

    pipe = VectorPipeline([Normalize("min_max", stats), Pad(14, 32)], in_dim=14)
    y = pipe.forward(x)          # (..., 32), dims 14.. are 0
    x2 = pipe.inverse(y)         # (..., 14), equal to x up to float rounding
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.transforms.feature_stats import FeatureStats

# A range or std this small carries no signal (rad, m): the dim normalizes to 0 and
# unnormalizes to its constant, so nothing ever divides by ~0 (openpi#814, lerobot#211).
DEGENERATE_EPS = 1e-6

NORM_MODES = ("min_max", "mean_std", "q99")


class Step:
    """Interface of a vector step; subclasses are frozen dataclasses registered by ``kind``."""

    kind: ClassVar[str]

    def forward(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def inverse(self, y: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def out_dim(self, in_dim: int) -> int:
        return in_dim

    def forward_mask(self, mask: np.ndarray) -> np.ndarray:
        return mask

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind}


def _index_tuple(values: Sequence[int] | None, what: str) -> tuple[int, ...] | None:
    if values is None:
        return None
    out = tuple(int(v) for v in values)
    if len(set(out)) != len(out) or any(v < 0 for v in out):
        raise ValueError(f"{what} {list(out)}: expected distinct dims >= 0")
    return out


def _check_dims(dims: Sequence[int] | None, in_dim: int, what: str) -> None:
    if dims and max(dims) >= in_dim:
        raise ValueError(f"{what}: dim {max(dims)} does not exist in a {in_dim}-dim vector")


@dataclass(frozen=True, eq=False)
class Normalize(Step):
    """(x - center) / half: ``min_max`` and ``q99`` map [lo, hi] to [-1, 1], ``mean_std`` is a z-score.

    Degenerate dims (see DEGENERATE_EPS) map to 0. ``dims``: only these dims are normalized, the
    others pass through in robot units (DiT4DiT's stats "mask": its gripper dims). ``clip``: clip
    the normalized dims to [-1, 1] before unnormalizing (DiT4DiT's clients did, so an overshooting
    prediction stays inside the training range); without it the inverse is exact.
    """

    kind: ClassVar[str] = "normalize"
    mode: str
    stats: FeatureStats = field(repr=False)
    dims: tuple[int, ...] | None = None
    clip: bool = False
    selected: np.ndarray = field(init=False, repr=False)
    center: np.ndarray = field(init=False, repr=False)
    half: np.ndarray = field(init=False, repr=False)
    inv: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        s = self.stats
        object.__setattr__(self, "dims", _index_tuple(self.dims, "normalize dims"))
        _check_dims(self.dims, s.dim, "normalize dims")
        selected = np.ones(s.dim, dtype=bool)
        if self.dims is not None:
            selected[:] = False
            selected[list(self.dims)] = True
        if self.mode == "min_max":
            center, half = (s.min + s.max) / 2, (s.max - s.min) / 2
        elif self.mode == "q99":
            center, half = (s.q01 + s.q99) / 2, (s.q99 - s.q01) / 2
        elif self.mode == "mean_std":
            center, half = s.mean, s.std
        else:
            raise ValueError(f"normalization mode {self.mode!r}: expected one of {list(NORM_MODES)}")
        degenerate = (half <= DEGENERATE_EPS / 2) & selected
        # unselected dims: center 0, scale 1 (the identity)
        center = np.where(selected, center, 0.0)
        half = np.where(degenerate, 0.0, np.where(selected, half, 1.0))
        object.__setattr__(self, "selected", selected)
        object.__setattr__(self, "center", center)
        object.__setattr__(self, "half", half)
        object.__setattr__(self, "inv", np.divide(1.0, half, out=np.zeros_like(half), where=~degenerate))

    @property
    def degenerate_dims(self) -> list[int]:
        return np.flatnonzero(self.inv == 0).tolist()

    def forward(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, np.float64) - self.center) * self.inv

    def inverse(self, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, np.float64)
        if self.clip:
            y = np.where(self.selected, np.clip(y, -1.0, 1.0), y)
        return y * self.half + self.center

    def to_config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"kind": self.kind, "mode": self.mode}
        if self.dims is not None:
            cfg["dims"] = list(self.dims)
        if self.clip:
            cfg["clip"] = True
        return cfg


@dataclass(frozen=True, eq=False)
class SinCos(Step):
    """[sin(x), cos(x)]: joint angles without the 2*pi wrap-around (the original's state input).

    Layout: all sines, then all cosines; or with ``groups`` (sizes of consecutive dim groups,
    summing to the width) [sin(g1), cos(g1), sin(g2), cos(g2), ...], which is DiT4DiT's per-key
    layout: groups of 1 interleave [sin x0, cos x0, sin x1, ...] (LIBERO), GR1 has [7, 7, 6, 6, 3].
    The inverse (atan2) returns angles in (-pi, pi].
    """

    kind: ClassVar[str] = "sincos"
    groups: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.groups is not None:
            groups = tuple(int(g) for g in self.groups)
            if not groups or min(groups) < 1:
                raise ValueError(f"sincos groups {list(groups)}: expected sizes >= 1")
            object.__setattr__(self, "groups", groups)

    def _splits(self, width: int) -> list[int]:
        return np.cumsum(self.groups or (width,))[:-1].tolist()

    def forward(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        parts = np.split(x, self._splits(x.shape[-1]), axis=-1)
        return np.concatenate([f(p) for p in parts for f in (np.sin, np.cos)], axis=-1)

    def inverse(self, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, np.float64)
        sizes = self.groups or (y.shape[-1] // 2,)
        pairs = np.split(y, np.cumsum([2 * g for g in sizes])[:-1].tolist(), axis=-1)
        return np.concatenate([np.arctan2(p[..., : g], p[..., g:]) for p, g in zip(pairs, sizes)], axis=-1)

    def out_dim(self, in_dim: int) -> int:
        if self.groups is not None and sum(self.groups) != in_dim:
            raise ValueError(f"sincos groups {list(self.groups)} sum to {sum(self.groups)}, the vector has {in_dim} dims")
        return 2 * in_dim

    def forward_mask(self, mask: np.ndarray) -> np.ndarray:
        parts = np.split(mask, self._splits(len(mask)))
        return np.concatenate([p for p in parts for _ in range(2)])

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind} | ({"groups": list(self.groups)} if self.groups is not None else {})


@dataclass(frozen=True, eq=False)
class Binarize(Step):
    """On/off dims (grippers) -> 1.0 above ``threshold``, else 0.0 (exactly at it: 1.0 if
    ``inclusive``). Model outputs are always binarized on the way back; robot values on the way in
    only if ``encode`` (DiT4DiT: RoboTwin grippers both ways with x > 0.5; the LIBERO client only
    its outputs, with a >= 0.5). Not invertible: the robot gets 0.0 / 1.0."""

    kind: ClassVar[str] = "binarize"
    dims: tuple[int, ...]
    threshold: float = 0.5
    inclusive: bool = False
    encode: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", _index_tuple(self.dims, "binarize dims"))

    def _apply(self, x: np.ndarray) -> np.ndarray:
        x = np.array(x, np.float64)
        d = list(self.dims)
        on = x[..., d] >= self.threshold if self.inclusive else x[..., d] > self.threshold
        x[..., d] = on.astype(np.float64)
        return x

    def forward(self, x: np.ndarray) -> np.ndarray:
        return self._apply(x) if self.encode else np.asarray(x, np.float64)

    def inverse(self, y: np.ndarray) -> np.ndarray:
        return self._apply(y)

    def out_dim(self, in_dim: int) -> int:
        _check_dims(self.dims, in_dim, "binarize dims")
        return in_dim

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "dims": list(self.dims), "threshold": self.threshold,
                "inclusive": self.inclusive, "encode": self.encode}


@dataclass(frozen=True, eq=False)
class Reorder(Step):
    """y = x[..., perm]: the robot's dim order -> the model's (DiT4DiT's RoboTwin model order is
    [left 6, right 6, left gripper, right gripper], the dataset's [left 6, left gripper, right 6,
    right gripper]); the inverse puts model outputs back in the robot's order."""

    kind: ClassVar[str] = "reorder"
    perm: tuple[int, ...]

    def __post_init__(self) -> None:
        perm = tuple(int(i) for i in self.perm)
        if sorted(perm) != list(range(len(perm))):
            raise ValueError(f"reorder perm {list(perm)}: expected a permutation of 0..{len(perm) - 1}")
        object.__setattr__(self, "perm", perm)

    def forward(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, np.float64)[..., list(self.perm)]

    def inverse(self, y: np.ndarray) -> np.ndarray:
        return np.asarray(y, np.float64)[..., np.argsort(self.perm).tolist()]

    def out_dim(self, in_dim: int) -> int:
        if len(self.perm) != in_dim:
            raise ValueError(f"reorder perm has {len(self.perm)} entries, the vector has {in_dim} dims")
        return in_dim

    def forward_mask(self, mask: np.ndarray) -> np.ndarray:
        return mask[list(self.perm)]

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "perm": list(self.perm)}


@dataclass(frozen=True, eq=False)
class Pad(Step):
    """Zero-pad ``real`` dims to ``width`` (mixed embodiments share one padded width)."""

    kind: ClassVar[str] = "pad"
    real: int
    width: int

    def __post_init__(self) -> None:
        if self.width < self.real:
            raise ValueError(f"cannot pad {self.real} dims to {self.width}: it is narrower")

    def forward(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        if x.shape[-1] != self.real:
            raise ValueError(f"pad: last axis is {x.shape[-1]}, expected {self.real}")
        pad = np.zeros(x.shape[:-1] + (self.width - self.real,))
        return np.concatenate([x, pad], axis=-1)

    def inverse(self, y: np.ndarray) -> np.ndarray:
        return np.asarray(y, np.float64)[..., : self.real]

    def out_dim(self, in_dim: int) -> int:
        return self.width

    def forward_mask(self, mask: np.ndarray) -> np.ndarray:
        return np.concatenate([mask, np.zeros(self.width - self.real, dtype=bool)])

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "real": self.real, "width": self.width}


STEPS: dict[str, type[Step]] = {cls.kind: cls for cls in (Normalize, SinCos, Binarize, Reorder, Pad)}


def step_from_config(config: dict[str, Any], stats: FeatureStats) -> Step:
    kind = config.get("kind")
    cls = STEPS.get(kind)
    if cls is None:
        raise ValueError(f"unknown vector step {kind!r} (known: {sorted(STEPS)})")
    kwargs = {k: v for k, v in config.items() if k != "kind"}
    if cls is Normalize:
        kwargs["stats"] = stats
    return cls(**kwargs)


class VectorPipeline:
    """Steps applied in order forward, in reverse order backward, on a feature of ``in_dim`` dims."""

    def __init__(self, steps: Sequence[Step], in_dim: int) -> None:
        self.steps = list(steps)
        self.in_dim = int(in_dim)
        dim = self.in_dim
        for s in self.steps:
            dim = s.out_dim(dim)
        self.out_dim = dim

    def _check(self, x: np.ndarray, dim: int, what: str) -> np.ndarray:
        x = np.asarray(x)
        if x.shape[-1:] != (dim,):
            raise ValueError(f"{what}: last axis is {x.shape[-1:] or 'scalar'}, expected {dim}")
        return x

    def forward(self, x: np.ndarray) -> np.ndarray:
        x = self._check(x, self.in_dim, "forward")
        for s in self.steps:
            x = s.forward(x)
        return x

    def inverse(self, y: np.ndarray) -> np.ndarray:
        y = self._check(y, self.out_dim, "inverse")
        for s in reversed(self.steps):
            y = s.inverse(y)
        return y

    def mask(self) -> np.ndarray:
        """(out_dim,) bool: True where an output dim carries data (False on padding)."""
        m = np.ones(self.in_dim, dtype=bool)
        for s in self.steps:
            m = s.forward_mask(m)
        return m

    def find(self, cls: type[Step]) -> Step | None:
        return next((s for s in self.steps if isinstance(s, cls)), None)

    def to_config(self) -> list[dict[str, Any]]:
        return [s.to_config() for s in self.steps]

    @classmethod
    def from_config(cls, config: list[dict[str, Any]], stats: FeatureStats) -> VectorPipeline:
        return cls([step_from_config(c, stats) for c in config], stats.dim)

    def __repr__(self) -> str:
        names = " -> ".join(repr(s) for s in self.steps) or "identity"
        return f"VectorPipeline({self.in_dim} -> {self.out_dim}: {names})"


class TooNarrowError(DiT4DiTError, ValueError):
    """A padded width below the encoded width of feature ``name`` (the caller says which setting
    is at fault: the run config's, or an imported checkpoint's)."""

    def __init__(self, name: str, in_dim: int, encoded: int, width: int) -> None:
        super().__init__(f"{name}: cannot pad {encoded} encoded dims ({in_dim} raw) to {width}")
        self.name, self.in_dim, self.encoded, self.width = name, in_dim, encoded, width


def padded(steps: Sequence[Step], in_dim: int, width: int | None, name: str) -> VectorPipeline:
    """``steps``, then zero padding up to ``width`` (None: no padding, the encoded width)."""
    encoded = VectorPipeline(steps, in_dim).out_dim
    width = encoded if width is None else width
    if width < encoded:
        raise TooNarrowError(name, in_dim, encoded, width)
    return VectorPipeline([*steps, Pad(encoded, width)] if width > encoded else steps, in_dim)
