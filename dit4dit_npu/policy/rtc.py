"""Real-time chunking at the policy: every RTC input is parsed here, once, and the previous chunk
in robot units becomes the model's guidance.

A robot that executes chunk k while chunk k+1 is computed asks for chunk k+1 with

- ``prev_chunk`` (L, action_dim) robot units: chunk k's actions not yet executed when the new
  observation was taken, aligned with the new chunk (``prev_chunk[i]`` is due at its step i);
  1 <= L <= H, the chunk length. With a batch: (B, L, action_dim).
- ``inference_delay`` d: how many of them execute before the new chunk arrives (they are
  frozen: weight 1); 0 <= d <= L. An int, or one per row.
- ``execution_horizon`` s (optional): the paper's s, actions executed from a chunk before the
  next is requested; the new chunk follows ``prev_chunk`` on its steps [0, H - s), with the soft
  weights decaying to 0 at H - s. Default H - L: all of ``prev_chunk``. Needs d <= H - s <= L.

- ``max_guidance_weight`` beta, in [0, ``MAX_GUIDANCE_LIMIT``] (default the paper's 5).

A server's request carries them in its ``rtc`` field (``RTC_KEYS``), where ``executed`` may stand
for ``prev_chunk`` (the rest of the last chunk that connection was sent) and ``control_hz`` lets
the server estimate a missing delay: ``parse_rtc`` checks that field on its own, and the server
only fills in what needs its connection's memory (``prev_chunk`` from ``executed``, the delay
estimate) before the policy's ``with_rtc`` calls ``chunk_prefix`` with the observation's rows.

The paper's math is in ``models/rtc.py``; this module checks a request (one line naming the
argument, as for any other bad input) and moves it into the model's normalized, padded space
with the policy's own PolicyIO. Requests that arrive together (the server) are padded to H and
concatenated, so rows of different lengths and delays share one model call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dit4dit_npu.models.rtc import DEFAULT_MAX_GUIDANCE, PrefixGuidance, prefix_weights
from dit4dit_npu.transforms.observation import PolicyInputError

# The guidance strength (the paper's beta, default 5) and the robot's control rate have stated
# bounds: beyond them a value is a unit or typing mistake, never a setting.
MAX_GUIDANCE_LIMIT = 100.0  # 20x the paper's beta: more only copies prev_chunk harder (1e30 overflows)
# A robot's control loop that takes action chunks runs at tens to hundreds of Hz; a rate above
# this is a unit mistake (Hz for a period in us?) and would make the delay estimate absurd.
MAX_CONTROL_HZ = 1000.0
# The fields of a server request's ``rtc`` (docs/serving.md has their table).
RTC_KEYS = (
    "executed", "prev_chunk", "inference_delay", "execution_horizon", "max_guidance_weight", "control_hz", "chunk_id",
)


@dataclass(frozen=True)
class RTCRequest:
    """One request's real-time chunking inputs (see the module docstring). From Python:
    ``prev_chunk`` and its settings; from a server request: ``parse_rtc``, after which the server
    resolves ``executed`` (counted in its chunk ``chunk_id``) into ``prev_chunk`` and a missing
    ``inference_delay`` from its latency and ``control_hz``. ``own_chunk``: ``prev_chunk`` is the
    rest of a chunk this policy returned, in its units by construction, so not range-checked."""

    prev_chunk: Any = None
    inference_delay: Any = 0
    execution_horizon: Any = None
    max_guidance_weight: Any = DEFAULT_MAX_GUIDANCE
    own_chunk: bool = False
    # a server request's own fields
    executed: Any = None
    chunk_id: Any = None
    control_hz: float | None = None


def parse_rtc(raw: Any) -> RTCRequest:
    """A server request's ``rtc`` field -> an ``RTCRequest`` (``inference_delay`` None when left
    out: the server estimates it). Checks what the field says on its own: its keys, one of
    ``executed`` / ``prev_chunk``, ``control_hz``'s bounds; the rest is checked with the
    observation (``chunk_prefix``). Raises ``PolicyInputError`` naming ``rtc.<field>``."""
    if not isinstance(raw, dict):
        raise PolicyInputError(f"rtc: expected a dict with some of {list(RTC_KEYS)}, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in RTC_KEYS)
    if unknown:
        raise PolicyInputError(f"rtc: unknown key(s) {unknown}; expected some of {list(RTC_KEYS)}")
    if ("executed" in raw) == ("prev_chunk" in raw):
        raise PolicyInputError("rtc: give exactly one of executed (this connection's last chunk) or prev_chunk")
    hz = raw.get("control_hz")
    if hz is not None and (isinstance(hz, bool) or not isinstance(hz, int | float) or not 0 < hz <= MAX_CONTROL_HZ):
        raise PolicyInputError(
            f"rtc.control_hz: expected the robot's control rate in Hz, > 0 and at most {MAX_CONTROL_HZ:g} "
            f"(the inference delay is estimated as latency x rate; faster loops than that do not take "
            f"action chunks), got {hz!r:.40}"
        )
    return RTCRequest(
        prev_chunk=raw.get("prev_chunk"), inference_delay=raw.get("inference_delay"),
        execution_horizon=raw.get("execution_horizon"),
        max_guidance_weight=raw.get("max_guidance_weight", DEFAULT_MAX_GUIDANCE),
        executed=raw.get("executed"), chunk_id=raw.get("chunk_id"), control_hz=None if hz is None else float(hz),
    )


@dataclass(frozen=True)
class ChunkPrefix:
    """A checked RTC request for B rows, padded to the chunk length H (robot units)."""

    actions: np.ndarray  # float64 (B, H, action_dim); rows past a row's prefix are copies of its last action
    weights: np.ndarray  # float32 (B, H): the paper's soft prefix weights per row
    max_guidance_weight: float = DEFAULT_MAX_GUIDANCE

    @property
    def rows(self) -> int:
        return len(self.actions)

    def to_guidance(self, io: Any) -> PrefixGuidance:
        """-> the model's guidance: actions normalized and padded by the policy's PolicyIO,
        weights on the real action dims only."""
        with np.errstate(over="ignore", invalid="ignore"):  # said below, naming the input
            normalized = io.normalize_actions(self.actions).astype(np.float32)
        if not np.isfinite(normalized).all():  # finite in float64, not once normalized in float32 (3e38)
            raise PolicyInputError(
                f"prev_chunk: values up to {float(np.abs(self.actions).max()):.4g} overflow float32 once normalized "
                "by the training action range; send prev_chunk in the robot units the policy was trained on"
            )
        target = torch.from_numpy(normalized)
        mask = torch.from_numpy(io.action_mask.astype(np.float32))
        weights = torch.from_numpy(self.weights)[:, :, None] * mask
        return PrefixGuidance(target, weights, self.max_guidance_weight)


def chunk_prefix(
    prev_chunk: Any,
    inference_delay: Any,
    execution_horizon: Any = None,
    *,
    chunk_length: int,
    action_dim: int,
    rows: int,
    batched: bool,
    max_guidance_weight: Any = DEFAULT_MAX_GUIDANCE,
) -> ChunkPrefix:
    """Check one RTC request's guidance strength, shapes and steps for an observation of ``rows``
    rows (``batched``: it had a batch axis). Raises ``PolicyInputError`` with one line naming the
    argument. The policy's ``with_rtc`` calls it and then checks the values against the training
    range."""
    beta = max_guidance_weight
    if isinstance(beta, bool | np.bool_) or not isinstance(beta, int | float | np.floating | np.integer) or not (
        0 <= beta <= MAX_GUIDANCE_LIMIT
    ):
        raise PolicyInputError(
            f"max_guidance_weight: expected a number in [0, {MAX_GUIDANCE_LIMIT:g}] (the paper's beta, default "
            f"{DEFAULT_MAX_GUIDANCE:g}; larger values only make the new chunk copy prev_chunk harder, and huge "
            f"ones overflow the guidance step), got {max_guidance_weight!r:.40}"
        )
    try:
        chunk = np.asarray(prev_chunk, dtype=np.float64)
    except (TypeError, ValueError):
        raise PolicyInputError(f"prev_chunk: expected numbers, got {type(prev_chunk).__name__}") from None
    want = f"(B={rows}, L, {action_dim})" if batched else f"(L, {action_dim})"
    if chunk.ndim != (3 if batched else 2) or chunk.shape[-1] != action_dim or (batched and len(chunk) != rows):
        raise PolicyInputError(
            f"prev_chunk: expected shape {want}, the previous chunk's actions still to execute, got {chunk.shape}"
        )
    chunk = chunk if batched else chunk[None]
    length = chunk.shape[1]
    if not 1 <= length <= chunk_length:
        raise PolicyInputError(f"prev_chunk: {length} steps, expected 1 to {chunk_length} (the chunk length)")
    if not np.isfinite(chunk).all():
        raise PolicyInputError("prev_chunk: contains NaN or inf")
    delays = _ints("inference_delay", inference_delay, rows)
    if (delays > length).any():
        raise PolicyInputError(
            f"inference_delay {int(delays.max())} exceeds the {length} steps of prev_chunk: the previous chunk "
            "would run out before the new one arrives (request earlier, or send more of it)"
        )
    horizons = np.full(rows, chunk_length - length) if execution_horizon is None else _ints(
        "execution_horizon", execution_horizon, rows
    )
    ends = chunk_length - horizons
    if ((ends > length) | (ends < delays)).any():
        raise PolicyInputError(
            f"execution_horizon: expected {chunk_length - length} to {chunk_length - int(delays.max())} "
            f"(chunk length {chunk_length} minus the steps of prev_chunk it follows, at least inference_delay), "
            f"got {execution_horizon}"
        )
    # pad with the last action (any finite value works: its weight is 0) so normalization sees robot values
    padded = np.concatenate([chunk, np.repeat(chunk[:, -1:], chunk_length - length, axis=1)], axis=1)
    weights = np.stack([prefix_weights(chunk_length, int(d), int(e)).numpy() for d, e in zip(delays, ends)])
    return ChunkPrefix(padded, weights, float(beta))


def concat_prefixes(parts: Sequence[ChunkPrefix]) -> ChunkPrefix:
    """Requests that share one model call (one guidance strength: it is part of the batching key)."""
    betas = {p.max_guidance_weight for p in parts}
    if len(betas) != 1:
        raise ValueError(f"prefixes of one call must share max_guidance_weight, got {sorted(betas)}")
    return ChunkPrefix(
        np.concatenate([p.actions for p in parts]), np.concatenate([p.weights for p in parts]), betas.pop()
    )


def _ints(name: str, value: Any, rows: int) -> np.ndarray:
    """An int >= 0, or one per row."""
    arr = np.asarray(value)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer) or arr.ndim > 1 or (
        arr.ndim == 1 and len(arr) != rows
    ):
        raise PolicyInputError(f"{name}: expected an int >= 0 (or {rows} of them, one per row), got {value!r:.60}")
    if (arr < 0).any():
        raise PolicyInputError(f"{name}: expected >= 0, got {value!r:.60}")
    return np.broadcast_to(arr, (rows,)).astype(np.int64)
