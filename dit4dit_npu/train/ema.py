"""Exponential moving average (EMA) of the trainable weights (``trainer.ema``).

After optimizer step ``s`` (1-based, the trainer's ``global_step``)::

    s <= start_step                         ema = w                      (a plain copy)
    s >  start_step and s % interval == 0   ema = decay * ema + (1 - decay) * w
    otherwise                               ema unchanged

so the average forgets the early weights, far from the final ones, and spans about
``interval / (1 - decay)`` steps. The shadow is fp32 whatever the parameters' dtype.

Which weights: every parameter with ``requires_grad`` (the transformer or its LoRA adapters, and
the action head); frozen ones never change, so the live value is their average.

Sharded like ZeRO-2's optimizer state: under DeepSpeed ZeRO-1/2 every rank holds the whole
updated parameters in the module after the engine's step, so each rank can average any of them
without communication, and averages only the ones it owns (whole tensors, dealt out by size:
1/world of the shadow per rank; at full size 8.3 GiB of fp32 on one card, ~1 GiB on each of 8).
Only the rare whole-average reads are collective: ``swapped()`` (every rank enters; each tensor is
broadcast from its owner) and ``full_state_dict()`` (rank 0 receives every shard for the
checkpoint). The checkpoint holds the whole average, so a resume on another world size deals it
out anew. ZeRO-3 partitions the parameters themselves; the trainer refuses EMA there.

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


def deal_out(sizes: dict[str, int], world: int) -> dict[str, int]:
    """Owner rank of each tensor: largest first, each to the least-loaded rank (deterministic, so
    every rank computes the same table)."""
    load = [0] * world
    owner = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        r = min(range(world), key=lambda i: (load[i], i))
        owner[name] = r
        load[r] += sizes[name]
    return owner


class EMA:
    def __init__(self, model: nn.Module, cfg: EMAConfig, rank: int = 0, world: int = 1) -> None:
        if cfg.decay is None:
            raise ValueError("EMA needs trainer.ema.decay (null means EMA is off)")
        self.decay, self.start_step, self.interval = float(cfg.decay), cfg.start_step, cfg.update_interval
        self.rank, self.world = rank, world
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.owner = deal_out({n: p.numel() for n, p in self.params.items()}, world)
        # this rank's shard of the average, fp32, on the parameters' device
        self.shadow = {n: p.detach().float().clone() for n, p in self.params.items() if self.owner[n] == rank}

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Fold the weights after optimizer step ``step`` into this rank's shard of the average
        (see the module doc); no communication."""
        if step <= self.start_step:
            for n, t in self.shadow.items():
                t.copy_(self.params[n].detach())
        elif step % self.interval == 0 and self.shadow:
            # lerp_: ema + (1 - decay) * (w - ema), the same average in one fused op per tensor
            live = [self.params[n].detach().float() for n in self.shadow]
            torch._foreach_lerp_(list(self.shadow.values()), live, 1.0 - self.decay)

    @torch.no_grad()
    def _whole(self, name: str) -> torch.Tensor:
        """The average of one tensor on every rank (collective when sharded: its owner sends)."""
        if self.world == 1:
            return self.shadow[name]
        import torch.distributed as dist

        p = self.params[name]
        buf = self.shadow[name] if self.owner[name] == self.rank else torch.empty(p.shape, dtype=torch.float32, device=p.device)
        dist.broadcast(buf, src=self.owner[name])
        return buf

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """The average in the model's parameters for the body; the live weights back afterwards,
        exactly (a host copy is kept, nothing is recomputed). Collective: every rank enters."""
        live = {n: p.detach().to("cpu", copy=True) for n, p in self.params.items()}
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(self._whole(n))
        try:
            yield
        finally:
            with torch.no_grad():
                for n, p in self.params.items():
                    p.copy_(live[n])

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The whole average on the CPU on rank 0 (None elsewhere). Collective: every rank enters."""
        out = {n: self._whole(n).detach().cpu().contiguous() for n in self.params}
        return out if self.rank == 0 else None

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """The whole average (a checkpoint's); this rank keeps its shard."""
        missing, unexpected = sorted(set(self.params) - set(sd)), sorted(set(sd) - set(self.params))
        if missing or unexpected:
            raise KeyError(
                f"EMA weights do not match the trainable parameters: {len(missing)} missing (e.g. {missing[:2]}), "
                f"{len(unexpected)} unexpected (e.g. {unexpected[:2]})"
            )
        for n, p in self.params.items():
            if sd[n].shape != p.shape:
                raise ValueError(f"EMA weight {n}: shape {tuple(sd[n].shape)} != parameter {tuple(p.shape)}")
        for n, t in self.shadow.items():
            t.copy_(sd[n])

    @staticmethod
    def save(state: dict[str, torch.Tensor], folder: Path) -> None:
        from safetensors.torch import save_file

        save_file(state, str(folder / EMA_FILE))

    def load(self, folder: Path) -> None:
        from safetensors.torch import load_file

        self.load_state_dict(load_file(str(folder / EMA_FILE)))


def averaged(ema: EMA | None):
    """The EMA weights in the model for the body (live weights restored exactly after), or
    nothing to do when EMA is off: what evaluation, the sim eval and the export see."""
    return ema.swapped() if ema is not None else contextlib.nullcontext()
