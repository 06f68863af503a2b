"""``TrainClock``: a run's training seconds, and the wall-time budget and checkpoints they drive.

What counts (``trainer.max_train_time_s``, ``trainer.save_every_s``): the training loop's wall time
from its first step, i.e. the optimizer steps with their data loading (the batch stream's loader,
the latent cache's reads) and logging. What does not: start-up (imports, the accelerator), building
the data (statistics, a latent cache's checks) and the model (the prompt cache), resuming, the
held-out and closed-loop evaluations and the saves (each runs under ``paused()``). A resumed run
starts from the seconds its checkpoint recorded, so a budget spans all attempts of a run. The
clock reads the host's time: on an asynchronous device (NPU, CUDA) a step boundary may come a few
queued steps before the device finishes them; the count catches up at the next host sync (a log
row, an evaluation, a save).

Every rank must stop, and save, at the same step (a save is collective): with several ranks the
decision is taken on rank 0's clock, handed to every rank (one scalar broadcast per step, only when
a budget or a time checkpoint is set). With ``trainer.lr_schedule_clock=train_time`` the LR schedule
runs on that same count (``optim.schedule_position``), so every rank sets the same LR.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator


class TrainClock:
    def __init__(self, limit_s: float | None, every_s: float | None, now: Callable[[], float] = time.perf_counter):
        """``now``: the clock read (``time.perf_counter``; the tests' is a counter they move)."""
        self.limit_s, self.every_s, self._now = limit_s, every_s, now
        self._done = 0.0  # seconds trained before the clock last started (a checkpoint's included)
        self._since: float | None = None  # when it last started; None while stopped or paused
        self._next_mark = math.inf
        self.known = True  # False after resuming a checkpoint that does not record its seconds

    @property
    def enabled(self) -> bool:
        """Whether the loop has anything to decide by this clock."""
        return self.limit_s is not None or self.every_s is not None

    def restore(self, seconds: float | None) -> None:
        """Continue from a checkpoint's count (before ``start``); None: a checkpoint of a version
        that did not record it (the run's count is unknown from then on: nothing records it)."""
        self.known = seconds is not None
        self._done = 0.0 if seconds is None else float(seconds)

    def start(self) -> None:
        self._since = self._now()
        self._next_mark = self._mark_after(self._done)

    def stop(self) -> None:
        """The loop is over: the count stays where it is."""
        self._done, self._since = self.seconds, None

    @property
    def seconds(self) -> float:
        """Training seconds so far (frozen while paused)."""
        return self._done + (0.0 if self._since is None else self._now() - self._since)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time that is not training (an evaluation, a save); nests (an eval inside a save)."""
        if self._since is None:
            yield
            return
        self._done, self._since = self.seconds, None
        try:
            yield
        finally:
            self._since = self._now()

    def spent(self, seconds: float | None = None) -> bool:
        """Whether ``seconds`` (default: now) reach the budget."""
        s = self.seconds if seconds is None else seconds
        return self.limit_s is not None and s >= self.limit_s

    def crossed(self, seconds: float) -> tuple[bool, bool]:
        """At a step boundary with ``seconds`` trained (every rank passes rank 0's): (stop here,
        a time checkpoint here). A stop is a checkpoint too (the last one)."""
        stop = self.spent(seconds)
        mark = seconds >= self._next_mark
        if mark:
            self._next_mark = self._mark_after(seconds)
        return stop, stop or mark

    def _mark_after(self, seconds: float) -> float:
        """The first multiple of ``every_s`` above ``seconds`` (a resumed run's next one)."""
        if self.every_s is None:
            return math.inf
        return (math.floor(seconds / self.every_s) + 1) * self.every_s
