"""transforms/: statistics, vector steps, view tiling, observation parsing, and PolicyIO round trips."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dit4dit_npu.transforms import (
    FeatureStats,
    Normalize,
    Pad,
    PolicyInputError,
    PolicyIO,
    PolicyIOError,
    SinCos,
    VectorPipeline,
    merge_stats,
)
from dit4dit_npu.transforms.images import grid_shape, resize_rgb, tile_views, untile


def _stats(seed: int = 0, n: int = 500, d: int = 5) -> tuple[FeatureStats, np.ndarray]:
    x = np.random.default_rng(seed).normal(size=(n, d)) * np.arange(1, d + 1) + 3.0
    return FeatureStats.from_data(x), x


# ---------------------------------------------------------------- statistics


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
    bounds = merge_stats([FeatureStats.from_data(a), FeatureStats.from_data(b)])  # no data: bounds
    assert (bounds.q99 >= np.maximum(FeatureStats.from_data(a).q99, FeatureStats.from_data(b).q99)).all()


def test_stats_round_trip_bit_exact() -> None:
    st, _ = _stats()
    back = FeatureStats.from_dict(json.loads(json.dumps(st.to_dict())))
    assert back == st
    for f in ("min", "max", "mean", "std", "q01", "q99"):
        assert np.array_equal(getattr(back, f), getattr(st, f))
    with pytest.raises(ValueError, match="lack"):
        FeatureStats.from_dict({"min": [0]})


# ---------------------------------------------------------------- vector steps


@pytest.mark.parametrize("mode", ["min_max", "mean_std", "q99"])
def test_normalize_inverts_exactly(mode: str) -> None:
    st, x = _stats()
    step = Normalize(mode, st)
    y = step.forward(x)
    np.testing.assert_allclose(step.inverse(y), x, rtol=0, atol=1e-12)
    if mode == "min_max":
        assert np.isclose(y.min(0), -1).all() and np.isclose(y.max(0), 1).all()
    if mode == "mean_std":
        np.testing.assert_allclose(y.mean(0), 0, atol=1e-12)
        np.testing.assert_allclose(y.std(0), 1, atol=1e-12)
    with pytest.raises(ValueError, match="normalization mode"):
        Normalize("sincos", st)


def test_degenerate_dims_map_to_zero_and_back_to_the_constant() -> None:
    x = np.random.default_rng(1).normal(size=(100, 4))
    x[:, 2] = 0.75  # constant joint (e.g. an unused gripper)
    st = FeatureStats.from_data(x)
    for mode in ("min_max", "mean_std", "q99"):
        step = Normalize(mode, st)
        y = step.forward(x)
        assert np.isfinite(y).all() and (y[:, 2] == 0).all()
        assert np.allclose(step.inverse(np.random.default_rng(2).normal(size=(10, 4)))[:, 2], 0.75)
        assert step.degenerate_dims == [2]


def test_sincos_pad_and_mask() -> None:
    st, x = _stats(d=3)
    pipe = VectorPipeline([SinCos(), Pad(6, 8)], 3)
    y = pipe.forward(x[:4])
    assert y.shape == (4, 8) and pipe.out_dim == 8 and (y[:, 6:] == 0).all()
    np.testing.assert_allclose(y[:, :6], np.concatenate([np.sin(x[:4]), np.cos(x[:4])], -1))
    np.testing.assert_allclose(pipe.inverse(y), np.arctan2(np.sin(x[:4]), np.cos(x[:4])))  # wraps to (-pi, pi]
    assert pipe.mask().tolist() == [True] * 6 + [False] * 2
    with pytest.raises(ValueError, match="narrower"):
        Pad(6, 4)
    with pytest.raises(ValueError, match="expected 3"):
        pipe.forward(np.zeros((2, 5)))


def test_pipeline_config_round_trip_rebuilds_with_the_stats() -> None:
    st, x = _stats(d=4)
    pipe = VectorPipeline([Normalize("q99", st), Pad(4, 7)], 4)
    back = VectorPipeline.from_config(json.loads(json.dumps(pipe.to_config())), st)
    assert np.array_equal(back.forward(x), pipe.forward(x)) and back.out_dim == 7
    with pytest.raises(ValueError, match="unknown vector step"):
        VectorPipeline.from_config([{"kind": "rotate"}], st)


# ---------------------------------------------------------------- images


def _views(v: int, h: int = 2, w: int = 3) -> np.ndarray:
    # view i is filled with the value i + 1, so its position in the tiled frame is readable
    x = np.arange(1, v + 1, dtype=np.uint8).reshape(1, v, 1, 1, 1)
    return np.broadcast_to(x, (4, v, h, w, 3)).copy()


def test_width_and_height_layouts() -> None:
    out = tile_views(_views(3), "width")
    assert out.shape == (4, 3, 2, 9)
    for i in range(3):
        assert (out[..., :, 3 * i : 3 * (i + 1)] == i + 1).all()
    out = tile_views(_views(3), "height")
    assert out.shape == (4, 3, 6, 3)
    for i in range(3):
        assert (out[..., 2 * i : 2 * (i + 1), :] == i + 1).all()


def test_grid_layout_is_near_square_and_blank_fills() -> None:
    assert [grid_shape(n, "grid") for n in (3, 4, 5)] == [(2, 2), (2, 2), (2, 3)]
    out = tile_views(_views(3), "grid")
    assert out.shape == (4, 3, 4, 6)
    assert (out[..., :2, :3] == 1).all() and (out[..., :2, 3:] == 2).all()
    assert (out[..., 2:, :3] == 3).all() and (out[..., 2:, 3:] == 0).all()
    with pytest.raises(ValueError, match="view_layout"):
        grid_shape(2, "diagonal")


def test_tiling_keeps_channels_separate_and_untiles() -> None:
    x = np.random.default_rng(0).integers(0, 255, (2, 4, 4, 3), dtype=np.uint8)  # 2 views of 4x4
    out = tile_views(x, "width")
    assert np.array_equal(out[:, :, :4], x[0].transpose(2, 0, 1))
    assert np.array_equal(out[:, :, 4:], x[1].transpose(2, 0, 1))
    assert np.array_equal(untile(out), np.concatenate([x[0], x[1]], axis=1))


def test_resize_keeps_size_and_rejects_non_images() -> None:
    img = np.random.default_rng(0).integers(0, 255, (30, 40, 3), dtype=np.uint8)
    assert resize_rgb(img, (30, 40)) is img
    assert resize_rgb(img, (15, 20)).shape == (15, 20, 3)
    with pytest.raises(ValueError, match="uint8"):
        resize_rgb(img.astype(np.float32), (15, 20))


# ---------------------------------------------------------------- PolicyIO


def make_io(state_norm: str = "min_max", max_state_dim: int | None = None, max_action_dim: int | None = 9,
            state_dim: int = 5, action_dim: int = 6) -> PolicyIO:
    s, _ = _stats(1, d=state_dim)
    a, _ = _stats(2, d=action_dim)
    return PolicyIO.build(
        camera_keys=["cam_a", "cam_b"], image_size=(16, 16), view_layout="width", clip_offsets=[0, 2, 4],
        chunk_length=4, state_stats=s, action_stats=a, state_norm=state_norm, action_norm="min_max",
        max_state_dim=max_state_dim, max_action_dim=max_action_dim, source_sizes={"cam_a": [[32, 32]]},
    )


@pytest.mark.parametrize("state_norm,width", [("min_max", 5), ("mean_std", 5), ("sincos", 10), ("none", 5)])
def test_spec_widths_come_from_the_pipelines(state_norm: str, width: int) -> None:
    io = make_io(state_norm)
    spec = io.spec
    assert (spec.state_width, spec.action_width, spec.chunk_length, spec.num_frames) == (width, 9, 4, 3)
    assert spec.frame_size == (16, 32)
    padded = make_io(state_norm, max_state_dim=12)
    assert padded.spec.state_width == 12 and padded.encode_state(np.zeros(5)).shape == (12,)


def test_encoded_state_wider_than_its_max_is_one_clear_error() -> None:
    with pytest.raises(PolicyIOError, match="max_state_dim is 6 but the encoded state has 10 dims"):
        make_io("sincos", max_state_dim=6)


def test_sample_to_model_and_predicted_actions_back_is_exact() -> None:
    io = make_io("sincos", max_state_dim=12)
    rng = np.random.default_rng(5)
    views = rng.integers(0, 255, (3, 2, 16, 16, 3), dtype=np.uint8)
    state = rng.normal(size=5).astype(np.float32)
    actions = rng.normal(size=(4, 6)).astype(np.float32)
    s = io.encode_sample(views, state, actions, "stack")
    assert s["frames"].shape == (3, 3, 16, 32) and s["frames"].dtype == torch.uint8
    assert s["action"].shape == (4, 9) and s["action_mask"][:, :6].all() and not s["action_mask"][:, 6:].any()
    assert (s["action"][:, 6:] == 0).all() and s["state"].dtype == torch.float32
    # robot -> model -> robot: exact in the pipeline's float64, within float32 rounding through
    # the model's float32 tensor
    np.testing.assert_array_equal(io.decode_actions(io.normalize_actions(actions)), actions)
    np.testing.assert_allclose(io.decode_actions(s["action"][None]), actions[None], rtol=0, atol=4e-7)


def test_observation_gives_the_training_frame_and_state() -> None:
    io = make_io()
    rng = np.random.default_rng(6)
    views = rng.integers(0, 255, (3, 2, 16, 16, 3), dtype=np.uint8)
    state = rng.normal(size=5)
    sample = io.encode_sample(views, state, np.zeros((4, 6)), "stack")
    obs = {"cam_a": views[0, 0], "cam_b": views[0, 1], "state": state, "prompt": "stack"}
    batch, batched = io.encode_observation(obs)
    assert not batched and batch.instruction == ["stack"]
    assert torch.equal(batch.frames[0, 0], sample["frames"][0]) and torch.equal(batch.state[0], sample["state"])
    batch.validate(io.spec, training=False)
    many = {"cam_a": views[:, 0], "cam_b": views[:, 1], "state": np.stack([state] * 3), "instruction": "stack"}
    b3, batched = io.encode_observation(many)
    assert batched and b3.frames.shape == (3, 1, 3, 16, 32) and b3.instruction == ["stack"] * 3


def test_bad_observations_are_one_clear_line() -> None:
    io = make_io()
    img = np.zeros((16, 16, 3), np.uint8)
    good = {"cam_a": img, "cam_b": img, "state": np.zeros(5), "instruction": "go"}
    cases = [
        ({k: v for k, v in good.items() if k != "cam_b"}, r"missing \['cam_b'\]"),
        ({**good, "extra": 1}, r"unexpected \['extra'\]"),
        ({**good, "cam_a": img.astype(np.float32)}, "scale \\[0, 1\\] floats"),
        ({**good, "cam_a": img.transpose(2, 0, 1)}, "channels-first"),
        ({**good, "cam_a": np.zeros((20, 40, 3), np.uint8)}, "aspect ratio"),
        ({**good, "state": np.zeros(4)}, r"expected shape \(5,\)"),
        ({**good, "state": [np.nan] * 5}, "NaN"),
        ({**good, "state": np.array(["0.5"] * 5)}, "state: expected numbers, got an array of dtype <U3"),  # was parsed
        ({**good, "state": np.zeros(5, "datetime64[s]")}, "state: expected numbers, got an array of dtype datetime64"),
        ({**good, "state": None}, "state: expected numbers"),
        ({**good, "instruction": ""}, "empty string"),
        ({**good, "cam_a": img[None]}, "same batch size"),
        ("not a dict", "must be a dict"),
    ]
    for obs, pattern in cases:
        with pytest.raises(PolicyInputError, match=pattern):
            io.encode_observation(obs)
    resized, _ = io.encode_observation({**good, "cam_a": np.zeros((32, 32, 3), np.uint8)})  # same aspect: ok
    assert resized.frames.shape[-2:] == (16, 32)


def test_serialized_and_reloaded_gives_identical_outputs(tmp_path: Path) -> None:
    io = make_io("sincos", max_state_dim=11)
    io.save(tmp_path / "io.json")
    back = PolicyIO.load(tmp_path / "io.json")
    assert back == io and back.spec == io.spec
    x = np.random.default_rng(7).normal(size=(2, 4, 9))
    assert np.array_equal(back.decode_actions(x), io.decode_actions(x))
    assert torch.equal(back.encode_state(np.ones(5)), io.encode_state(np.ones(5)))
    (tmp_path / "bad.json").write_text(json.dumps({"format": "dit4dit_npu.normalizer/1"}))
    with pytest.raises(PolicyIOError, match="bad.json: not a PolicyIO"):
        PolicyIO.load(tmp_path / "bad.json")
    d = io.to_dict()
    del d["stats"]
    with pytest.raises(PolicyIOError, match="malformed PolicyIO"):
        PolicyIO.from_dict(d)
