"""Held-out action MSE during training, in eval mode (the original scored in train mode, dropout on).

The same evenly spaced held-out samples at every eval, sharded over ranks, sums reduced across
ranks: the number does not depend on the world size, and curves from different evals compare.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def eval_indices(dataset_len: int, samples: int, rank: int, world_size: int) -> list[int]:
    """Evenly spaced indices over the held-out set (always the same set), this rank's share."""
    n = min(samples, dataset_len)
    spread = [round(i * (dataset_len - 1) / max(n - 1, 1)) for i in range(n)]
    return spread[rank::world_size]


def held_out_action_mse(
    model,
    dataset,
    *,
    samples: int,
    batch_size: int,
    seed: int,
    accelerator,
    make_batch: Callable[[Sequence[Any]], Any],
    targets: Callable[[Any], tuple[torch.Tensor, torch.Tensor]],
) -> dict[str, float]:
    """``{"val/action_mse": x}`` in normalized action units over real (unpadded) dims, or ``{}``
    when there is nothing to score (no held-out data, eval off, video-only training has no head).

    ``make_batch`` collates samples and moves them to the device; ``targets`` reads (action,
    mask) off a batch: both belong to the trainer, which owns the batch format.
    """
    if dataset is None or len(dataset) == 0 or samples <= 0 or model.action_model is None:
        return {}
    indices = eval_indices(len(dataset), samples, accelerator.process_index, accelerator.num_processes)
    was_training = model.training
    model.eval()
    sq = torch.zeros((), device=accelerator.device)
    cnt = torch.zeros((), device=accelerator.device)
    with torch.no_grad():
        for i in range(0, len(indices), batch_size):
            batch = make_batch([dataset[j] for j in indices[i : i + batch_size]])
            pred = model.predict_action(batch, seed=seed)
            action, mask = targets(batch)
            mask = mask.float()
            sq += ((pred.float() - action.float()) ** 2 * mask).sum()
            cnt += mask.sum()
    model.train(was_training)
    # Every rank reaches these collectives, also one whose share of indices is empty.
    sq, cnt = accelerator.reduce(sq, "sum"), accelerator.reduce(cnt, "sum")
    return {"val/action_mse": float(sq / cnt.clamp(min=1))}
