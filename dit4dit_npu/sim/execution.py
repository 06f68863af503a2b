"""How the eval executes chunks: the merging mode, an artificial inference delay, and the jerk the
robot feels where one chunk hands over to the next.

The simulation does not run in real time, so the delay is simulated on the control clock: the
chunk for the observation of step k is computed at once but may be used only from step
k + d on, d = ceil(delay x 50 Hz); meanwhile the robot executes what the mode says
(``dit4dit_client.ChunkExecutor``, the same code a real robot runs: sync pauses, async and RTC keep
executing the old chunk, temporal ensembling averages). So a run is deterministic and its
inference delay is exactly the one asked for, whatever the machine.

Jerk: the third difference of the executed arm-joint targets, |a_k - 3 a_{k-1} + 3 a_{k-2} -
a_{k-3}| x fps^3 (rad/s^3, the 12 arm joints: the grippers are open/close commands). At a chunk
boundary b (the first step executed from a newly arrived chunk) the three third differences that
straddle the switch from a_{b-1} to a_b are its jerk; the boundary jerk of an episode is the mean
of their maxima over its hand-overs (the first chunk, which starts the robot from rest, is not
one), the interior jerk the mean over every other step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from dit4dit_client import MODES, delay_steps

from dit4dit_npu.sim.errors import SimError
from dit4dit_npu.sim.tasks import ARM_DIMS, FPS


@dataclass(frozen=True)
class Execution:
    mode: str = "sync"  # dit4dit_client.MODES
    delay_ms: float = 0.0  # artificial inference delay
    fps: int = FPS  # the scene's control rate, which turns the delay into steps (ALOHA's by default)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SimError(f"--execution: expected one of {list(MODES)}, got {self.mode!r}")
        if not 0 <= self.delay_ms < 60_000:
            raise SimError(f"--delay-ms: expected 0 to 60000, got {self.delay_ms:g}")

    @property
    def delay_steps(self) -> int:
        return delay_steps(self.delay_ms / 1e3, self.fps)


def jerk(actions: np.ndarray, dims: tuple[int, ...] = ARM_DIMS, fps: int = FPS) -> np.ndarray:
    """(T, D) executed actions -> (T,) jerk of the joint targets ``dims`` (ALOHA's 12 arm joints:
    rad/s^3); the first three steps are 0 (undefined)."""
    a = np.asarray(actions, np.float64)[:, list(dims)]
    out = np.zeros(len(a))
    if len(a) > 3:
        out[3:] = np.linalg.norm(np.diff(a, n=3, axis=0), axis=1) * fps**3
    return out


def boundary_jerk(
    actions: np.ndarray, boundaries: list[int], dims: tuple[int, ...] = ARM_DIMS, fps: int = FPS
) -> dict[str, float | int | None]:
    """Mean jerk at chunk boundaries (each: the max over the 3 differences that straddle it) and
    away from them. Boundaries closer than 3 steps to the start have no defined jerk and are left out.
    No ``dims`` (actions that are not joint targets, e.g. Meta-World's hand displacements): no jerk."""
    j = jerk(actions, dims, fps)
    t = len(j)
    at = [b for b in boundaries if 3 <= b < t]
    if not dims:
        return {"boundaries": len(at), "boundary_jerk": None, "interior_jerk": None}
    near = np.zeros(t, bool)
    for b in at:
        near[b : b + 3] = True
    peaks = [j[b : b + 3].max() for b in at]
    inside = j[3:][~near[3:]]
    return {
        "boundaries": len(at),
        "boundary_jerk": round(float(np.mean(peaks)), 2) if peaks else None,
        "interior_jerk": round(float(inside.mean()), 2) if len(inside) else None,
    }
