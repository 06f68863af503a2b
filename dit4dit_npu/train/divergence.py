"""NaN forensics: a diverged run stops before anything is logged or saved, and says where to look.

A non-finite loss or non-finite weights stop every rank alike (all checks are collective). When
the first check after a resume (a log or a save) finds it, the checkpoint resumed from is the
likelier cause than training (a state that loads but diverges at once), and the line says so and
how to set that checkpoint aside.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dit4dit_npu.train import checkpoint as ckpt_io
from dit4dit_npu.train import distributed
from dit4dit_npu.train.errors import TrainingError


class DivergenceWatch:
    """Watches one run's losses and weights; ``resumed_from`` is set by a resume."""

    def __init__(self, accelerator, model, ema) -> None:
        self.accelerator, self.model, self.ema = accelerator, model, ema
        # The checkpoint this run resumed from, and the step of the first check (log or save)
        # after it: divergence found there points at the checkpoint rather than at the run.
        self.resumed_from: Path | None = None
        self._first_check: int | None = None

    def stop_if_nonfinite(self, nonfinite: torch.Tensor, step: int) -> None:
        """``nonfinite``: this rank's count of micro-batches with a non-finite loss, ever.
        Collective (every rank reaches it at the same steps): one diverged rank stops them all,
        before anything is logged or saved, so the last checkpoint stays the last good one."""
        suspect = self.suspect(step)
        if float(self.accelerator.reduce(nonfinite, "sum")) == 0:
            return
        where = f"non-finite loss at or before step {step}"
        if suspect is not None:
            raise TrainingError(f"{where}, {blame(suspect)}; stopping without saving (no checkpoint was changed)")
        raise TrainingError(
            f"{where}; stopping without saving (last valid checkpoint is kept; try a lower learning rate)"
        )

    def suspect(self, step: int) -> Path | None:
        """The checkpoint this run resumed from while the run is at its first check (a log or a
        save) since: divergence found there likelier comes from the checkpoint than from training."""
        if self.resumed_from is not None and self._first_check is None:
            self._first_check = step
        return self.resumed_from if self._first_check == step else None

    def nonfinite_state(self) -> str | None:
        """Where the trainable weights or the EMA hold NaN/inf, as a phrase, else None: a policy
        exported from them is refused by the loader, and a checkpoint of them only spreads the
        damage. Collective: every rank checks the EMA shard it owns; the weights are whole on
        every rank under ZeRO-1/2 (and gathered under ZeRO-3)."""
        model = distributed.unwrap(self.model)
        with distributed.gathered_parameters(self.accelerator, model):
            weights = nonfinite_names({n: p for n, p in model.named_parameters() if p.requires_grad})
        ema = nonfinite_names(self.ema.shadow) if self.ema is not None else []
        local = torch.tensor([float(len(weights)), float(len(ema))], device=self.accelerator.device)
        n_weights, n_ema = (int(v) for v in self.accelerator.reduce(local, "sum").tolist())
        if n_weights == 0 and n_ema == 0:
            return None
        parts = []
        if n_weights:
            parts.append(f"the trained weights ({len(weights)} tensor(s), e.g. {weights[0]!r})" if weights
                         else "the trained weights")
        if n_ema:
            parts.append(f"the EMA ({n_ema} tensor(s){f', e.g. {ema[0]!r}' if ema else ''})")
        return "non-finite values in " + " and in ".join(parts)


def blame(ckpt: Path) -> str:
    return (
        f"within the first steps after resuming from {ckpt}: that checkpoint is the likelier cause (a state that "
        f"loads but diverges at once); move it aside (e.g. to {ckpt.with_name(ckpt_io.DAMAGED + ckpt.name)}) to "
        "resume from the one before"
    )


def nonfinite_names(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Names of the tensors holding NaN/inf (one host sync for all of them)."""
    if not tensors:
        return []
    finite = torch.stack([torch.isfinite(t).all() for t in tensors.values()])
    names = list(tensors)
    return [names[i] for i in (~finite).nonzero().flatten().tolist()]
