"""bench/reference.py: the original's step, rebuilt from our modules, equals ours where the maths
is equal, and really does the original's extra work (what the benches time)."""

import pytest
import torch

from bench.reference import (
    ReferenceDiT4DiT,
    copied_repeats_loss,
    full_depth_features,
    separate_condition_encode,
)
from dit4dit_npu.models.prompt_cache import PromptCache
from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder
from dit4dit_npu.weights.testing import INSTRUCTIONS, make_batch, small_config, small_spec


@pytest.fixture(scope="module")
def setup():
    cfg = small_config()
    encoder = build_prompt_encoder(cfg)
    cache = PromptCache()
    cache.build(INSTRUCTIONS, encoder)
    model = build_dit4dit(cfg, small_spec(cfg))
    model.set_prompt_cache(cache)
    return model, encoder


def test_reference_step_equals_ours_and_runs_the_text_encoder_each_step(setup):
    model, encoder = setup
    ref = ReferenceDiT4DiT(model, encoder, separate_condition_encode=False)
    batch = make_batch(model.spec)
    calls = []
    h = encoder.language_model.register_forward_hook(lambda *a: calls.append(1))
    try:
        torch.manual_seed(0)
        ours = model(batch)
        assert not calls  # ours: the prompt cache
        torch.manual_seed(0)
        theirs = ref(batch)
        ref(batch)
    finally:
        h.remove()
    assert len(calls) == 2  # the reference: the text encoder on every step
    assert set(theirs) == set(ours)
    for k in ours:
        torch.testing.assert_close(theirs[k], ours[k], rtol=1e-5, atol=1e-6)
    # and the same gradients
    grads = []
    for step in (model, ref):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        out = step(batch)
        (out["action_loss"] + out["video_loss"]).backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    model.zero_grad(set_to_none=True)


def test_reference_predict_action_equals_ours(setup):
    model, encoder = setup
    ref = ReferenceDiT4DiT(model, encoder, separate_condition_encode=False)
    obs = make_batch(model.spec, training=False, seed=3)
    torch.testing.assert_close(ref.predict_action(obs, seed=1), model.predict_action(obs, seed=1), rtol=1e-5, atol=1e-6)


def test_full_depth_pass_equals_early_exit_but_runs_everything_with_a_graph(setup):
    model, _ = setup
    bb = model.backbone
    cond = bb.encode_video(model.video_input(make_batch(model.spec, training=False).frames))
    prompts = model.prompt_embeddings(INSTRUCTIONS[:2])
    blocks = []
    hooks = [b.register_forward_hook(lambda *a: blocks.append(1)) for b in bb.transformer.transformer_blocks]
    try:
        feats, full_out = full_depth_features(bb, cond, prompts, 2)
        ran_full = len(blocks)
        blocks.clear()
        ours = bb.features(cond, prompts, 2)
    finally:
        for h in hooks:
            h.remove()
    assert ran_full == bb.num_layers and len(blocks) == bb.cfg.extract_layer + 1
    assert full_out.grad_fn is not None and feats.grad_fn is None  # the wasted graph; detached features
    torch.testing.assert_close(feats, ours, rtol=1e-5, atol=1e-6)


def test_separate_condition_encode_runs_per_sample(setup):
    model, encoder = setup
    bb = model.backbone
    shapes = []
    h = bb.vae.encoder.register_forward_hook(lambda m, i, o: shapes.append(i[0].shape[0]))
    try:
        ReferenceDiT4DiT(model, encoder)(make_batch(model.spec, batch_size=3))
    finally:
        h.remove()
    # the Wan encoder runs once per 1+4 frame chunk: 2 chunks batched (ground truth) + 2 chunks x 3 samples
    assert shapes == [3, 3, 1, 1, 1, 1, 1, 1]
    video = model.video_input(make_batch(model.spec, batch_size=2).frames)
    cond = separate_condition_encode(bb, video[:, :, :1], 5)
    assert cond.shape == (2, 16, 1, 4, 4)
    # a posterior sample near latent 0 of the clip (the causal VAE: padding never reaches it)
    assert (cond - bb.encode_video(video)[:, :, :1]).abs().mean() < 1.0


def test_copied_repeats_equal_shared_kv(setup):
    model, _ = setup
    head = model.action_model
    batch = make_batch(model.spec)
    feats = torch.randn(2, 8, model.backbone.hidden_size, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    a = head.loss(feats, batch.state, batch.action, batch.action_mask)
    torch.manual_seed(0)
    b = copied_repeats_loss(head, feats, batch.state, batch.action, batch.action_mask)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_reference_is_the_joint_step_only(setup):
    model, encoder = setup
    cfg = small_config("framework.cosmos25.training=action")
    with pytest.raises(ValueError, match="joint"):
        ReferenceDiT4DiT(build_dit4dit(cfg, small_spec(cfg)), encoder)
