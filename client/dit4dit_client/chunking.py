"""Which action to execute at each control step when chunks arrive late: the four ways to merge.

A chunk policy answers an observation with H actions; inference takes d control steps. The robot
asks for the next chunk once it has executed ``execution_horizon`` s actions of the current one
(None: all of it), and keeps executing while it waits. ``ChunkExecutor`` is that bookkeeping on an integer clock of
control steps, shared by the real-time loop (``runtime.py``: wall clock, a background inference
thread) and the simulated one (``dit4dit_npu.sim``: an artificial delay), so both run the same
merging code:

- ``sync``: the robot stops (holds its last command) while a chunk is computed, then executes it
  from its first action. No stale actions, but a pause every chunk.
- ``async`` (naive): the robot keeps executing the old chunk; when the new one arrives d steps
  after its observation it switches to the new chunk's action d. The switch can jump.
- ``ensemble``: ACT's temporal ensembling: every chunk is placed at the step of its observation
  and each step executes the average of all chunks covering it, weights exp(-m i), i = 0 the
  oldest (ACT: m = 0.01).
- ``rtc``: as ``async``, but the request carries the old chunk's remaining actions and the
  expected delay, and the policy inpaints the new chunk onto them (real-time chunking; the
  server or ``DiT4DiTPolicy.predict_action(prev_chunk=..., inference_delay=...)`` does the
  guidance). The delay sent is the maximum of the recently measured ones (the paper's Q).

Every measured delay (steps from the observation to the chunk's arrival) is fed back into the
next request's ``inference_delay``. Counts of control steps are ints and control rates are
within the policy server's bounds (``checks.py``), refused where they are given
(``ArgumentError``, one line naming the argument). numpy only (robot side).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dit4dit_client.checks import check_control_hz, check_count
from dit4dit_client.errors import ArgumentError

MODES = ("sync", "async", "ensemble", "rtc")
ACT_ENSEMBLE_DECAY = 0.01  # ACT's m: exp(-m i) over the chunks covering a step, oldest first


@dataclass(frozen=True)
class ChunkRequest:
    """An observation taken at control step ``step`` and what the policy should know with it."""

    step: int
    executed: int | None  # actions of the current chunk executed by then (None: no chunk yet)
    inference_delay: int  # steps until the chunk is expected (max of recent measurements)
    prev_chunk: np.ndarray | None = None  # rtc: the current chunk's actions from ``step`` on

    def rtc(self, session: bool = False) -> dict[str, Any] | None:
        """The RTC fields of a policy call (None: a plain call). ``session``: the server keeps
        the previous chunk of this connection, so only the count executed is sent."""
        if self.prev_chunk is None:
            return None
        if session:
            return {"executed": self.executed, "inference_delay": self.inference_delay}
        return {"prev_chunk": self.prev_chunk, "inference_delay": self.inference_delay}


@dataclass
class ChunkExecutor:
    mode: str
    execution_horizon: int | None = None  # s: actions executed from a chunk before the next is requested; None: all
    ensemble_decay: float = ACT_ENSEMBLE_DECAY
    initial_delay: int = 0  # the delay assumed before any was measured
    delay_window: int = 5  # measured delays remembered (the max is sent)
    # filled as it runs
    boundaries: list[int] = field(default_factory=list)  # steps at which a newly arrived chunk took over
    delays: deque = field(init=False)
    _chunks: list[tuple[int, np.ndarray]] = field(default_factory=list, init=False)  # (start step, chunk)
    _in_flight: ChunkRequest | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ArgumentError(f"mode: expected one of {list(MODES)}, got {self.mode!r}")
        if self.execution_horizon is not None:
            self.execution_horizon = check_count(self.execution_horizon, "execution_horizon", 1, " (or None: whole chunks)")
        self.initial_delay = check_count(self.initial_delay, "initial_delay", 0)
        self.delay_window = check_count(self.delay_window, "delay_window", 1)
        d = self.ensemble_decay
        if isinstance(d, bool) or not isinstance(d, int | float) or not (math.isfinite(d) and d >= 0):
            raise ArgumentError(f"ensemble_decay: expected a finite number >= 0 (ACT: {ACT_ENSEMBLE_DECAY}), got {d!r:.40}")
        self.delays = deque(maxlen=self.delay_window)

    @property
    def waiting(self) -> bool:
        return self._in_flight is not None

    def wants_request(self, step: int) -> bool:
        """No request in flight, and no chunk yet or ``execution_horizon`` actions of the newest done."""
        check_count(step, "step", 0)
        if self._in_flight is not None:
            return False
        if not self._chunks:
            return True
        start, chunk = self._chunks[-1]
        return step - start >= min(len(chunk), self.execution_horizon or len(chunk))

    def request(self, step: int) -> ChunkRequest:
        """Mark a request for the observation of ``step`` as sent."""
        check_count(step, "step", 0)
        if self._in_flight is not None:
            raise RuntimeError("a chunk is already being computed: one request in flight at a time")
        delay = max(self.delays) if self.delays else self.initial_delay
        executed, rest = None, None
        if self._chunks:
            start, chunk = self._chunks[-1]
            executed = step - start
            if self.mode == "rtc" and executed < len(chunk):
                rest = chunk[executed:]
                delay = min(delay, len(rest))  # the prefix cannot freeze more than is left of it
        self._in_flight = ChunkRequest(step, executed, delay, rest)
        return self._in_flight

    def receive(self, chunk: np.ndarray, step: int) -> None:
        """The chunk for the request in flight, usable from control step ``step`` on. A chunk with
        NaN/inf is refused whole (ValueError): none of it may reach the robot."""
        check_count(step, "step", 0)
        req = self._in_flight
        if req is None:
            raise RuntimeError("received a chunk nobody asked for")
        chunk = np.asarray(chunk)
        if chunk.ndim != 2 or len(chunk) == 0:
            raise ValueError(f"chunk: expected (steps, action_dim) actions, got shape {chunk.shape}")
        if not np.isfinite(chunk).all():
            raise ValueError(f"chunk: {int((~np.isfinite(chunk)).sum())} NaN/inf value(s); refusing the whole chunk")
        self._in_flight = None
        self.delays.append(step - req.step)
        # sync: the robot waited, so the chunk starts where it arrives; else at its observation
        start = step if self.mode == "sync" else req.step
        self._chunks = [c for c in self._chunks if c[0] + len(c[1]) > step] if self.mode == "ensemble" else []
        self._chunks.append((start, chunk))
        self.boundaries.append(step)

    def action(self, step: int) -> np.ndarray | None:
        """The action for ``step``; None when there is none (before the first chunk, while a sync
        request is computed, or a chunk ran out before the next arrived): the robot holds."""
        check_count(step, "step", 0)
        if self.mode == "sync" and self._in_flight is not None:
            return None
        covering = [c[step - s] for s, c in self._chunks if 0 <= step - s < len(c)]  # oldest first
        if not covering:
            return None
        if self.mode != "ensemble":
            return covering[-1]
        w = np.exp(-self.ensemble_decay * np.arange(len(covering)))
        return np.tensordot(w / w.sum(), np.stack(covering), axes=1).astype(covering[0].dtype)


def delay_steps(delay_s: float, control_hz: float) -> int:
    """A latency in seconds -> the control steps that pass during it (a partial step counts)."""
    control_hz = check_control_hz(control_hz)
    if isinstance(delay_s, bool) or not isinstance(delay_s, int | float) or not (math.isfinite(delay_s) and delay_s >= 0):
        raise ArgumentError(f"delay_s: expected a finite latency in seconds >= 0, got {delay_s!r:.40}")
    return max(0, math.ceil(delay_s * control_hz - 1e-9))
