"""Exponential moving average (EMA) of the trainable weights (``trainer.ema``).

After optimizer step ``s`` (1-based, the trainer's ``global_step``)::

    s <= start_step                         ema = w                      (a plain copy)
    s >  start_step and s % interval == 0   ema = decay * ema + (1 - decay) * w
    otherwise                               ema unchanged

so the average forgets the early weights, far from the final ones, and spans about
``interval / (1 - decay)`` steps. The shadow is fp32 whatever the parameters' dtype.

Which weights: every parameter with ``requires_grad`` (the transformer or its LoRA adapters, and
the action head); frozen ones never change, so the live value is their average. Under DeepSpeed
ZeRO-1/2 every rank holds the whole updated parameters in the module after the engine's step
(the optimizer state is what is partitioned), so each rank keeps the same average of the
module's parameters on its own device: no collective, and rank 0 writes it into the checkpoint.
ZeRO-3 partitions the parameters themselves; the trainer refuses EMA there.

``swapped()`` puts the average into the model (held-out eval, policy export) and restores the
live weights bit for bit afterwards: the optimizer's own fp32 copies are never touched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from dit4dit_npu.config import EMAConfig

EMA_FILE = "ema.safetensors"  # in each checkpoint folder, next to trainer_state.pt


class EMA:
    def __init__(self, model: nn.Module, cfg: EMAConfig) -> None:
        if cfg.decay is None:
            raise ValueError("EMA needs trainer.ema.decay (null means EMA is off)")
        self.decay, self.start_step, self.interval = float(cfg.decay), cfg.start_step, cfg.update_interval
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.shadow = {n: p.detach().float().clone() for n, p in self.params.items()}

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Fold the weights after optimizer step ``step`` into the average (see the module doc)."""
        if step <= self.start_step:
            for n, p in self.params.items():
                self.shadow[n].copy_(p.detach())
        elif step % self.interval == 0:
            # lerp_: ema + (1 - decay) * (w - ema), the same average in one fused op per tensor
            live = [p.detach().float() for p in self.params.values()]
            torch._foreach_lerp_(list(self.shadow.values()), live, 1.0 - self.decay)

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """The average in the model's parameters for the body; the live weights back afterwards,
        exactly (a copy is kept, nothing is recomputed)."""
        live = {n: p.detach().clone() for n, p in self.params.items()}
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(self.shadow[n])
        try:
            yield
        finally:
            with torch.no_grad():
                for n, p in self.params.items():
                    p.copy_(live[n])

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: t.detach().cpu().contiguous() for n, t in self.shadow.items()}

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        missing, unexpected = sorted(set(self.shadow) - set(sd)), sorted(set(sd) - set(self.shadow))
        if missing or unexpected:
            raise KeyError(
                f"EMA weights do not match the trainable parameters: {len(missing)} missing (e.g. {missing[:2]}), "
                f"{len(unexpected)} unexpected (e.g. {unexpected[:2]})"
            )
        for n, t in self.shadow.items():
            if sd[n].shape != t.shape:
                raise ValueError(f"EMA weight {n}: shape {tuple(sd[n].shape)} != parameter {tuple(t.shape)}")
            t.copy_(sd[n])

    def save(self, folder: Path) -> None:
        from safetensors.torch import save_file

        save_file(self.state_dict(), str(folder / EMA_FILE))

    def load(self, folder: Path) -> None:
        from safetensors.torch import load_file

        self.load_state_dict(load_file(str(folder / EMA_FILE)))
