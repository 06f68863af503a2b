"""The policy's request checks: a robot observation (and a real-time chunking request) -> a checked
``ParsedRequest``, refused or carrying its warning lines.

Apart from ``policy.py`` (loading the model and running it) because checking what a request may be
is its own job: the state's and ``prev_chunk``'s range against the training data, the RTC inputs
(parsed by ``rtc.py``) and the one opt-out (``allow_out_of_range``). ``DiT4DiTPolicy`` holds one
``RequestChecks`` built from its PolicyIO and manifest; its ``parse`` / ``with_rtc`` are these.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from dit4dit_npu.policy.contract import (
    ParsedRequest,
    PrevChunkOutOfRangeError,
    PrevChunkRangeWarning,
    StateOutOfRangeError,
    StateRangeWarning,
    range_problem,
)
from dit4dit_npu.policy.manifest import PolicyManifest
from dit4dit_npu.policy.rtc import MAX_GUIDANCE_LIMIT, RTCRequest, chunk_prefix
from dit4dit_npu.transforms.observation import Observation
from dit4dit_npu.transforms.policy_io import PolicyIO

__all__ = ["MAX_GUIDANCE_LIMIT", "RequestChecks"]  # MAX_GUIDANCE_LIMIT: imported from here before


class RequestChecks:
    """What a request may be, for one policy (its PolicyIO and the names in its manifest)."""

    def __init__(self, io: PolicyIO, manifest: PolicyManifest) -> None:
        self.io, self.manifest = io, manifest

    def parse(self, obs: Any, allow_out_of_range: bool = False) -> ParsedRequest:
        """A robot observation (ours or openpi's layout, single or batched) -> a checked request:
        images cropped and resized by the PolicyIO, the state range checked (refused, or with
        ``allow_out_of_range`` carried as a warning line). The one parse of an observation; one
        already parsed (an ``Observation``: offline evaluation feeds the dataset's views) has only
        its state range checked."""
        observation = obs if isinstance(obs, Observation) else self.io.parse_observation(obs)
        parsed = ParsedRequest(observation, allow_out_of_range=allow_out_of_range)
        problem = self.state_range_problem(observation.state)
        return parsed if problem is None else parsed.out_of_range(problem, StateOutOfRangeError, StateRangeWarning)

    def with_rtc(self, parsed: ParsedRequest, rtc: RTCRequest) -> ParsedRequest:
        """``parsed`` with real-time chunking onto ``rtc.prev_chunk``: checked by ``rtc.chunk_prefix``
        (shapes, delays, guidance strength) and range-checked against the training actions like the
        state, under the request's ``allow_out_of_range``, unless ``rtc.own_chunk``."""
        o = parsed.observation
        prefix = chunk_prefix(
            rtc.prev_chunk, rtc.inference_delay, rtc.execution_horizon, chunk_length=self.io.chunk_length,
            action_dim=self.io.action_dim, rows=o.rows, batched=o.batched, max_guidance_weight=rtc.max_guidance_weight,
        )
        parsed = replace(parsed, prefix=prefix)
        if rtc.own_chunk:
            return parsed
        names = list(self.manifest.data.action_names or [f"action[{j}]" for j in range(self.io.action_dim)])
        problem = range_problem("prev_chunk", self.io.stats["action"], prefix.actions, names,
                                "guidance would pull the new chunk there; check the robot's units (degrees for "
                                "radians?) and joint order")
        return parsed if problem is None else parsed.out_of_range(problem, PrevChunkOutOfRangeError,
                                                                  PrevChunkRangeWarning)

    def state_range_problem(self, state: np.ndarray) -> str | None:
        """One line naming the dims of a live state (robot units, (B, state_dim)) that lie far
        outside the training range, their values and ranges; None when it is plausible."""
        if not self.io.state_dim:
            return None
        names = self.manifest.data.state_names or [f"state[{j}]" for j in range(self.io.state_dim)]
        return range_problem("state", self.io.stats["state"], state, names,
                             "actions there are extrapolation; check the robot's units (degrees for radians?) and "
                             "joint order")
