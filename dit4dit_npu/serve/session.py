"""Per-connection sessions: what real-time chunking needs to remember between a robot's requests.

A robot that executes chunk k while asking for chunk k+1 would otherwise resend the rest of chunk
k with every request. The server already sent it, so each connection keeps:

- ``chunk``: the last chunk sent on it (robot units, with the batch axis if the request had one),
  and ``chunk_id``, how many chunks it has been sent (the step counter a reply carries);
- ``latencies_s``: the server-side latency (queue + model call) of its last few requests, from
  which, with the robot's ``control_hz``, the inference delay can be estimated when a request
  does not state it.

An observation request asks for RTC with ``"rtc": {...}`` (``protocol.py`` has the wire format),
which the policy parses (``dit4dit_npu.policy.rtc.parse_rtc``: every RTC field's type and bound is
checked there, once). The session only fills in what needs its memory: ``executed`` (actions of
the last chunk executed when the observation was taken, counted in chunk ``chunk_id``: a request
about any other is refused, e.g. after a lost reply) becomes ``prev_chunk``, the rest of that
chunk; a missing ``inference_delay`` is estimated from its latencies and ``control_hz``
(remembered). The session is cleared by openpi's ``episode_start`` / ``episode_end`` and dropped
with its connection.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dit4dit_npu.policy.rtc import RTC_KEYS, RTCRequest  # noqa: F401 (RTC_KEYS: imported from here before)
from dit4dit_npu.serve.protocol import RequestError
from dit4dit_npu.transforms.observation import Observation

LATENCY_WINDOW = 5  # requests whose latency the delay estimate takes the maximum of (the paper's Q)


@dataclass
class Session:
    chunk: np.ndarray | None = None
    chunk_id: int = 0
    control_hz: float | None = None
    latencies_s: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    # the RTC fields of the request being answered, echoed in its reply (a connection's requests
    # are answered one at a time, so there is at most one)
    pending: dict[str, Any] | None = None
    # its rtc.control_hz: remembered only once it is answered (a refused request changes nothing)
    pending_hz: float | None = None

    def resolve(self, rtc: RTCRequest, observation: Observation) -> RTCRequest:
        """A parsed ``rtc`` field (``parse_rtc``) -> the policy's RTC request: ``executed`` resolved to
        the rest of this connection's last chunk (the policy's own units: not range-checked), a
        missing delay estimated. Raises ``RequestError`` naming the field."""
        self.pending, self.pending_hz = None, rtc.control_hz
        prev = rtc.prev_chunk if rtc.executed is None else self._rest(rtc.executed, rtc.chunk_id, observation)
        steps = int(np.shape(prev)[-2]) if np.ndim(prev) >= 2 else None
        delay = rtc.inference_delay if rtc.inference_delay is not None else self._estimated_delay(steps)
        self.pending = {"inference_delay": delay, "executed": rtc.executed, "prefix_steps": steps or 0}
        return replace(rtc, prev_chunk=prev, inference_delay=delay, own_chunk=rtc.executed is not None)

    def _rest(self, executed: Any, chunk_id: Any, observation: Observation) -> np.ndarray:
        if self.chunk is None:
            raise RequestError(
                "rtc.executed: this connection has no previous chunk (its first request, or a new episode): "
                "send this observation without rtc"
            )
        if chunk_id is not None and chunk_id != self.chunk_id:
            raise RequestError(
                f"rtc.chunk_id: {chunk_id!r} is not this connection's last chunk ({self.chunk_id}); "
                "executed must count actions of the last chunk received"
            )
        length = self.chunk.shape[-2]
        if isinstance(executed, bool) or not isinstance(executed, int | np.integer) or not 0 <= executed < length:
            raise RequestError(
                f"rtc.executed: expected an int 0 to {length - 1} (actions of the last chunk executed, at least "
                f"one left), got {executed!r:.40}"
            )
        batched_before = self.chunk.ndim == 3
        if batched_before != observation.batched or (batched_before and len(self.chunk) != observation.rows):
            rows = len(self.chunk) if batched_before else "no batch axis"
            raise RequestError(
                f"rtc.executed: the last chunk was for {rows} rows, this observation has "
                f"{observation.rows if observation.batched else 'no batch axis'}"
            )
        return self.chunk[..., int(executed) :, :]

    def _estimated_delay(self, prefix_steps: int | None) -> int:
        """ceil(max recent server latency x control rate): a floor on the robot's real delay (the
        network is not in it), capped at the prefix the robot still has."""
        hz = self.pending_hz if self.pending_hz is not None else self.control_hz
        if hz is None or not self.latencies_s:
            raise RequestError(
                "rtc.inference_delay: not given, and this connection has no rtc.control_hz (the robot's control "
                "rate) and measured latency to estimate it from"
            )
        delay = math.ceil(max(self.latencies_s) * hz - 1e-9)
        return min(delay, prefix_steps) if prefix_steps is not None else delay

    def forget_pending(self) -> None:
        """A new request: nothing of an earlier refused one is echoed or remembered."""
        self.pending, self.pending_hz = None, None

    def remember(self, chunk: np.ndarray, latency_s: float) -> int:
        """The chunk just sent (a copy: the reply's array is packed and forgotten) -> its id."""
        self.chunk = np.array(chunk, dtype=np.float32)
        self.chunk_id += 1
        if self.pending_hz is not None:
            self.control_hz, self.pending_hz = self.pending_hz, None
        self.latencies_s.append(latency_s)
        return self.chunk_id

    def reset(self) -> None:
        """A new episode: the previous chunk belongs to the old one."""
        self.chunk, self.pending, self.pending_hz = None, None, None
        self.latencies_s.clear()
