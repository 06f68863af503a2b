"""An endless stream of micro-batches, and the data cursor a checkpoint saves.

A user error (bad data) raised in a DataLoader worker comes back as its own one-line message,
not torch's "Caught ... in DataLoader worker process" with the worker's traceback.

The cursor is what makes resume exact with prefetching workers: a DataLoader with workers has
already drawn indices past the batches the trainer consumed, so the sampler's own count is
ahead. We count the samples actually handed out since the current pass over the sampler began
and save ``sampler.state_dict(consumed)``; a resumed run starts its first pass at exactly that
sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from dit4dit_npu.errors import DiT4DiTError, unwrap_worker_error


class BatchStream:
    def __init__(self, dataset, sampler, batch_size: int, num_workers: int, seed: int, collate: Callable):
        self.sampler = sampler
        self.batch_size = batch_size
        self.loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=collate,
            num_workers=num_workers,
            drop_last=True,
            persistent_workers=False,
            # A private generator: creating an iterator must not draw from the global RNG, or a
            # resumed run's dropout/noise would shift by one draw (exact resume is tested bit for bit).
            generator=torch.Generator().manual_seed(seed),
        )
        self._iter: Iterator | None = None  # created at the first batch, after any resume
        self._consumed = 0  # samples handed out since the current iterator began

    def next(self) -> Any:
        try:
            return self._next()
        except DiT4DiTError as e:
            raise unwrap_worker_error(e) from None

    def _next(self) -> Any:
        if self._iter is None:
            self._iter, self._consumed = iter(self.loader), 0
        try:
            batch = next(self._iter)
        except StopIteration:  # the sampler has moved on to the next epoch by itself
            self._iter, self._consumed = iter(self.loader), 0
            batch = next(self._iter)
        self._consumed += self.batch_size
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The sampler position of the next sample the trainer will see (not the prefetched one)."""
        return self.sampler.state_dict(self._consumed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._iter is not None:
            raise RuntimeError("BatchStream.load_state_dict after batches were drawn")
        self.sampler.load_state_dict(state)
