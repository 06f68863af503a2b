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

from dit4dit_npu.transforms.stats import FeatureStats

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


@dataclass(frozen=True, eq=False)
class Normalize(Step):
    """(x - center) / half: ``min_max`` and ``q99`` map [lo, hi] to [-1, 1], ``mean_std`` is a z-score.

    Not clipped, so the inverse is exact. Degenerate dims (see DEGENERATE_EPS) map to 0.
    """

    kind: ClassVar[str] = "normalize"
    mode: str
    stats: FeatureStats = field(repr=False)
    center: np.ndarray = field(init=False, repr=False)
    half: np.ndarray = field(init=False, repr=False)
    inv: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        s = self.stats
        if self.mode == "min_max":
            center, half = (s.min + s.max) / 2, (s.max - s.min) / 2
        elif self.mode == "q99":
            center, half = (s.q01 + s.q99) / 2, (s.q99 - s.q01) / 2
        elif self.mode == "mean_std":
            center, half = s.mean, s.std
        else:
            raise ValueError(f"normalization mode {self.mode!r}: expected one of {list(NORM_MODES)}")
        degenerate = half <= DEGENERATE_EPS / 2
        half = np.where(degenerate, 0.0, half)
        object.__setattr__(self, "center", center)
        object.__setattr__(self, "half", half)
        object.__setattr__(self, "inv", np.divide(1.0, half, out=np.zeros_like(half), where=~degenerate))

    @property
    def degenerate_dims(self) -> list[int]:
        return np.flatnonzero(self.inv == 0).tolist()

    def forward(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, np.float64) - self.center) * self.inv

    def inverse(self, y: np.ndarray) -> np.ndarray:
        return np.asarray(y, np.float64) * self.half + self.center

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "mode": self.mode}


@dataclass(frozen=True, eq=False)
class SinCos(Step):
    """[sin(x), cos(x)]: joint angles without the 2*pi wrap-around (the original's state input).

    Layout: all sines, then all cosines. The inverse (atan2) returns angles in (-pi, pi].
    """

    kind: ClassVar[str] = "sincos"

    def forward(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        return np.concatenate([np.sin(x), np.cos(x)], axis=-1)

    def inverse(self, y: np.ndarray) -> np.ndarray:
        d = y.shape[-1] // 2
        return np.arctan2(y[..., :d], y[..., d:])

    def out_dim(self, in_dim: int) -> int:
        return 2 * in_dim

    def forward_mask(self, mask: np.ndarray) -> np.ndarray:
        return np.concatenate([mask, mask])


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


STEPS: dict[str, type[Step]] = {cls.kind: cls for cls in (Normalize, SinCos, Pad)}


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
