"""Real-time chunking (RTC): guided inpainting of a new action chunk onto the previous one.

Black, Galliker, Levine 2025, "Real-Time Execution of Action Chunking Flow Policies" (Alg. 1,
eq. 2-5). While chunk k+1 is computed the robot keeps executing chunk k, so the first ``d``
actions of the new chunk (the inference delay) are already decided, and the next ones should
stay close to what chunk k planned or the robot jerks at the boundary. RTC steers the Euler
sampler (Pi-GDM guidance) so the predicted clean chunk matches the previous chunk's remaining
actions Y where the prefix weights W say so:

    W_i = 1                                  i < d           (executed during inference: frozen)
    W_i = c_i (e^c_i - 1) / (e - 1)          d <= i < end    (soft: decays to 0)
    W_i = 0                                  i >= end        (the previous chunk has no plan there)
    c_i = (end - i) / (end - d + 1),         end = H - s     (H chunk length, s execution horizon)

Convention. Ours (``action_head.py``): x_t = (1 - t) a + t eps, velocity v = eps - a, Euler from
t = 1 (noise) to 0: x <- x - v / n. The paper's tau = 1 - t runs from 0 (noise) to 1 (clean) with
velocity a - eps = -v. So:

    clean estimate   A1 = x_t - t v(x_t)                (exact for the straight flow)
    guidance         g  = (dA1/dx_t)^T [W * (Y - A1)]   (a vector-Jacobian product through the head)
    weight           w  = min(beta, (1 - tau) / (tau r^2)),  r^2 = (1 - tau)^2 / (tau^2 + (1 - tau)^2)
                        = min(beta, (t^2 + (1 - t)^2) / (t (1 - t)))  in our t (beta at t = 0 or 1)
    guided velocity  v' = v - w g                       (the paper adds w g to its -v)

so an Euler step x <- x - v' / n moves A1 toward Y. Only the head is differentiated: the backbone
features (and the cross-attention K/V) are constants computed once without grad.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dit4dit_npu.errors import DiT4DiTError

DEFAULT_MAX_GUIDANCE = 5.0  # the paper's beta


class GuidanceError(DiT4DiTError, ValueError):
    """A guidance request that does not fit the call (one line naming the field)."""


def prefix_weights(chunk_length: int, delay: int, end: int) -> torch.Tensor:
    """The paper's soft prefix weights W (chunk_length,), float32: 1 on the ``delay`` frozen steps,
    exponentially decaying to 0 at ``end`` (= H - s), 0 from there on. Needs 0 <= delay <= end <= H."""
    if not 0 <= delay <= end <= chunk_length:
        raise GuidanceError(f"prefix weights: need 0 <= delay ({delay}) <= end ({end}) <= chunk length ({chunk_length})")
    w = torch.zeros(chunk_length, dtype=torch.float64)
    w[:delay] = 1.0
    i = torch.arange(delay, end, dtype=torch.float64)
    c = (end - i) / (end - delay + 1)
    w[delay:end] = c * torch.expm1(c) / (math.e - 1)
    return w.float()


def guidance_scale(t: float, max_weight: float) -> float:
    """min(beta, (1 - tau) / (tau r^2)) at our t = 1 - tau; the bound diverges at both ends."""
    if t <= 0.0 or t >= 1.0:
        return max_weight
    return min(max_weight, (t * t + (1 - t) * (1 - t)) / (t * (1 - t)))


@dataclass(frozen=True)
class PrefixGuidance:
    """What the sampler is pulled toward, in the model's normalized, padded action space.

    ``target`` Y (B, H, A): the previous chunk's actions still to come, aligned with the new
    chunk (anything where the weight is 0). ``weights`` (B, H, A): the prefix weights of each row
    times the real-action-dims mask (padding dims are never guided). ``max_weight``: beta."""

    target: torch.Tensor
    weights: torch.Tensor
    max_weight: float = DEFAULT_MAX_GUIDANCE

    def checked(self, shape: tuple[int, int, int], device: torch.device) -> PrefixGuidance | None:
        """On ``device`` in float32 for a call producing chunks of ``shape``; None when no weight is
        non-zero (the call is then plain sampling, bit for bit)."""
        for name, value in (("target", self.target), ("weights", self.weights)):
            if tuple(value.shape) != tuple(shape):
                raise GuidanceError(f"guidance.{name}: expected shape {tuple(shape)}, got {tuple(value.shape)}")
            if not torch.isfinite(value).all():
                raise GuidanceError(f"guidance.{name}: contains NaN or inf")
        if not self.max_weight >= 0:
            raise GuidanceError(f"guidance.max_weight: expected >= 0, got {self.max_weight}")
        if not bool((self.weights != 0).any()) or self.max_weight == 0:
            return None
        f32 = dict(device=device, dtype=torch.float32)
        return PrefixGuidance(self.target.to(**f32), self.weights.to(**f32), float(self.max_weight))


def guided_velocity(
    velocity: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, t: float, guidance: PrefixGuidance
) -> torch.Tensor:
    """v' = v(x) - w(t) g at noise level ``t`` (see the module docstring): one forward through the
    head with autograd on for ``x`` alone, one vector-Jacobian product. Returns a detached tensor."""
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        v = velocity(x)
        clean = x - t * v
        error = guidance.weights * (guidance.target - clean.detach())
        (g,) = torch.autograd.grad(clean, x, grad_outputs=error)
    return v.detach() - guidance_scale(t, guidance.max_weight) * g
