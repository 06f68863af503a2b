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
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dit4dit_client.chunking import ChunkExecutor, ChunkRequest

Infer = Callable[[dict[str, Any], ChunkRequest], np.ndarray]


def websocket_infer(client: Any, session: bool = True) -> Infer:
    """A ``WebsocketClientPolicy`` as the runner's ``infer``: RTC requests use the connection's
    server-side session (``session=True``: only the count executed travels) or send the rest of
    the previous chunk."""

    def infer(obs: dict[str, Any], req: ChunkRequest) -> np.ndarray:
        return np.asarray(client.infer(obs, rtc=req.rtc(session))["actions"])

    return infer


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
    ) -> None:
        if not control_hz > 0:
            raise ValueError(f"control_hz: expected > 0, got {control_hz}")
        self.infer, self.executor, self.period = infer, executor, 1.0 / control_hz
        self.get_observation, self.send_action = get_observation, send_action
        self.clock, self.sleep = clock, sleep

    def run(self, steps: int) -> RunStats:
        stats = RunStats()
        last: np.ndarray | None = None
        pending: tuple[concurrent.futures.Future, ChunkRequest] | None = None
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="inference") as pool:
            t0 = self.clock()
            for k in range(steps):
                if pending is not None and pending[0].done():
                    chunk = pending[0].result()  # an inference error stops the robot loop here
                    self.executor.receive(chunk, k)
                    stats.delays.append(k - pending[1].step)
                    stats.boundaries.append(k)
                    pending = None
                if self.executor.wants_request(k):
                    obs = self.get_observation()
                    req = self.executor.request(k)
                    pending = (pool.submit(self.infer, obs, req), req)
                action = self.executor.action(k)
                if action is None and last is None:
                    stats.idle += 1
                else:
                    if action is None:
                        stats.held += 1
                        action = last
                    self.send_action(action)
                    last = action
                stats.steps += 1
                due = t0 + (k + 1) * self.period
                now = self.clock()
                if now > due + self.period:
                    stats.late_ticks += 1
                self.sleep(max(0.0, due - now))
            if pending is not None:
                pending[0].cancel()
        return stats
