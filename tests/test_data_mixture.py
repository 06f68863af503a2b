"""Episode split and MixtureSampler: determinism, weights, rank sharding, exact resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dit4dit_npu.data.errors import DatasetError
from dit4dit_npu.data.mixture import MixtureSampler, split_episodes


def test_split_is_deterministic_and_disjoint() -> None:
    eps = list(range(20))
    train, val = split_episodes(eps, 0.25, seed=3)
    assert (train, val) == split_episodes(list(reversed(eps)), 0.25, seed=3)
    assert len(val) == 5 and set(train) | set(val) == set(eps) and not set(train) & set(val)
    assert split_episodes(eps, 0.25, seed=4) != (train, val)
    assert split_episodes(eps, 0.0) == (eps, [])
    assert len(split_episodes([0, 1, 2], 0.01)[1]) == 1  # a positive fraction keeps >= 1 val episode
    assert split_episodes([7], 0.5) == ([7], [])  # never leaves training empty
    assert split_episodes(eps, [3, 1]) == ([e for e in eps if e not in (1, 3)], [1, 3])
    with pytest.raises(DatasetError, match=r"\[42\] do not exist"):
        split_episodes(eps, [42])
    with pytest.raises(DatasetError, match="no training episodes"):
        split_episodes([0, 1], [0, 1])


def test_sampler_is_epoch_deterministic_and_covers_datasets() -> None:
    sizes = [30, 200]
    s = MixtureSampler(sizes, [1.0, 1.0], seed=5)
    assert s.total == 400  # max(size / weight) with normalised weights (dataset size ignored)
    e0 = list(s)
    assert s.epoch == 1
    e1 = list(s)
    assert e0 != e1 and e0 == list(MixtureSampler(sizes, [1.0, 1.0], seed=5))
    assert all(0 <= i < 230 for i in e0)
    # Weight, not size, sets the share; a small dataset cycles through permutations.
    small = [i for i in e0 if i < 30]
    assert 150 < len(small) < 250
    counts = np.bincount(small, minlength=30)
    assert counts.max() - counts.min() <= 1
    big = [i for i in e0 if i >= 30]
    assert len(set(big)) == len(big)  # fewer than 200 drawn: no repeats


def test_weights_and_zero_weight() -> None:
    s = MixtureSampler([100, 100], [3.0, 1.0], seed=0, num_samples=4000)
    share = np.mean(np.array(list(s)) < 100)
    assert abs(share - 0.75) < 0.03
    z = MixtureSampler([100, 0], [1.0, 0.0], seed=0)
    assert all(i < 100 for i in z)
    with pytest.raises(DatasetError, match="no samples"):
        MixtureSampler([100, 0], [1.0, 1.0])


def test_ranks_partition_the_global_sequence() -> None:
    sizes, w = [50, 13, 80], [1.0, 2.0, 0.5]
    world = 3
    samplers = [
        MixtureSampler(sizes, w, seed=1, rank=r, world_size=world, batch_size=2) for r in range(world)
    ]
    per_rank = [list(s) for s in samplers]
    assert len({len(p) for p in per_rank}) == 1 and samplers[0].total % world == 0
    glob = samplers[0].global_indices(0)
    interleaved = np.stack(per_rank, 1).reshape(-1)
    assert np.array_equal(interleaved, glob)  # disjoint positions, together exactly the epoch
    # The 13-frame dataset wraps its permutation ~25 times, yet no step (any 6 consecutive
    # positions = 3 ranks x batch 2) holds the same sample twice.
    assert ((glob >= 50) & (glob < 63)).sum() > 13 * 10
    for start in range(len(glob) - 6):
        assert len(set(glob[start : start + 6].tolist())) == 6


def test_cursor_resume_yields_exactly_the_remaining_indices() -> None:
    sizes, w = [40, 25], [1.0, 1.0]
    ref = MixtureSampler(sizes, w, seed=9, rank=1, world_size=2)
    ref.set_epoch(2)
    full = list(ref)
    a = MixtureSampler(sizes, w, seed=9, rank=1, world_size=2)
    a.set_epoch(2)
    it = iter(a)
    head = [next(it) for _ in range(11)]
    state = a.state_dict()
    b = MixtureSampler(sizes, w, seed=9, rank=1, world_size=2)
    b.load_state_dict(state)
    b.set_epoch(2)  # a trainer re-announcing the same epoch keeps the cursor
    rest = list(b)
    assert head + rest == full and len(b) == len(full)
    assert b.epoch == 3 and list(b) == list(
        MixtureSampler(sizes, w, seed=9, rank=1, world_size=2).rank_indices(3)
    )

    # With a prefetching loader: save what was *consumed*, not what was yielded.
    c = MixtureSampler(sizes, w, seed=9, rank=1, world_size=2)
    c.set_epoch(2)
    loader = torch.utils.data.DataLoader(list(range(65)), batch_size=4, sampler=c, num_workers=0)
    seen = []
    for n, batch in enumerate(loader):
        seen += batch.tolist()
        if n == 2:
            break
    d = MixtureSampler(sizes, w, seed=9, rank=1, world_size=2)
    d.load_state_dict(c.state_dict(consumed=len(seen)))
    assert seen + list(d) == full
    # Saving after a finished epoch points at the start of the next one.
    e = MixtureSampler(sizes, w, seed=9)
    list(e)
    assert e.state_dict()["epoch"] == 1 and e.state_dict()["position"] == 0


def test_resume_refuses_a_different_setup() -> None:
    s = MixtureSampler([10, 10], seed=1, world_size=2)
    with pytest.raises(ValueError, match="world_size"):
        MixtureSampler([10, 10], seed=1, world_size=4).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="sizes"):
        MixtureSampler([10, 11], seed=1, world_size=2).load_state_dict(s.state_dict())
