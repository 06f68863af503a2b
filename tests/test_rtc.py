"""Real-time chunking (models/rtc.py, policy/rtc.py): the paper's weights and guidance strength, the
vector-Jacobian product against an explicit Jacobian, exact no-op without a prefix, the frozen prefix
matched on a real head and on the real tiny policy, batching, no autograd state left behind, and
one-line errors for bad requests."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_models_action_head import ACTION, SMALL, STATE, _inputs

from dit4dit_npu.models import FlowMatchingActionHead
from dit4dit_npu.models.rtc import (
    GuidanceError,
    PrefixGuidance,
    guidance_scale,
    guided_velocity,
    prefix_weights,
)
from dit4dit_npu.policy.rtc import chunk_prefix
from dit4dit_npu.transforms.observation import PolicyInputError

B, H, A = 3, SMALL.chunk_length, ACTION


def test_prefix_weights_are_the_papers():
    # H = 8, d = 2, end = H - s = 6: ones on the delay, c_i (e^c_i - 1)/(e - 1) with
    # c_i = (end - i) / (end - d + 1) on [d, end), zeros after.
    w = prefix_weights(8, 2, 6).double()
    c = [(6 - i) / 5 for i in range(2, 6)]
    expected = [1.0, 1.0, *[ci * (math.exp(ci) - 1) / (math.e - 1) for ci in c], 0.0, 0.0]
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6)
    assert (w[2:6].diff() < 0).all()  # decays
    assert prefix_weights(8, 0, 0).count_nonzero() == 0
    assert prefix_weights(8, 3, 3).tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    with pytest.raises(GuidanceError, match="delay"):
        prefix_weights(8, 5, 4)


def test_guidance_scale_is_clamped_pigdm():
    # (1 - tau) / (tau r^2) with tau = 1 - t, r^2 = (1 - tau)^2 / (tau^2 + (1 - tau)^2)
    for t in (0.1, 0.25, 0.5, 0.75, 0.9):
        tau = 1 - t
        r2 = (1 - tau) ** 2 / (tau**2 + (1 - tau) ** 2)
        assert guidance_scale(t, 100.0) == pytest.approx((1 - tau) / (tau * r2))
    assert guidance_scale(0.5, 5.0) == pytest.approx(2.0)
    assert guidance_scale(1.0, 5.0) == 5.0 and guidance_scale(0.1, 5.0) == 5.0  # clamped at the ends


def _head() -> FlowMatchingActionHead:
    torch.manual_seed(0)
    return FlowMatchingActionHead(SMALL, 32, STATE, ACTION).eval()


def test_guidance_is_the_vector_jacobian_product_toward_the_target():
    head = _head()
    feats, state, _ = _inputs()
    kv = head.context_kv(feats)
    state_tok = head._state_token(state)
    t_int = torch.full((B,), 750, dtype=torch.long)
    t = 0.75

    def v(x):
        return head._velocity(x, t_int, state_tok, kv, 1)

    x = torch.randn(B, H, A, generator=torch.Generator().manual_seed(1))
    target = torch.randn(B, H, A, generator=torch.Generator().manual_seed(2))
    weights = prefix_weights(H, 1, 3)[None, :, None].expand(B, H, A).clone()
    g = PrefixGuidance(target, weights, max_weight=5.0)
    with torch.no_grad():
        got = guided_velocity(v, x, t, g)
        plain = v(x)
    # explicit Jacobian of the clean estimate x - t v(x), row by row
    expected = []
    for b in range(B):
        def clean(xb, b=b):
            full = x.clone()
            full[b] = xb
            return (full - t * v(full))[b]

        jac = torch.autograd.functional.jacobian(clean, x[b]).reshape(H * A, H * A)
        err = (weights[b] * (target[b] - clean(x[b]).detach())).reshape(-1)
        expected.append((jac.T @ err).reshape(H, A))
    expected = plain - guidance_scale(t, 5.0) * torch.stack(expected)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert not got.requires_grad


def test_without_guidance_sampling_is_bit_identical_and_leaves_no_grad_state():
    head = _head()
    feats, state, _ = _inputs()
    noise = torch.randn(B, H, A, generator=torch.Generator().manual_seed(3))
    plain = head.sample(feats, state, noise=noise)
    zero = PrefixGuidance(torch.randn(B, H, A), torch.zeros(B, H, A))
    assert torch.equal(head.sample(feats, state, noise=noise, guidance=None), plain)
    assert torch.equal(head.sample(feats, state, noise=noise, guidance=zero), plain)  # nothing to follow
    guided = head.sample(feats, state, noise=noise, guidance=PrefixGuidance(plain.flip(0), torch.ones(B, H, A)))
    assert not guided.requires_grad and guided.grad_fn is None
    assert all(p.grad is None for p in head.parameters())  # the VJP is taken w.r.t. x alone
    assert torch.is_grad_enabled()
    assert torch.equal(head.sample(feats, state, noise=noise), plain)  # nothing leaked into the plain path


def test_guided_sampling_follows_the_frozen_prefix_per_row_and_batches():
    head = _head()
    feats, state, _ = _inputs()
    g = torch.Generator().manual_seed(4)
    noise, other = torch.randn(B, H, A, generator=g), torch.randn(B, H, A, generator=g)
    plain = head.sample(feats, state, noise=noise)
    previous = head.sample(feats, state, noise=other)  # a chunk the model itself would produce
    d = [1, 2, 0]
    weights = torch.stack([prefix_weights(H, di, H) for di in d])[:, :, None].expand(B, H, A).clone()
    weights[:, :, -1] = 0  # a padding dim: never guided
    guided = head.sample(feats, state, noise=noise, guidance=PrefixGuidance(previous, weights))
    for b, di in enumerate(d):
        if di:
            err = (guided[b, :di, :-1] - previous[b, :di, :-1]).abs().max()
            assert err < 0.1 * (plain[b, :di, :-1] - previous[b, :di, :-1]).abs().max()
    # rows are independent: each row alone gives the batched row
    for b in range(B):
        one = head.sample(
            feats[b : b + 1], state[b : b + 1], noise=noise[b : b + 1],
            guidance=PrefixGuidance(previous[b : b + 1], weights[b : b + 1]),
        )
        torch.testing.assert_close(one[0], guided[b], rtol=1e-5, atol=1e-5)


def test_guidance_of_the_wrong_shape_is_one_line():
    head = _head()
    feats, state, _ = _inputs()
    with pytest.raises(GuidanceError, match=r"guidance.target: expected shape \(3, 4, 6\)"):
        head.sample(feats, state, guidance=PrefixGuidance(torch.zeros(B, H + 1, A), torch.ones(B, H, A)))
    with pytest.raises(GuidanceError, match="NaN"):
        head.sample(feats, state, guidance=PrefixGuidance(torch.full((B, H, A), math.nan), torch.ones(B, H, A)))


# --------------------------------------------------------------------------- the policy (robot units)


@pytest.fixture(scope="module")
def policy():
    from serve_fixtures import load_policy

    return load_policy()


@pytest.fixture(scope="module")
def obs(policy):
    from serve_fixtures import sample_observations

    return sample_observations(policy, 2)


def in_training_range(policy, chunk):
    from serve_fixtures import in_training_range

    return in_training_range(policy, chunk)


def test_policy_without_prefix_is_plain_sampling_bit_for_bit(policy, obs):
    plain = policy.predict_action(obs[0], seed=2)
    assert np.array_equal(policy.predict_action(obs[0], seed=2, prev_chunk=None, inference_delay=3), plain)
    h = policy.chunk_length
    prev = in_training_range(policy, policy.predict_action(obs[0], seed=1))
    # a horizon that leaves nothing to follow (H - s = 0) is plain sampling too
    assert np.array_equal(policy.predict_action(obs[0], seed=2, prev_chunk=prev[2:], execution_horizon=h), plain)


def test_policy_follows_the_executed_prefix_in_robot_units(policy, obs):
    h = policy.chunk_length
    prev = in_training_range(policy, policy.predict_action(obs[0], seed=1))
    plain = policy.predict_action(obs[0], seed=2)
    rest, d = prev[2:], 3  # 2 actions executed, 3 more will be while this chunk is computed
    new = policy.predict_action(obs[0], seed=2, prev_chunk=rest, inference_delay=d)
    assert new.shape == (h, policy.action_dim) and np.isfinite(new).all()
    gap_plain = np.abs(plain[:d] - rest[:d]).max()
    gap_rtc = np.abs(new[:d] - rest[:d]).max()
    # the frozen steps are inpainted (measured on this untrained model: ~0.5% of the plain gap)
    assert gap_rtc < 0.05 * gap_plain, (gap_rtc, gap_plain)
    # the explicit noise argument works with it, and reproduces the seeded call
    again = policy.predict_action(obs[0], seed=2, prev_chunk=rest, inference_delay=d)
    np.testing.assert_array_equal(again, new)


def test_policy_batches_rows_of_different_prefixes(policy, obs):
    prev = [in_training_range(policy, policy.predict_action(o, seed=1)) for o in obs]
    singles = [
        policy.predict_action(obs[0], seed=5, prev_chunk=prev[0][2:], inference_delay=2),
        policy.predict_action(obs[1], seed=5, prev_chunk=prev[1][2:], inference_delay=4),
    ]
    batched_obs = {k: np.stack([o[k] for o in obs]) for k in policy.camera_keys}
    batched_obs.update(state=np.stack([o["state"] for o in obs]), instruction=[o["instruction"] for o in obs])
    both = policy.predict_action(
        batched_obs, seed=5, prev_chunk=np.stack([p[2:] for p in prev]), inference_delay=np.array([2, 4])
    )
    for row, single in zip(both, singles):
        np.testing.assert_allclose(row, single, rtol=1e-5, atol=1e-5)


def test_explicit_noise_with_a_prefix(policy, obs):
    h, w = policy.chunk_length, policy.io.spec.action_width
    noise = {"action": np.random.default_rng(0).standard_normal((1, h, w)).astype(np.float32)}
    prev = in_training_range(policy, policy.predict_action(obs[0], seed=1))
    a = policy.predict_action(obs[0], seed=7, noise=noise, prev_chunk=prev[4:], inference_delay=2)
    b = policy.predict_action(obs[0], seed=8, noise=noise, prev_chunk=prev[4:], inference_delay=2)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)  # the start is the given noise, not the seed's


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prev_chunk": np.zeros((4, 13))}, r"prev_chunk: expected shape \(L, 14\)"),
        ({"prev_chunk": np.zeros((2, 4, 14))}, r"prev_chunk: expected shape \(L, 14\)"),
        ({"prev_chunk": np.zeros((99, 14))}, "prev_chunk: 99 steps, expected 1 to"),
        ({"prev_chunk": np.full((4, 14), np.nan)}, "prev_chunk: contains NaN or inf"),
        ({"prev_chunk": np.zeros((4, 14)), "inference_delay": 5}, "inference_delay 5 exceeds the 4 steps"),
        ({"prev_chunk": np.zeros((4, 14)), "inference_delay": -1}, "inference_delay: expected >= 0"),
        ({"prev_chunk": np.zeros((4, 14)), "inference_delay": 1.5}, "inference_delay: expected an int"),
        ({"prev_chunk": np.zeros((4, 14)), "execution_horizon": 1}, "execution_horizon: expected"),
        ({"prev_chunk": np.zeros((4, 14)), "max_guidance_weight": -1.0}, "max_guidance_weight"),
    ],
)
def test_bad_prefix_requests_are_one_line(policy, obs, kwargs, message):
    assert policy.action_dim == 14 and policy.chunk_length < 99
    with pytest.raises(PolicyInputError, match=message) as e:
        policy.predict_action(obs[0], seed=0, **kwargs)
    assert "\n" not in str(e.value)


def test_chunk_prefix_pads_to_the_chunk_and_weights_each_row():
    p = chunk_prefix(np.ones((2, 3, 5)), np.array([1, 3]), None, chunk_length=6, action_dim=5, rows=2, batched=True)
    assert p.actions.shape == (2, 6, 5) and p.weights.shape == (2, 6)
    np.testing.assert_allclose(p.weights[0], prefix_weights(6, 1, 3).numpy())
    np.testing.assert_allclose(p.weights[1], [1, 1, 1, 0, 0, 0])


# --------------------------------------------------------------------------- RTC inputs checked like the state


def test_prev_chunk_in_degrees_is_refused_naming_it_and_the_opt_out_warns(policy, obs):
    from dit4dit_npu.policy import PrevChunkOutOfRangeError, PrevChunkRangeWarning

    stats = policy.io.stats["action"]
    names = policy.manifest.data.action_names or [f"action[{j}]" for j in range(policy.action_dim)]
    degrees = np.degrees(in_training_range(policy, policy.predict_action(obs[0], seed=1))[2:])  # 57x
    with pytest.raises(PrevChunkOutOfRangeError) as e:
        policy.predict_action(obs[0], seed=2, prev_chunk=degrees, inference_delay=1)
    line = str(e.value)
    assert "\n" not in line and line.startswith("prev_chunk far outside the training range")
    from dit4dit_npu.policy.contract import out_of_range_dims

    j = out_of_range_dims(stats, degrees)[0]  # the first joint it names, with its farthest value and range
    v = degrees[np.abs(degrees[:, j] - (stats.min[j] + stats.max[j]) / 2).argmax(), j]
    assert f"{names[j]} = {v:.4g} (trained on [{stats.min[j]:.4g}, {stats.max[j]:.4g}])" in line
    assert line.endswith("refused (allow_out_of_range=True acts on it anyway)")
    with pytest.warns(PrevChunkRangeWarning, match="prev_chunk far outside the training range"):
        out = policy.predict_action(obs[0], seed=2, prev_chunk=degrees, inference_delay=1, allow_out_of_range=True)
    assert out.shape == (policy.chunk_length, policy.action_dim) and np.isfinite(out).all()


def test_huge_rtc_inputs_get_messages_that_name_them(policy, obs):
    from dit4dit_npu.policy import NonFiniteActionError, PrevChunkOutOfRangeError, PrevChunkRangeWarning

    prev = in_training_range(policy, policy.predict_action(obs[0], seed=1))[2:]
    huge = np.full_like(prev, 1e30)
    with pytest.raises(PrevChunkOutOfRangeError, match=r"prev_chunk far outside .* = 1e\+30 \(trained on"):
        policy.predict_action(obs[0], seed=2, prev_chunk=huge, inference_delay=1)
    with pytest.warns(PrevChunkRangeWarning), pytest.raises(NonFiniteActionError) as e:
        policy.predict_action(obs[0], seed=2, prev_chunk=huge, inference_delay=1, allow_out_of_range=True)
    assert "real-time chunking inputs drove it there (prev_chunk spans [1e+30, 1e+30]" in str(e.value)
    assert "outside the training data" not in str(e.value) and "damaged" not in str(e.value)
    with pytest.raises(PolicyInputError, match=r"max_guidance_weight: expected a number in \[0, 100\] \(the paper's "
                       r"beta, default 5; .*\), got 1e\+30"):
        policy.predict_action(obs[0], seed=2, prev_chunk=prev, inference_delay=1, max_guidance_weight=1e30)
    out = policy.predict_action(obs[0], seed=2, prev_chunk=prev, inference_delay=1, max_guidance_weight=100)
    assert np.isfinite(out).all()  # the bound itself is a working setting
    # finite in float64 but not once normalized in float32: was "guidance.target: contains NaN or inf"
    for value in (3e38, 1e300):
        with pytest.warns(PrevChunkRangeWarning), pytest.raises(PolicyInputError) as e:
            policy.predict_action(obs[0], seed=2, prev_chunk=np.full(prev.shape, value), inference_delay=1,
                                  allow_out_of_range=True)
        assert str(e.value).startswith(f"prev_chunk: values up to {value:.4g} overflow float32 once normalized"), e.value
