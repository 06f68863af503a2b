"""Normalizer: exact inversion, degenerate dims, serialization, mixture statistics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dit4dit_npu.data.demo import demo_episode, write_demo_dataset
from dit4dit_npu.data.lerobot import LeRobotDataset
from dit4dit_npu.data.normalize import FeatureStats, Normalizer, compute_stats, merge_stats, pad_to


def _stats(seed: int = 0, n: int = 500, d: int = 5) -> tuple[FeatureStats, np.ndarray]:
    x = np.random.default_rng(seed).normal(size=(n, d)) * np.arange(1, d + 1) + 3.0
    return FeatureStats.from_data(x), x


@pytest.mark.parametrize("mode", ["min_max", "mean_std", "q99"])
def test_normalize_inverts_exactly_numpy_and_torch(mode: str) -> None:
    st, x = _stats()
    norm = Normalizer(st, st, action_mode=mode, state_mode=mode)
    y = norm.normalize_action(x)
    np.testing.assert_allclose(norm.unnormalize_action(y), x, rtol=0, atol=1e-12)
    if mode == "min_max":
        assert np.isclose(y.min(0), -1).all() and np.isclose(y.max(0), 1).all()
    if mode == "mean_std":
        np.testing.assert_allclose(y.mean(0), 0, atol=1e-12)
        np.testing.assert_allclose(y.std(0), 1, atol=1e-12)
    xt = torch.tensor(x, dtype=torch.float32).reshape(2, 250, 5)  # any leading dims
    yt = norm.normalize_action(xt)
    assert yt.dtype == torch.float32 and yt.shape == xt.shape
    np.testing.assert_allclose(yt.reshape(-1, 5).numpy(), y, atol=1e-5)
    torch.testing.assert_close(norm.unnormalize_action(yt), xt, rtol=0, atol=2e-5)
    x32 = x.astype(np.float32)
    assert norm.normalize_action(x32).dtype == np.float32
    with pytest.raises(ValueError, match="expected 5"):
        norm.normalize_action(np.zeros((3, 7)))


def test_degenerate_dims_map_to_zero_and_back_to_the_constant() -> None:
    x = np.random.default_rng(1).normal(size=(100, 4))
    x[:, 2] = 0.75  # constant joint (e.g. an unused gripper)
    st = FeatureStats.from_data(x)
    for mode in ("min_max", "mean_std", "q99"):
        with pytest.warns(UserWarning, match=r"dims \[2\] are constant"):
            norm = Normalizer(st, st, action_mode=mode, state_mode=mode)
        y = norm.normalize_action(x)
        assert np.isfinite(y).all() and (y[:, 2] == 0).all()
        back = norm.unnormalize_action(np.random.default_rng(2).normal(size=(10, 4)))
        assert np.allclose(back[:, 2], 0.75)
        assert norm.degenerate_action_dims == [2]
        assert np.isfinite(norm.encode_state(x)).all()


def test_state_encodings_and_padding() -> None:
    st, x = _stats(d=3)
    sincos = Normalizer(st, st, state_mode="sincos")
    enc = sincos.encode_state(x[:4])
    assert enc.shape == (4, 6) and sincos.encoded_state_dim == 6
    np.testing.assert_allclose(enc, np.concatenate([np.sin(x[:4]), np.cos(x[:4])], -1))
    np.testing.assert_array_equal(Normalizer(st, st, state_mode="none").encode_state(x[:4]), x[:4])
    padded = pad_to(enc, 8)
    assert padded.shape == (4, 8) and (padded[:, 6:] == 0).all() and padded.dtype == enc.dtype
    t = pad_to(torch.ones(2, 3), 5)
    assert t.shape == (2, 5) and t[:, 3:].abs().sum() == 0
    with pytest.raises(ValueError):
        pad_to(enc, 4)
    with pytest.raises(ValueError, match="action_norm"):
        Normalizer(st, st, action_mode="sincos")


def test_json_round_trip_is_exact(tmp_path: Path) -> None:
    st, x = _stats()
    norm = Normalizer(st, FeatureStats.from_data(x[:, :3] * 1e-3), "q99", "mean_std")
    back = Normalizer.from_json(norm.to_json())
    assert back == norm and back.to_dict() == norm.to_dict()
    for f in ("min", "max", "mean", "std", "q01", "q99"):
        assert np.array_equal(getattr(back.action_stats, f), getattr(st, f))  # bit-exact float64
    assert np.array_equal(back.normalize_action(x), norm.normalize_action(x))
    norm.save(tmp_path / "n.json")
    assert Normalizer.load(tmp_path / "n.json") == norm
    assert json.loads((tmp_path / "n.json").read_text())["action_mode"] == "q99"
    with pytest.raises(ValueError, match="not a dit4dit_npu normalizer"):
        Normalizer.from_dict({"format": "other"})


def test_merge_pools_exactly_and_recomputes_quantiles() -> None:
    a = np.random.default_rng(3).normal(0, 1, size=(300, 2))
    b = np.random.default_rng(4).normal(5, 3, size=(50, 2))
    whole = FeatureStats.from_data(np.concatenate([a, b]))
    merged = merge_stats([FeatureStats.from_data(a), FeatureStats.from_data(b)], np.concatenate([a, b]))
    for f in ("min", "max", "mean", "std", "q01", "q99"):
        np.testing.assert_allclose(getattr(merged, f), getattr(whole, f), rtol=1e-12, atol=1e-12)
    assert merged.count == 350
    averaged = (FeatureStats.from_data(a).q99 * 300 + FeatureStats.from_data(b).q99 * 50) / 350
    assert not np.allclose(merged.q99, averaged)  # the lerobot#4156 mistake is not made
    bounds = merge_stats(
        [FeatureStats.from_data(a), FeatureStats.from_data(b)]
    )  # no data: bounds, not averages
    assert (bounds.q99 >= np.maximum(FeatureStats.from_data(a).q99, FeatureStats.from_data(b).q99)).all()


def test_compute_stats_over_a_mixture_of_datasets(tmp_path: Path) -> None:
    r1 = write_demo_dataset(tmp_path / "a", num_episodes=3, episode_length=12, num_tasks=2, seed=0)
    r2 = write_demo_dataset(tmp_path / "b", "v3.0", num_episodes=4, episode_length=9, num_tasks=3, seed=7)
    d1, d2 = LeRobotDataset(r1), LeRobotDataset(r2)
    stats = compute_stats([d1, d2], ["action"], episodes=[[0, 2], None])
    acts = [demo_episode(e, 12, 2, 0).actions for e in (0, 2)] + [
        demo_episode(e, 9, 3, 7).actions for e in range(4)
    ]
    whole = FeatureStats.from_data(np.concatenate(acts))
    for f in ("min", "max", "mean", "std", "q01", "q99"):
        np.testing.assert_allclose(getattr(stats["action"], f), getattr(whole, f), rtol=1e-6, atol=1e-6)
    assert stats["action"].count == 2 * 12 + 4 * 9
