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
    io = PolicyIO(["cam"], (32, 32), "width", [0, 1], 4, {"state": st, "action": st}, pipe, pipe,
                  resize_method="torch_bilinear")
    io.save(tmp_path / "io.json")
    back = PolicyIO.load(tmp_path / "io.json")
    assert back == io and back.resize_method == "torch_bilinear"
    x = np.linspace(0, 1, 14)
    np.testing.assert_array_equal(back.action.forward(x), io.action.forward(x))
    with pytest.raises(PolicyIOError, match="resize_method"):
        PolicyIO(["cam"], (32, 32), "width", [0], 4, {"state": st, "action": st}, pipe, pipe, resize_method="area")


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
    io = PolicyIO(["cam"], (2, 4), "width", [0], 1, {"state": st, "action": st}, pipe, pipe,
                  resize_method="torch_bilinear")
    img = np.zeros((2, 2, 3), np.uint8)
    img[:, 1] = 255
    batch, batched = io.encode_observation({"cam": img, "state": np.zeros(2), "instruction": "go"})
    assert not batched and batch.frames.shape == (1, 1, 3, 2, 4)
    assert batch.frames[0, 0, 0, 1].tolist() == [0, 64, 191, 255]
