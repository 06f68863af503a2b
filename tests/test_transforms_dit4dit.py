"""DiT4DiT's data conventions as PolicyIO steps, on hand-computed cases (no original code needed):
interleaved / grouped sin-cos, min-max with a gripper mask and clipping, binary grippers, its
RoboTwin dim order, its LIBERO client's un-normalization, its bilinear resize."""

import math

import numpy as np
import pytest

from dit4dit_npu.transforms import FeatureStats, PolicyIO, PolicyIOError, VectorPipeline
from dit4dit_npu.transforms.images import resize_rgb, torch_bilinear_rgb
from dit4dit_npu.transforms.vector import Binarize, Normalize, Pad, Reorder, SinCos


def stats(lo, hi) -> FeatureStats:
    lo, hi = np.asarray(lo, float), np.asarray(hi, float)
    return FeatureStats(lo, hi, (lo + hi) / 2, (hi - lo) / 4, lo, hi, 10)


def test_sincos_interleaved_per_dim():
    s = SinCos(groups=(1, 1))
    y = s.forward(np.array([0.0, math.pi / 2]))
    np.testing.assert_allclose(y, [0.0, 1.0, 1.0, 0.0], atol=1e-15)  # [sin x0, cos x0, sin x1, cos x1]
    np.testing.assert_allclose(s.inverse(y), [0.0, math.pi / 2])
    assert s.forward_mask(np.array([True, False])).tolist() == [True, True, False, False]


def test_sincos_grouped_keys_and_default_layout():
    x = np.array([0.0, math.pi / 2, math.pi])
    grouped = SinCos(groups=(2, 1)).forward(x)  # [sin(k1 2), cos(k1 2), sin(k2), cos(k2)]
    np.testing.assert_allclose(grouped, [0, 1, 1, 0, 0, -1], atol=1e-15)
    np.testing.assert_allclose(SinCos().forward(x), [0, 1, 0, 1, 0, -1], atol=1e-15)  # sines then cosines
    np.testing.assert_allclose(SinCos(groups=(2, 1)).inverse(grouped), x)
    with pytest.raises(ValueError, match="sum to 3, the vector has 4"):
        VectorPipeline([SinCos(groups=(2, 1))], 4)


def test_min_max_with_mask_degenerate_dim_and_clip():
    # dims 0 and 2 normalized ([-1, 1] -> itself, a constant dim -> 0); dim 1 passes in robot units
    step = Normalize("min_max", stats([-1.0, 0.0, 0.25], [3.0, 2.0, 0.25]), dims=[0, 2], clip=True)
    np.testing.assert_allclose(step.forward(np.array([2.0, 7.0, 0.25])), [0.5, 7.0, 0.0])
    # inverse: clip the normalized dims to [-1, 1], then (y + 1) / 2 * (max - min) + min
    np.testing.assert_allclose(step.inverse(np.array([1.5, 0.3, 0.7])), [3.0, 0.3, 0.25])
    np.testing.assert_allclose(step.inverse(np.array([-0.5, -9.0, -3.0])), [0.0, -9.0, 0.25])
    assert step.degenerate_dims == [2]
    unclipped = Normalize("min_max", stats([-1.0], [3.0]))
    np.testing.assert_allclose(unclipped.inverse(np.array([1.5])), [4.0])


def test_binarize_threshold_conventions():
    x = np.array([0.49, 0.5, 0.51, 7.0])
    strict = Binarize(dims=(0, 1, 2), threshold=0.5)  # its dataset: x > 0.5
    np.testing.assert_array_equal(strict.forward(x), [0.0, 0.0, 1.0, 7.0])
    client = Binarize(dims=(0, 1, 2), inclusive=True, encode=False)  # its LIBERO client: 0 if a < 0.5 else 1
    np.testing.assert_array_equal(client.forward(x), x)  # robot values pass in untouched
    np.testing.assert_array_equal(client.inverse(x), [0.0, 1.0, 1.0, 7.0])
    with pytest.raises(ValueError, match="dim 4 does not exist"):
        VectorPipeline([Binarize(dims=(4,))], 4)


def test_robotwin_order():
    order = (0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 6, 13)  # robot [L6, Lg, R6, Rg] -> [L6, R6, Lg, Rg]
    robot = np.array([10, 11, 12, 13, 14, 15, 16, 20, 21, 22, 23, 24, 25, 26], float)
    model = Reorder(order).forward(robot)
    assert model.tolist() == [10, 11, 12, 13, 14, 15, 20, 21, 22, 23, 24, 25, 16, 26]
    np.testing.assert_array_equal(Reorder(order).inverse(model), robot)
    with pytest.raises(ValueError, match="permutation"):
        Reorder((0, 0, 1))


def test_libero_action_pipeline_is_its_client():
    """Its client on a normalized chunk a: clip to [-1, 1]; a[6] = 0 if a[6] < 0.5 else 1; then
    where(mask, 0.5 (a + 1)(max - min) + min, a). Hand numbers, dim 4 constant."""
    lo = np.array([-1.0, -2.0, 0.0, -0.5, 0.25, -1.0, 0.0])
    hi = np.array([1.0, 2.0, 4.0, 0.5, 0.25, 3.0, 1.0])
    pipe = VectorPipeline(
        [Normalize("min_max", stats(lo, hi), dims=range(6), clip=True), Binarize((6,), inclusive=True, encode=False),
         Pad(7, 8)],
        7,
    )
    a = np.array([[0.5, 1.7, -0.5, 0.0, 0.9, -3.0, 0.5, 123.0], [-1.2, 0.0, 1.0, -1.0, 0.0, 0.2, 0.4999, 0.0]])
    expect = np.array([[0.5, 2.0, 1.0, 0.0, 0.25, -1.0, 1.0], [-1.0, 0.0, 4.0, -0.5, 0.25, 1.4, 0.0]])
    np.testing.assert_allclose(pipe.inverse(a), expect)
    # on the way in the gripper passes raw (its dataset had no normalization mode for it)
    np.testing.assert_allclose(pipe.forward(expect[1])[6:], [0.0, 0.0])
    assert pipe.mask().tolist() == [True] * 7 + [False]


def test_steps_serialize_in_policy_io(tmp_path):
    st = stats(np.zeros(14), np.ones(14))
    order = (0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 6, 13)
    joints = [i for i in range(14) if i not in (6, 13)]
    pipe = VectorPipeline([Normalize("min_max", st, dims=joints), Binarize((6, 13)), Reorder(order), Pad(14, 16)], 14)
    io = PolicyIO.compose(["cam"], (32, 32), "width", [0, 1], 4, {"state": st, "action": st}, pipe, pipe,
                  resize_method="torch_bilinear")
    io.save(tmp_path / "io.json")
    back = PolicyIO.load(tmp_path / "io.json")
    assert back == io and back.resize_method == "torch_bilinear"
    x = np.linspace(0, 1, 14)
    np.testing.assert_array_equal(back.action.forward(x), io.action.forward(x))
    with pytest.raises(PolicyIOError, match="resize_method"):
        PolicyIO.compose(["cam"], (32, 32), "width", [0], 4, {"state": st, "action": st}, pipe, pipe, resize_method="area")


def test_torch_bilinear_resize_hand_values():
    """F.interpolate(bilinear, align_corners=False) of a 1 x 2 ramp [0, 255] to width 4: source
    x = (i + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25 (clamped) -> 0, 63.75, 191.25, 255."""
    img = np.zeros((1, 2, 3), np.uint8)
    img[0, 1] = 255
    out = torch_bilinear_rgb(img, (1, 4))
    assert out[0, :, 0].tolist() == [0, 64, 191, 255]
    assert resize_rgb(img, (1, 4), method="torch_bilinear").tolist() == out.tolist()
    assert resize_rgb(img, (1, 2), method="torch_bilinear") is img  # already at the size: untouched


def test_policy_io_resizes_live_images_with_its_method():
    st = stats(np.zeros(2), np.ones(2))
    pipe = VectorPipeline([Normalize("min_max", st)], 2)
    io = PolicyIO.compose(["cam"], (2, 4), "width", [0], 1, {"state": st, "action": st}, pipe, pipe,
                  resize_method="torch_bilinear")
    img = np.zeros((2, 2, 3), np.uint8)
    img[:, 1] = 255
    batch, batched = io.encode_observation({"cam": img, "state": np.zeros(2), "instruction": "go"})
    assert not batched and batch.frames.shape == (1, 1, 3, 2, 4)
    assert batch.frames[0, 0, 0, 1].tolist() == [0, 64, 191, 255]


# ---------------------------------------------------------------------------------------------
# datasets.vla_data conventions (transforms/encodings.py): each option changes what it should
# ---------------------------------------------------------------------------------------------


def client_unnormalize(a: np.ndarray, lo: np.ndarray, hi: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """DiT4DiT's clients (model2robocasa_interface.py): clip every dim, then un-normalize the masked."""
    a = np.clip(a, -1, 1)
    return np.where(mask, (a + 1) / 2 * (hi - lo) + lo, a)


def conv_io(state_parts=(), action_parts=(), **kw) -> PolicyIO:
    lo, hi = np.array([-1.0, -2.0, 0.0, 0.25]), np.array([1.0, 2.0, 4.0, 0.25])
    st = stats(lo, hi)
    return PolicyIO.build(camera_keys=["cam"], image_size=(32, 32), view_layout="width", clip_offsets=[0],
                          chunk_length=1, state_stats=st, action_stats=st, state_norm="min_max", action_norm="min_max",
                          state_parts=state_parts, action_parts=action_parts, warn=False, **kw)


RAW_LAST = [(3, "min_max"), (1, "none")]  # its statistics mask [T, T, T, F]: the last dim raw


def test_default_clip_all_is_the_clients_formula():
    """A raw (mask False) dim predicted at 1.07 / -1.89 comes back 1.0 / -1.0, as its clients give."""
    io = conv_io(action_parts=RAW_LAST, action_clip="all")
    a = np.array([[0.5, 1.7, -1.3, 1.07], [-0.2, 0.0, 1.0, -1.89]])
    lo, hi = io.stats["action"].min, io.stats["action"].max
    expect = client_unnormalize(a, lo, hi, np.array([True, True, True, False]))
    np.testing.assert_allclose(io.decode_actions(a), expect, rtol=1e-6)
    assert io.decode_actions(a)[:, 3].tolist() == [1.0, -1.0]


def test_clip_normalized_leaves_raw_dims_and_none_is_exact():
    a = np.array([[0.5, 1.7, -1.3, 1.07]])
    normalized_only = conv_io(action_parts=RAW_LAST, action_clip="normalized").decode_actions(a)
    np.testing.assert_allclose(normalized_only, [[0.5, 2.0, 0.0, 1.07]], rtol=1e-6)
    exact = conv_io(action_parts=RAW_LAST, action_clip="none")
    np.testing.assert_allclose(exact.decode_actions(a), [[0.5, 3.4, -0.6, 1.07]], rtol=1e-6)
    x = np.array([0.2, -1.0, 3.0, 0.7])
    np.testing.assert_allclose(exact.decode_actions(exact.normalize_actions(x)), x, rtol=1e-6)


def test_gripper_dims_and_threshold():
    a = np.array([[0.0, 0.0, 0.0, 0.55], [0.0, 0.0, 0.0, 0.45]])
    at_half = conv_io(action_parts=RAW_LAST, gripper_dims=[3], action_clip="all").decode_actions(a)
    assert at_half[:, 3].tolist() == [1.0, 0.0]
    higher = conv_io(action_parts=RAW_LAST, gripper_dims=[3], gripper_threshold=0.6).decode_actions(a)
    assert higher[:, 3].tolist() == [0.0, 0.0]
    # binary parts: thresholded both ways at the same threshold (its RoboTwin grippers, x > t)
    binary = conv_io(action_parts=[(3, "min_max"), (1, "binary")], gripper_threshold=0.6)
    assert binary.normalize_actions(np.array([0.0, 0.0, 0.0, 0.61]))[3] == 1.0
    assert binary.normalize_actions(np.array([0.0, 0.0, 0.0, 0.59]))[3] == 0.0


def test_state_parts_encode_each_key_its_own_way():
    x = np.array([0.0, math.pi / 2, 2.0, 0.9])
    whole = conv_io(state_parts=[(4, "sincos")])  # one key: all sines, then all cosines
    np.testing.assert_allclose(whole.encode_state(x).numpy(), np.r_[np.sin(x), np.cos(x)], atol=1e-7)
    per_dim = conv_io(state_parts=[(1, "sincos")] * 4)  # its LIBERO client: interleaved
    np.testing.assert_allclose(per_dim.encode_state(x).numpy(), np.stack([np.sin(x), np.cos(x)], -1).ravel(),
                               atol=1e-7)
    mixed = conv_io(state_parts=[(2, "sincos"), (1, "min_max"), (1, "binary")])
    y = mixed.encode_state(x).numpy()  # [sin k1, cos k1, min-max k2 (2.0 in [0, 4] -> 0), binary k3]
    np.testing.assert_allclose(y, [0, 1, 1, 0, 0.0, 1.0], atol=1e-7)
    assert mixed.state.out_dim == 6
    raw = conv_io(state_parts=[(4, "none")])
    np.testing.assert_allclose(raw.encode_state(x).numpy(), x, rtol=1e-6)


def test_dim_order_and_parts_that_do_not_fit():
    io = conv_io(state_parts=[(4, "none")], state_order=[3, 0, 1, 2], action_order=[1, 0, 2, 3], action_clip="all")
    np.testing.assert_allclose(io.encode_state(np.array([1.0, 2.0, 3.0, 4.0])).numpy(), [4, 1, 2, 3])
    np.testing.assert_allclose(io.decode_actions(np.array([1.0, -1.0, -1.0, 0.0])), [-1.0, 2.0, 0.0, 0.25])
    with pytest.raises(PolicyIOError, match=r"datasets.vla_data.state_parts: parts of \[3\] dims sum to 3, the vector has 4"):
        conv_io(state_parts=[(3, "sincos")])
    with pytest.raises(PolicyIOError, match="sincos is a state encoding"):
        conv_io(action_parts=[(4, "sincos")])


def test_clip_step_serializes():
    io = conv_io(action_parts=RAW_LAST, gripper_dims=[3], action_clip="all", state_parts=[(2, "sincos"), (2, "none")])
    back = PolicyIO.from_dict(io.to_dict())
    assert back == io and [s["kind"] for s in io.to_dict()["steps"][4]["vector"]] == ["normalize", "binarize", "clip"]
    assert io.to_dict()["steps"][3]["vector"][-1] == {"kind": "sincos", "groups": [2, 2], "keep": [1]}
    a = np.array([1.5, -0.3, 0.2, 0.49])
    np.testing.assert_array_equal(back.decode_actions(a), io.decode_actions(a))


def test_config_keys_are_validated_where_declared():
    from dit4dit_npu.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="action_parts"):
        load_config(None, ["datasets.vla_data.action_parts=[{size: 7, norm: sincos}]"])
    with pytest.raises(ConfigError, match="state_order"):
        load_config(None, ["datasets.vla_data.state_order=[0, 0, 1]"])
    cfg = load_config(None, ["datasets.vla_data.state_parts=[{size: 2, norm: sincos}, {size: 12}]",
                             "datasets.vla_data.action_clip=all"])
    assert cfg.datasets.vla_data.state_parts[1].norm is None and cfg.datasets.vla_data.action_clip == "all"
