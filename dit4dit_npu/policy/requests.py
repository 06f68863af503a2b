"""The policy's request checks: a robot observation (and a real-time chunking prefix) -> a checked
``ParsedRequest``, refused or carrying its warning lines.

Apart from ``policy.py`` (loading the model and running it) because checking what a request may be
is its own job: the state's and ``prev_chunk``'s range against the training data, the RTC
arguments' bounds and the one opt-out (``allow_out_of_range``). The server calls these per request
on arrival (``contract.py``); ``predict_action`` calls the same ones. Mixed into ``DiT4DiTPolicy``
(it provides ``io``, ``manifest``, ``chunk_length`` and ``action_dim``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from dit4dit_npu.models.rtc import DEFAULT_MAX_GUIDANCE
from dit4dit_npu.policy.contract import (
    OutOfRangeError,
    OutOfRangeWarning,
    ParsedRequest,
    PrevChunkOutOfRangeError,
    PrevChunkRangeWarning,
    StateOutOfRangeError,
    StateRangeWarning,
    range_problem,
)
from dit4dit_npu.policy.rtc import chunk_prefix
from dit4dit_npu.transforms.observation import PolicyInputError

# Real-time chunking's guidance strength (the paper's beta, default 5) and the robot's control
# rate have stated bounds: beyond them a value is a unit or typing mistake, never a setting.
MAX_GUIDANCE_LIMIT = 100.0  # 20x the paper's beta: more only copies prev_chunk harder (1e30 overflows)


class RequestChecks:
    """``parse`` / ``with_rtc`` / ``state_range_problem`` of ``DiT4DiTPolicy``."""

    io: Any
    manifest: Any
    chunk_length: int
    action_dim: int

    def parse(self, obs: Any, allow_out_of_range: bool = False) -> ParsedRequest:
        """A robot observation (ours or openpi's layout, single or batched) -> a checked request:
        images cropped and resized by the PolicyIO, the state range checked (refused, or with
        ``allow_out_of_range`` carried as a warning line). The one parse of an observation."""
        parsed = ParsedRequest(self.io.parse_observation(obs), allow_out_of_range=allow_out_of_range)
        problem = self.state_range_problem(parsed.observation.state)
        return parsed if problem is None else self._out_of_range(parsed, problem, StateOutOfRangeError,
                                                                 StateRangeWarning)

    def with_rtc(
        self,
        parsed: ParsedRequest,
        prev_chunk: Any,
        inference_delay: Any = 0,
        execution_horizon: Any = None,
        max_guidance_weight: Any = DEFAULT_MAX_GUIDANCE,
        own_chunk: bool = False,
    ) -> ParsedRequest:
        """``parsed`` with real-time chunking onto ``prev_chunk`` (see ``predict_action``): checked
        (shapes, delays, ``max_guidance_weight`` in [0, MAX_GUIDANCE_LIMIT]) and range-checked
        against the training actions like the state, under the request's ``allow_out_of_range``.
        ``own_chunk``: ``prev_chunk`` is the rest of a chunk this policy returned (a server's
        session): in its units by construction, so not range-checked."""
        beta = max_guidance_weight
        if isinstance(beta, bool | np.bool_) or not isinstance(beta, int | float | np.floating | np.integer) or not (
            0 <= beta <= MAX_GUIDANCE_LIMIT
        ):
            raise PolicyInputError(
                f"max_guidance_weight: expected a number in [0, {MAX_GUIDANCE_LIMIT:g}] (the paper's beta, default "
                f"{DEFAULT_MAX_GUIDANCE:g}; larger values only make the new chunk copy prev_chunk harder, and huge "
                f"ones overflow the guidance step), got {max_guidance_weight!r:.40}"
            )
        o = parsed.observation
        prefix = chunk_prefix(
            prev_chunk, inference_delay, execution_horizon, chunk_length=self.chunk_length, action_dim=self.action_dim,
            rows=o.rows, batched=o.batched, max_guidance_weight=float(beta),
        )
        parsed = replace(parsed, prefix=prefix)
        if own_chunk:
            return parsed
        names = list(self.manifest.data.action_names or [f"action[{j}]" for j in range(self.action_dim)])
        problem = range_problem("prev_chunk", self.io.stats["action"], prefix.actions, names,
                                "guidance would pull the new chunk there; check the robot's units (degrees for "
                                "radians?) and joint order")
        return parsed if problem is None else self._out_of_range(parsed, problem, PrevChunkOutOfRangeError,
                                                                 PrevChunkRangeWarning)

    @staticmethod
    def _out_of_range(parsed: ParsedRequest, problem: str, error: type[OutOfRangeError],
                      category: type[OutOfRangeWarning]) -> ParsedRequest:
        """The one opt-out: refuse, or carry the line as a warning of ``category``."""
        if not parsed.allow_out_of_range:
            raise error(problem)
        return parsed.allowed(problem, category)

    def state_range_problem(self, state: np.ndarray) -> str | None:
        """One line naming the dims of a live state (robot units, (B, state_dim)) that lie far
        outside the training range, their values and ranges; None when it is plausible."""
        if not self.io.state_dim:
            return None
        names = self.manifest.data.state_names or [f"state[{j}]" for j in range(self.io.state_dim)]
        return range_problem("state", self.io.stats["state"], state, names,
                             "actions there are extrapolation; check the robot's units (degrees for radians?) and "
                             "joint order")
