"""DiT flow-matching action head ("DiT-B", GR00T-N1 style, as in the original)."""

import dataclasses

import pytest
import torch

from dit4dit_npu.config import ActionModelConfig, ConfigError, DiffusionModelConfig, TrainerConfig
from dit4dit_npu.models import FlowMatchingActionHead
from dit4dit_npu.weights.model_config import head_config

B, S, D = 3, 8, 32  # batch, feature tokens, backbone hidden
STATE, ACTION = 5, 6  # the batch's widths

# the run-config section (its checks) and the head's record derived from it (weights/model_config.py)
SMALL_SECTION = ActionModelConfig(
    input_embedding_dim=64, hidden_size=32, chunk_length=4, repeated_diffusion_steps=2,
    diffusion_model_cfg=DiffusionModelConfig(num_layers=2, output_dim=32, num_attention_heads=4, attention_head_dim=16),
)
SMALL = head_config(SMALL_SECTION)


@pytest.fixture()
def head() -> FlowMatchingActionHead:
    torch.manual_seed(0)
    return FlowMatchingActionHead(SMALL, D, STATE, ACTION)


def _inputs(state_width: int = STATE, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(B, S, D, generator=g)
    state = torch.randn(B, state_width, generator=g) if state_width else None
    actions = torch.rand(B, SMALL.chunk_length, ACTION, generator=g) * 2 - 1
    return feats, state, actions


def test_dit_b_matches_the_spec_sizes():
    with torch.device("meta"):
        head = FlowMatchingActionHead(head_config(ActionModelConfig()), 2048, state_width=16, action_width=8)
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert round(n(head.model) / 1e6, 1) == 151.9  # the original's DiT-B: DiT ~151.9M, head ~163M
    assert round(n(head) / 1e6) == 163
    blocks = head.model.blocks
    assert len(blocks) == 16 and [b.is_cross for b in blocks[:4]] == [True, False, True, False]
    assert blocks[0].attn1.to_k.in_features == 2048 and blocks[1].attn1.to_k.in_features == 768
    assert blocks[0].attn1.heads == 12 and blocks[0].attn1.head_dim == 64
    assert head.model.proj_out_2.out_features == 2560 and head.position_embedding.num_embeddings == 1024


def test_widths_are_the_configs():
    head = FlowMatchingActionHead(SMALL, D, state_width=28, action_width=16)
    assert head.state_encoder[0].in_features == 28  # e.g. sin/cos of 14 joints
    assert head.action_encoder.W1.in_features == 16 == head.action_decoder[2].out_features
    no_state = FlowMatchingActionHead(SMALL, D, state_width=0, action_width=ACTION)
    assert no_state.state_encoder is None


def test_loss_and_sample_shapes(head):
    feats, state, actions = _inputs()
    loss = head.loss(feats, state, actions)
    assert loss.ndim == 0 and loss.dtype == torch.float32 and loss.item() > 0
    out = head.sample(feats, state, torch.Generator().manual_seed(0))
    assert out.shape == (B, SMALL.chunk_length, ACTION) and out.dtype == torch.float32


def test_without_state():
    head = FlowMatchingActionHead(SMALL, D, state_width=0, action_width=ACTION)
    feats, state, actions = _inputs(state_width=0)
    assert state is None
    assert head.loss(feats, None, actions).item() > 0
    assert head.sample(feats, None).shape == (B, SMALL.chunk_length, ACTION)


def test_repeats_share_kv_and_equal_materialised_copies(head):
    feats, state, actions = _inputs()
    seen = []
    h = head.model.blocks[0].attn1.to_k.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[0]))
    r = head.repeats
    copied_kv = lambda: head.context_kv(feats.repeat_interleave(r, dim=0))  # noqa: E731
    results = []
    for loss_fn in (
        lambda: head.loss(feats, state, actions),  # K/V once per sample, R queries each
        lambda: head.loss_with_context(copied_kv(), 1, state, actions),  # the original's R copies
    ):
        head.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # same draws (noise, t, dropout) in both orders of work
        loss = loss_fn()
        loss.backward()
        results.append((loss.detach(), head.model.blocks[0].attn1.to_k.weight.grad.clone()))
    h.remove()
    assert r == 2 and seen == [B, B * r]  # K/V once per unique feature vs once per copy
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-4, atol=1e-6)


def test_loss_ignores_masked_dims(head):
    head.eval()  # no dropout: compare calls exactly
    feats, state, actions = _inputs()
    mask = torch.ones_like(actions, dtype=torch.bool)
    torch.manual_seed(0)
    plain = head.loss(feats, state, actions)
    torch.manual_seed(0)
    torch.testing.assert_close(head.loss(feats, state, actions, mask), plain)  # sum/count == mean
    # a padded dim's prediction comes only through its row of the decoder's last layer: no
    # gradient may reach that row, while real dims get one
    mask[..., -2:] = False
    torch.manual_seed(0)
    head.loss(feats, state, actions, mask).backward()
    row_grad = head.action_decoder[2].weight.grad.abs().sum(dim=1)
    assert (row_grad[-2:] == 0).all() and (row_grad[:-2] > 0).all()


def test_bad_configs_are_clear_errors():
    key = "framework.action_model"
    with pytest.raises(ConfigError, match=rf"^{key}\.max_seq_len: 2 position embeddings, but the chunk has 4"):
        dataclasses.replace(SMALL_SECTION, max_seq_len=2).check(key)
    with pytest.raises(ConfigError, match=rf"^{key}\.repeated_diffusion_steps: got 0, expected >= 1"):
        dataclasses.replace(SMALL_SECTION, repeated_diffusion_steps=0).check(key)
    with pytest.raises(ConfigError, match=r"^datasets\.vla_data\.max_action_dim: got 0"):  # the batch's width
        FlowMatchingActionHead(SMALL, D, STATE, action_width=0)


def test_time_distribution_is_beta_over_s(head):
    torch.manual_seed(0)
    t = head.sample_time(50000, torch.device("cpu"))
    assert t.min() >= 0 and t.max() <= 1 / 0.999
    # Beta(1.5, 1): mean 0.6, P(u < 0.5) = 0.5 ** 1.5
    assert abs(t.mean().item() * 0.999 - 0.6) < 0.01
    assert abs((t * 0.999 < 0.5).float().mean().item() - 0.5**1.5) < 0.01


def test_sample_is_seeded_and_uses_the_features(head):
    head.eval()
    feats, state, _ = _inputs()
    a = head.sample(feats, state, torch.Generator().manual_seed(5))
    torch.testing.assert_close(a, head.sample(feats, state, torch.Generator().manual_seed(5)), rtol=0, atol=0)
    assert (a - head.sample(feats, state, torch.Generator().manual_seed(6))).abs().max() > 1e-4
    assert (a - head.sample(feats + 1.0, state, torch.Generator().manual_seed(5))).abs().max() > 1e-4
    assert (a - head.sample(feats, state + 1.0, torch.Generator().manual_seed(5))).abs().max() > 1e-4


def test_head_runs_fp32_under_bf16_autocast(head):
    head.eval()
    feats, state, actions = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = head.sample(feats.bfloat16(), state, torch.Generator().manual_seed(0))
        torch.manual_seed(0)
        loss = head.loss(feats.bfloat16(), state, actions)
    assert out.dtype == torch.float32 and loss.dtype == torch.float32
    ref = head.sample(feats.bfloat16().float(), state, torch.Generator().manual_seed(0))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)  # bit-identical: autocast had no effect


def test_state_noise_is_training_only_and_off_by_default():
    feats, state, actions = _inputs()
    noise = torch.randn(B, SMALL.repeated_diffusion_steps, SMALL.chunk_length, ACTION)
    t = torch.rand(B, SMALL.repeated_diffusion_steps)
    cfg = dataclasses.replace(SMALL, diffusion_model_cfg=dataclasses.replace(SMALL.diffusion_model_cfg, dropout=0.0))
    torch.manual_seed(0)
    plain = FlowMatchingActionHead(cfg, D, STATE, ACTION)
    torch.manual_seed(0)
    noisy = FlowMatchingActionHead(dataclasses.replace(cfg, state_noise_std=0.5), D, STATE, ACTION)
    plain.train(), noisy.train()
    ref = plain.loss(feats, state, actions, noise=noise, t=t)
    assert torch.equal(plain.loss(feats, state, actions, noise=noise, t=t), ref)  # no draw when off
    a, b = (noisy.loss(feats, state, actions, noise=noise, t=t) for _ in range(2))
    assert not torch.equal(a, ref) and not torch.equal(a, b)  # each call draws its own state noise
    noisy.eval()  # held-out losses and sampling see the clean state
    assert torch.equal(noisy.loss(feats, state, actions, noise=noise, t=t), ref)
    g = lambda: torch.Generator().manual_seed(1)  # noqa: E731
    assert torch.equal(noisy.sample(feats, state, g()), plain.sample(feats, state, g()))
    with pytest.raises(ConfigError, match="state_noise_std: got -0.1, expected a number >= 0"):
        TrainerConfig(state_noise_std=-0.1).check("trainer")


def test_state_noise_per_dim_leaves_zero_dims_clean():
    cfg = dataclasses.replace(SMALL, diffusion_model_cfg=dataclasses.replace(SMALL.diffusion_model_cfg, dropout=0.0))
    feats, state, actions = _inputs()
    noise = torch.randn(B, SMALL.repeated_diffusion_steps, SMALL.chunk_length, ACTION)
    t = torch.rand(B, SMALL.repeated_diffusion_steps)
    torch.manual_seed(0)
    zeros = FlowMatchingActionHead(dataclasses.replace(cfg, state_noise_std=[0.0] * STATE), D, STATE, ACTION).train()
    torch.manual_seed(0)
    plain = FlowMatchingActionHead(cfg, D, STATE, ACTION).train()
    assert torch.equal(zeros.loss(feats, state, actions, noise=noise, t=t), plain.loss(feats, state, actions, noise=noise, t=t))
    torch.manual_seed(0)
    one = FlowMatchingActionHead(dataclasses.replace(cfg, state_noise_std=[0.0, 0.0, 0.0, 0.0, 1.0]), D, STATE, ACTION).train()
    seen = []
    one.state_encoder.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    one.loss(feats, state, actions, noise=noise, t=t)
    clean = state.repeat_interleave(SMALL.repeated_diffusion_steps, dim=0)
    assert torch.equal(seen[0][:, :4], clean[:, :4]) and not torch.equal(seen[0][:, 4], clean[:, 4])
    with pytest.raises(ConfigError, match=r"state_noise_std: 2 values, but the encoded state has 5 dims"):
        FlowMatchingActionHead(dataclasses.replace(cfg, state_noise_std=[0.1, 0.1]), D, STATE, ACTION)
