"""DiT flow-matching action head (SPEC §2)."""

import pytest
import torch

from dit4dit_npu.config import load_config
from dit4dit_npu.models import ActionInputError, FlowMatchingActionHead, resolve_dims
from dit4dit_npu.models.testing import small_config

B, S, D = 3, 8, 32  # batch, feature tokens, backbone hidden


@pytest.fixture(scope="module")
def cfg():
    return small_config()


@pytest.fixture()
def head(cfg) -> FlowMatchingActionHead:
    torch.manual_seed(0)
    return FlowMatchingActionHead(cfg.framework.action_model, D)


def _inputs(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = cfg.framework.action_model
    feats = torch.randn(B, S, D, generator=g)
    state = torch.randn(B, a.state_dim, generator=g)
    actions = torch.rand(B, a.chunk_length, a.action_dim, generator=g) * 2 - 1
    return feats, state, actions


def test_dit_b_matches_the_spec_sizes():
    cfg = load_config(
        None,
        [
            "framework.action_model.action_dim=8",
            "framework.action_model.state_dim=16",
            "datasets.vla_data.max_action_dim=8",
            "datasets.vla_data.max_state_dim=16",
        ],
    )
    with torch.device("meta"):
        head = FlowMatchingActionHead(cfg.framework.action_model, 2048)
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert round(n(head.model) / 1e6, 1) == 151.9  # SPEC 2.2: DiT ~151.9M, head ~163M
    assert round(n(head) / 1e6) == 163
    blocks = head.model.blocks
    assert len(blocks) == 16 and [b.is_cross for b in blocks[:4]] == [True, False, True, False]
    assert blocks[0].attn1.to_k.in_features == 2048 and blocks[1].attn1.to_k.in_features == 768
    assert blocks[0].attn1.heads == 12 and blocks[0].attn1.head_dim == 64
    assert head.model.proj_out_2.out_features == 2560 and head.position_embedding.num_embeddings == 1024


def test_presets_and_overrides():
    base = ["framework.action_model.action_model_type=DiT-tiny"]
    assert resolve_dims(small_config(*base).framework.action_model) == resolve_dims(
        load_config(None, base).framework.action_model
    )
    d = resolve_dims(
        load_config(
            None,
            base
            + [
                "framework.action_model.input_embedding_dim=96",
                "framework.action_model.diffusion_model_cfg.num_attention_heads=6",
            ],
        ).framework.action_model
    )
    assert (d.dim, d.heads, d.head_dim) == (96, 6, 16)


def test_loss_and_sample_shapes(cfg, head):
    feats, state, actions = _inputs(cfg)
    loss = head.loss(feats, state, actions)
    assert loss.ndim == 0 and loss.dtype == torch.float32 and loss.item() > 0
    out = head.sample(feats, state, torch.Generator().manual_seed(0))
    assert out.shape == (B, cfg.framework.action_model.chunk_length, cfg.framework.action_model.action_dim)
    assert out.dtype == torch.float32


def test_repeats_share_kv_and_equal_materialised_copies(cfg, head):
    feats, state, actions = _inputs(cfg)
    seen = []
    h = head.model.blocks[0].attn1.to_k.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[0]))
    results = []
    for copied in (False, True):  # same RNG draws (noise, t, dropout) in both orders of work
        head.reference_copied_repeats = copied
        head.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        loss = head.loss(feats, state, actions)
        loss.backward()
        results.append((loss.detach(), head.model.blocks[0].attn1.to_k.weight.grad.clone()))
    h.remove()
    head.reference_copied_repeats = False
    assert head.repeats == 2 and seen == [B, B * head.repeats]  # K/V once per unique feature
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-4, atol=1e-6)


def test_loss_ignores_masked_dims(cfg, head):
    head.eval()  # no dropout: compare calls exactly
    feats, state, actions = _inputs(cfg)
    mask = torch.ones_like(actions, dtype=torch.bool)
    torch.manual_seed(0)
    plain = head.loss(feats, state, actions)
    torch.manual_seed(0)
    torch.testing.assert_close(head.loss(feats, state, actions, mask), plain)  # sum/count == mean
    # a masked dim's prediction comes only through its row of the decoder's last layer: no
    # gradient may reach that row, while real dims get one
    mask[..., -2:] = False
    torch.manual_seed(0)
    head.loss(feats, state, actions, mask).backward()
    row_grad = head.action_decoder[2].weight.grad.abs().sum(dim=1)
    assert (row_grad[-2:] == 0).all() and (row_grad[:-2] > 0).all()


def test_narrow_inputs_are_zero_padded_wide_ones_rejected(cfg, head):
    head.eval()
    feats, state, actions = _inputs(cfg)
    padded = torch.cat([actions[..., :4], torch.zeros_like(actions[..., 4:])], dim=-1)
    mask = torch.zeros_like(actions, dtype=torch.bool)
    mask[..., :4] = True
    torch.manual_seed(0)
    a = head.loss(feats, state, actions[..., :4], mask[..., :4])
    torch.manual_seed(0)
    b = head.loss(feats, state, padded, mask)
    torch.testing.assert_close(a, b)
    wide = torch.zeros(B, actions.shape[1], actions.shape[2] + 2)
    with pytest.raises(ActionInputError, match=r"action has 8 dims but the action head takes 6.*action_dim"):
        head.loss(feats, state, wide)
    with pytest.raises(ActionInputError, match="state has 7 dims"):
        head.loss(feats, torch.zeros(B, 7), actions)
    with pytest.raises(ActionInputError, match="chunk has 5 steps"):
        head.loss(feats, state, torch.zeros(B, 5, actions.shape[2]))


def test_time_distribution_is_beta_over_s(head):
    torch.manual_seed(0)
    t = head.sample_time(50000, torch.device("cpu"))
    assert t.min() >= 0 and t.max() <= 1 / 0.999
    # Beta(1.5, 1): mean 0.6, P(u < 0.5) = 0.5 ** 1.5
    assert abs(t.mean().item() * 0.999 - 0.6) < 0.01
    assert abs((t * 0.999 < 0.5).float().mean().item() - 0.5**1.5) < 0.01


def test_sample_is_seeded_and_uses_the_features(cfg, head):
    head.eval()
    feats, state, _ = _inputs(cfg)
    a = head.sample(feats, state, torch.Generator().manual_seed(5))
    torch.testing.assert_close(a, head.sample(feats, state, torch.Generator().manual_seed(5)), rtol=0, atol=0)
    assert (a - head.sample(feats, state, torch.Generator().manual_seed(6))).abs().max() > 1e-4
    assert (a - head.sample(feats + 1.0, state, torch.Generator().manual_seed(5))).abs().max() > 1e-4


def test_head_runs_fp32_under_bf16_autocast(cfg, head):
    head.eval()
    feats, state, actions = _inputs(cfg)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = head.sample(feats.bfloat16(), state, torch.Generator().manual_seed(0))
        torch.manual_seed(0)
        loss = head.loss(feats.bfloat16(), state, actions)
    assert out.dtype == torch.float32 and loss.dtype == torch.float32
    ref = head.sample(feats.bfloat16().float(), state, torch.Generator().manual_seed(0))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)  # bit-identical: autocast had no effect
