"""The robot-side loop: execute actions at the control rate while the next chunk is computed.

    from dit4dit_client import AsyncChunkRunner, ChunkExecutor, WebsocketClientPolicy, websocket_infer

    client = WebsocketClientPolicy("policy-host", 8000)
    meta = client.get_server_metadata()
    executor = ChunkExecutor("rtc", execution_horizon=meta["chunk_length"] // 2)
    runner = AsyncChunkRunner(websocket_infer(client), executor, control_hz=50,
                              get_observation=robot.observe, send_action=robot.command)
    stats = runner.run(steps=3000)

The control thread ticks at ``control_hz``: it hands a finished chunk to the executor, starts a
request when the executor wants one (the observation is taken at that tick, and inference runs on
a background thread), and sends the executor's action, or repeats the last one when there is
none (before the first chunk, while a ``sync`` request runs, or if a chunk ran out). The delay of
each request, in ticks from its observation to its chunk, is measured here and fed back through
the executor into the next request (RTC's ``inference_delay``).

Every run ends: each request runs on a daemon thread (a server that never answers cannot keep the
process alive at exit), and a request older than ``request_timeout_s`` stops the loop
(``ServerTimeoutError``), so ``run(steps)`` returns or raises within ``steps / control_hz`` plus the
request timeout. When the robot has to hold its last action because a chunk ran out before the
next arrived (async, ensemble, rtc: the delay exceeded what the chunk and ``execution_horizon``
leave), the run logs one warning with the numbers; ``RunStats.held`` counts the ticks.

``control_hz`` takes the policy server's bounds, (0, 1000] (``checks.MAX_CONTROL_HZ``): a faster
rate is refused (the loop would call ``send_action`` as fast as it spins). There is no lower bound
but > 0: every tick, the first included, ends by waiting out its period (1 / ``control_hz``
seconds), so a rate such as 1e-300 Hz is accepted and its first tick waits (practically) forever.
``run(steps)`` takes an int; the executor must be a ``ChunkExecutor`` and the functions callables;
bad arguments are one ``ArgumentError`` line naming the argument.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dit4dit_client.checks import check_control_hz, check_count
from dit4dit_client.chunking import ChunkExecutor, ChunkRequest
from dit4dit_client.errors import ArgumentError, ServerTimeoutError
from dit4dit_client.websocket_client import DEFAULT_REQUEST_TIMEOUT_S

Infer = Callable[[dict[str, Any], ChunkRequest], np.ndarray]
logger = logging.getLogger(__name__)
# The runner's own bound on a request waits this long past its timeout, so the client's error
# (which names the server) is the one raised when both would fire.
_GRACE_S = 1.0
# The longest single sleep of a tick; a longer period (a rate such as 1e-300 Hz, which the server's
# bounds accept) is waited out in sleeps of this length.
_LONGEST_SLEEP_S = 86400.0


def websocket_infer(client: Any, session: bool = True) -> Infer:
    """A ``WebsocketClientPolicy`` as the runner's ``infer``: RTC requests use the connection's
    server-side session (``session=True``: only the count executed travels) or send the rest of
    the previous chunk."""

    def infer(obs: dict[str, Any], req: ChunkRequest) -> np.ndarray:
        return np.asarray(client.infer(obs, rtc=req.rtc(session))["actions"])

    infer.request_timeout_s = client.request_timeout_s  # type: ignore[attr-defined]  # the runner's default
    return infer


class _InFlight:
    """One request computed on its own daemon thread (a pool's worker is joined at interpreter
    exit: a silent server would keep the process alive)."""

    def __init__(self, infer: Infer, obs: dict[str, Any], req: ChunkRequest, timeout_s: float) -> None:
        self.req, self.deadline = req, time.monotonic() + timeout_s + _GRACE_S
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(infer, obs, req), name="inference", daemon=True).start()

    def _run(self, infer: Infer, obs: dict[str, Any], req: ChunkRequest) -> None:
        try:
            self._result = infer(obs, req)
        except BaseException as e:  # handed to the control thread, which raises it
            self._error = e
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> bool:
        """Wait until it is done or its deadline passes; True if done."""
        return self._done.wait(max(0.0, self.deadline - time.monotonic()))

    def result(self) -> np.ndarray:
        if self._error is not None:
            raise self._error
        return self._result

    def overdue(self) -> bool:
        return not self.done() and time.monotonic() >= self.deadline

    def timeout(self, timeout_s: float) -> ServerTimeoutError:
        return ServerTimeoutError(
            f"AsyncChunkRunner: the request of control step {self.req.step} got no chunk within "
            f"request_timeout_s = {timeout_s:g} s"
        )


@dataclass
class RunStats:
    steps: int = 0
    idle: int = 0  # ticks before the first action (nothing sent)
    held: int = 0  # ticks with no new action (the last one sent again)
    late_ticks: int = 0  # ticks that started later than one period after their due time
    delays: list[int] = field(default_factory=list)  # measured, in ticks, per request
    boundaries: list[int] = field(default_factory=list)  # ticks at which a new chunk took over


class AsyncChunkRunner:
    def __init__(
        self,
        infer: Infer,
        executor: ChunkExecutor,
        control_hz: float,
        get_observation: Callable[[], dict[str, Any]],
        send_action: Callable[[np.ndarray], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        request_timeout_s: float | None = None,
    ) -> None:
        """``request_timeout_s``: how long one request may take before ``run`` raises (wall clock);
        default: the infer's own (``websocket_infer``: the client's, plus a second), else
        ``DEFAULT_REQUEST_TIMEOUT_S``."""
        if not isinstance(executor, ChunkExecutor):
            raise ArgumentError(f"AsyncChunkRunner: executor: expected a ChunkExecutor, got {type(executor).__name__}")
        for name, f in (("infer", infer), ("get_observation", get_observation), ("send_action", send_action),
                        ("clock", clock), ("sleep", sleep)):
            if not callable(f):
                raise ArgumentError(f"AsyncChunkRunner: {name}: expected a callable, got {type(f).__name__} {f!r:.40}")
        control_hz = check_control_hz(control_hz, "AsyncChunkRunner: control_hz")
        if request_timeout_s is None:
            request_timeout_s = getattr(infer, "request_timeout_s", DEFAULT_REQUEST_TIMEOUT_S)
        t = request_timeout_s
        if isinstance(t, bool) or not isinstance(t, int | float) or not (math.isfinite(t) and t > 0):
            raise ArgumentError(f"AsyncChunkRunner: request_timeout_s: expected a finite number of seconds > 0, got {t!r:.40}")
        self.infer, self.executor, self.period = infer, executor, 1.0 / control_hz
        self.control_hz, self.request_timeout_s = control_hz, float(request_timeout_s)
        self.get_observation, self.send_action = get_observation, send_action
        self.clock, self.sleep = clock, sleep

    def run(self, steps: int) -> RunStats:
        """Run ``steps`` control ticks. An inference error (a refused request, a lost server, a
        bad reply) stops the loop and is raised here; so is a request past ``request_timeout_s``.
        A request still computing after the last tick is waited for (within its timeout), so the
        client is free again when ``run`` returns."""
        steps = check_count(steps, "AsyncChunkRunner.run: steps", 0)
        stats = RunStats()
        last: np.ndarray | None = None
        pending: _InFlight | None = None
        chunk_len = 0  # of the newest chunk (for the hold warning)
        warned = False
        t0 = self.clock()
        for k in range(steps):
            if pending is not None and pending.done():
                chunk = pending.result()  # an inference error stops the robot loop here
                self.executor.receive(chunk, k)
                stats.delays.append(k - pending.req.step)
                stats.boundaries.append(k)
                chunk_len, pending = len(chunk), None
            if pending is not None and pending.overdue():
                raise pending.timeout(self.request_timeout_s)
            if self.executor.wants_request(k):
                obs = self.get_observation()
                req = self.executor.request(k)
                pending = _InFlight(self.infer, obs, req, self.request_timeout_s)
            action = self.executor.action(k)
            if action is None and last is None:
                stats.idle += 1
            else:
                if action is None:
                    stats.held += 1
                    action = last
                    if not warned and self.executor.mode != "sync":  # sync holds by design
                        warned = True
                        self._warn_hold(k, pending, chunk_len, stats)
                self.send_action(action)
                last = action
            stats.steps += 1
            due = t0 + (k + 1) * self.period
            now = self.clock()
            if now > due + self.period:
                stats.late_ticks += 1
            wait = max(0.0, due - now)
            while wait > _LONGEST_SLEEP_S:  # time.sleep overflows past ~292 years (1e-300 Hz: 1e300 s)
                self.sleep(_LONGEST_SLEEP_S)
                wait -= _LONGEST_SLEEP_S
            self.sleep(wait)
        if pending is not None:  # not needed any more, but the client must be free when we return
            if not pending.wait():
                raise pending.timeout(self.request_timeout_s)
            pending.result()  # its error (a lost server) is still news
        return stats

    def _warn_hold(self, k: int, pending: _InFlight | None, chunk_len: int, stats: RunStats) -> None:
        s = self.executor.execution_horizon
        left = chunk_len - min(chunk_len, s or chunk_len)
        since = f"since step {pending.req.step}" if pending is not None else "none"
        delay = max(stats.delays, default=0)
        logger.warning(
            "AsyncChunkRunner: holding the last action from control step %d: a chunk of %d actions ran out "
            "before the next arrived (request in flight: %s; measured delays up to %d ticks = %.0f ms at %g Hz, "
            "while execution_horizon %s leaves %d ticks); RunStats.held counts the held ticks. Request earlier "
            "(a smaller execution_horizon), lower control_hz or speed up the server",
            k, chunk_len, since, delay, delay * self.period * 1e3, self.control_hz, s, left,
        )
