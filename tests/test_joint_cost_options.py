"""Options that make a joint (video + action) training step cheaper: one backbone pass
(``framework.cosmos25.one_pass``), the video loss every k-th step (``trainer.video_loss_interval``)
and on fewer future latent frames (``framework.cosmos25.video_loss_future_frames``). Model-level
checks here; the real trainer's smokes are in ``tests/test_train_joint_options.py``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dit4dit_npu.config import ConfigError
from dit4dit_npu.models import DiT4DiT
from dit4dit_npu.models.cosmos_blocks import run_blocks, run_split
from dit4dit_npu.models.noise import TrainingNoise
from dit4dit_npu.models.prompt_cache import PromptCache
from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder
from dit4dit_npu.weights.testing import INSTRUCTIONS, make_batch, small_config, small_spec

ONE_PASS = "framework.cosmos25.one_pass.enabled=true"
NINE_FRAMES = "datasets.vla_data.video_delta_indices=[0, 1, 2, 3, 4, 5, 6, 7, 8]"  # 3 latent frames


@pytest.fixture(scope="module")
def cache() -> PromptCache:
    c = PromptCache()
    c.build(INSTRUCTIONS, build_prompt_encoder(small_config()))
    return c


def _model(cache: PromptCache, *overrides: str) -> DiT4DiT:
    cfg = small_config(*overrides)
    model = build_dit4dit(cfg, small_spec(cfg, num_frames=len(cfg.datasets.vla_data.clip_offsets)))
    model.set_prompt_cache(cache)
    return model


def _block_calls(model: DiT4DiT, fn) -> int:
    """How often the transformer's first block runs during ``fn()`` (a pass = one call)."""
    calls = []
    handle = model.backbone.transformer.transformer_blocks[0].register_forward_hook(lambda *_: calls.append(1))
    try:
        fn()
    finally:
        handle.remove()
    return len(calls)


def _observation(batch):
    return dataclasses.replace(batch, frames=batch.frames[:, :1], action=None, action_mask=None)


# ------------------------------------------------------------------ the transformer walked in pieces


def test_run_split_is_the_forward_and_the_early_exit_in_one_pass(cache):
    bb = _model(cache).backbone
    g = torch.Generator().manual_seed(0)
    x, cond = torch.randn(2, 16, 2, 4, 4, generator=g), torch.randn(2, 16, 1, 4, 4, generator=g)
    inputs = bb.transformer_inputs(cond, x, torch.tensor([0.3, 0.9]), cache.lookup(INSTRUCTIONS[:2], bb.vae.device))
    with torch.enable_grad():
        feats, out = run_split(bb.transformer, **inputs, split_block=1)
        assert feats.grad_fn is not None and out.grad_fn is not None
    torch.testing.assert_close(out, bb.transformer(**inputs, return_dict=False)[0], rtol=0, atol=0)
    torch.testing.assert_close(feats, run_blocks(bb.transformer, **inputs, last_block=1), rtol=0, atol=0)


# ------------------------------------------------------------------ one pass


def test_one_pass_runs_the_backbone_once_per_step(cache):
    batch = make_batch(small_spec(small_config()))
    two, one = _model(cache), _model(cache, ONE_PASS)
    assert _block_calls(two, lambda: two(batch)) == 2  # feature pass + video pass
    assert _block_calls(one, lambda: one(batch)) == 1
    out = one(batch)
    assert out["action_loss"] > 0 and out["video_loss"] > 0


def test_one_pass_features_at_inference_are_the_training_pass_at_the_convention(cache):
    """What the head reads at inference (the feature pass, future latents = the seeded feature
    noise at feature_sigma) is what the one pass gives a sample drawn at the inference convention:
    the same block, the same noise, the same inputs; bit for bit from the same conditioning latent."""
    model = _model(cache, ONE_PASS, "framework.cosmos25.one_pass.inference_noise_share=0.5")
    model.train()
    batch = make_batch(small_spec(small_config()), batch_size=3).to(model.device)
    prompts = model.prompt_embeddings(batch.instruction)
    latents, cond = model.clip_latents(batch)
    at_convention = TrainingNoise(one_pass_draw=torch.zeros(3))  # every u < 0.5
    with torch.enable_grad():
        _, train_feats, sigma = model._one_pass(latents, prompts, cond, at_convention)
    # the inference feature pass on the same conditioning latent: bit for bit
    bb = model.backbone
    infer = bb.features(cond, prompts, model.feature_latent_frames, call_seed=123)  # the configured seed wins
    torch.testing.assert_close(train_feats, infer, rtol=0, atol=0)
    assert torch.equal(sigma, model._feature_sigma(3))  # what predict_action tells a conditioned head
    # predict_action's own path, which encodes frame 0 alone (the VAE's 2-D equivalent): to rounding
    _, observed = model.observation_features(_observation(batch))
    torch.testing.assert_close(train_feats.detach(), observed, rtol=1e-4, atol=1e-5)
    # a sample at the video loss's own t reads other features
    _, other, sigma_t = model._one_pass(latents, prompts, cond, TrainingNoise(one_pass_draw=torch.ones(3)))
    assert (other - observed).abs().max() > 1e-3 and not torch.equal(sigma_t, sigma)


def test_one_pass_video_loss_is_the_flow_matching_loss_off_the_convention(cache):
    model = _model(cache, ONE_PASS)
    batch = make_batch(small_spec(small_config())).to(model.device)
    prompts = model.prompt_embeddings(batch.instruction)
    latents, cond = model.clip_latents(batch)
    g = torch.Generator().manual_seed(1)
    t, z = torch.rand(2, generator=g), torch.randn(2, 16, 1, 4, 4, generator=g)
    loss, _, sigma = model.backbone.video_loss_and_features(latents, prompts, cond, torch.zeros(2, dtype=torch.bool), t, z)
    torch.testing.assert_close(loss, model.backbone.video_flow_matching_loss(latents, prompts, cond, t, z))
    assert torch.equal(sigma, t)


@pytest.mark.parametrize("backprop", [False, True])
def test_one_pass_action_loss_reaches_the_backbone_only_when_asked(cache, backprop):
    model = _model(cache, ONE_PASS, f"framework.cosmos25.backprop_action_to_backbone={str(backprop).lower()}")
    model(make_batch(small_spec(small_config())))["action_loss"].backward()
    first, last = (model.backbone.transformer.transformer_blocks[i].attn1.to_q.weight.grad for i in (0, -1))
    assert (first is not None and first.abs().sum() > 0) == backprop
    assert last is None  # blocks after extract_layer serve the video loss alone


def test_head_conditioned_on_noise_level_starts_as_the_plain_head(cache):
    """The noise-level embedding is zero at initialization and every other weight draws the same
    init, so the conditioned head's first loss is the plain head's; once trained, sigma matters."""
    batch = make_batch(small_spec(small_config()))
    noise = TrainingNoise(one_pass_draw=torch.tensor([0.1, 0.9]), action=torch.randn(2, 2, 4, 6),
                          action_time=torch.rand(2, 2), video_time=torch.rand(2), video=torch.randn(2, 16, 1, 4, 4))
    plain = _model(cache, ONE_PASS)
    cond = _model(cache, ONE_PASS, "framework.cosmos25.one_pass.condition_head_on_noise_level=true")
    losses = []
    for model in (plain, cond):
        torch.manual_seed(0)  # the head's dropout
        losses.append(model(batch, noise)["action_loss"])
    torch.testing.assert_close(*losses, rtol=0, atol=0)
    head = cond.action_model
    torch.nn.init.normal_(head.noise_level_embedder.linear_2.weight)
    feats = torch.randn(2, 8, cond.backbone.hidden_size)
    a, b = (head.sample(feats, batch.state, torch.Generator().manual_seed(0), feature_sigma=torch.full((2,), s))
            for s in (0.995, 0.3))
    assert (a - b).abs().max() > 1e-4
    with pytest.raises(ValueError, match="feature_sigma"):
        head.sample(feats, batch.state)
    # predict_action gives it the feature sigma
    assert cond.predict_action(_observation(batch), seed=0).shape == (2, 4, 6)


# ------------------------------------------------------------------ video loss every k-th step


@pytest.mark.parametrize("one_pass", [False, True])
def test_a_step_without_the_video_loss_runs_the_feature_pass_alone(cache, one_pass):
    model = _model(cache, *([ONE_PASS] if one_pass else []))
    batch = make_batch(small_spec(small_config()))
    out = {}
    assert _block_calls(model, lambda: out.update(model(batch, video_loss=False))) == 1
    assert out["video_loss"] == 0 and out["action_loss"] > 0
    # and it encodes frame 0 only: the latents it reads are the observation's
    latents, _ = model.clip_latents(batch, video=False)
    assert latents.shape[2] == 1
    with pytest.raises(ValueError, match="video_loss=False"):
        _model(cache, "framework.cosmos25.training=video")(batch, video_loss=False)


# ------------------------------------------------------------------ fewer future latent frames


def test_video_loss_on_fewer_future_latent_frames(cache):
    full = _model(cache, NINE_FRAMES)
    short = _model(cache, NINE_FRAMES, "framework.cosmos25.video_loss_future_frames=1")
    batch = make_batch(short.spec)
    whole, _ = full.clip_latents(batch)
    first, _ = short.clip_latents(batch)  # only the first 5 pixel frames are encoded (causal VAE)
    assert whole.shape[2] == 3 and first.shape[2] == 2
    torch.testing.assert_close(first, whole[:, :, :2], rtol=1e-4, atol=1e-5)
    seen = []
    hook = short.backbone.transformer.register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw["hidden_states"].shape[2]),
                                                                with_kwargs=True)
    try:
        assert short(batch)["video_loss"] > 0
    finally:
        hook.remove()
    assert seen == [2]  # the video pass: 1 + 1 latent frames; the feature pass keeps the clip's 3
    assert short.feature_latent_frames == 3
    # with one pass the head's features are that pass's: inference runs on 1 + k latent frames too
    assert _model(cache, NINE_FRAMES, ONE_PASS, "framework.cosmos25.video_loss_future_frames=1").feature_latent_frames == 2


# ------------------------------------------------------------------ refusals (one line, naming the key)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ([ONE_PASS, "framework.cosmos25.training=action"], r"framework\.cosmos25\.training: got 'action'.*'joint' with one_pass"),
        ([ONE_PASS, "framework.cosmos25.video_loss_batch_fraction=0.5"],
         r"framework\.cosmos25\.video_loss_batch_fraction: got 0\.5.*1\.0 with one_pass"),
        ([ONE_PASS, "framework.cosmos25.one_pass.inference_noise_share=0"],
         r"framework\.cosmos25\.one_pass\.inference_noise_share: got 0\.0.*condition_head_on_noise_level"),
        ([ONE_PASS, "framework.cosmos25.one_pass.inference_noise_share=1.5"],
         r"framework\.cosmos25\.one_pass\.inference_noise_share: got 1\.5, expected in \[0, 1\]"),
        (["framework.cosmos25.one_pass.condition_head_on_noise_level=true"],
         r"framework\.cosmos25\.one_pass\.condition_head_on_noise_level: got True.*unless framework\.cosmos25\.one_pass\.enabled"),
        (["framework.cosmos25.video_loss_future_frames=0"], r"framework\.cosmos25\.video_loss_future_frames: got 0, expected >= 1"),
        # (was accepted and ignored: 'action' mode encodes latent 0 alone)
        (["framework.cosmos25.video_loss_future_frames=1", "framework.cosmos25.training=action"],
         r"framework\.cosmos25\.video_loss_future_frames: got 1, expected null with framework\.cosmos25\.training 'action'"),
        (["trainer.video_loss_interval=0"], r"trainer\.video_loss_interval: got 0, expected >= 1"),
        (["trainer.video_loss_interval=2", "framework.cosmos25.training=action"],
         r"trainer\.video_loss_interval: got 2.*unless framework\.cosmos25\.training is 'joint'"),
        ([ONE_PASS, "datasets.vla_data.video_delta_indices=[0]"],
         r"datasets\.vla_data\.video_delta_indices: got \[0\].*one_pass\.enabled, trainer\.video_loss_interval"),
        (["trainer.video_loss_span=[0, 0.5]", "datasets.vla_data.video_delta_indices=[0]"],
         r"datasets\.vla_data\.video_delta_indices: got \[0\].*trainer\.video_loss_span other than \[0, 1\]"),
        (["trainer.video_loss_span=[0.5, 0.5]"], r"trainer\.video_loss_span: got \[0\.5, 0\.5\], expected \[start, end\] "
                                                 r"with 0 <= start < end <= 1"),
        (["trainer.video_loss_span=[0, 1.5]"], r"trainer\.video_loss_span: got \[0\.0, 1\.5\]"),
        (["trainer.video_loss_span=[0.5]"], r"trainer\.video_loss_span: got \[0\.5\], expected \[start, end\]"),
        (["trainer.video_loss_span=0.5"], r"trainer\.video_loss_span: got 0\.5, expected a list of float"),
        (["trainer.video_loss_span=[0, 0.5]", "framework.cosmos25.training=action"],
         r"trainer\.video_loss_span: got \[0\.0, 0\.5\], expected \[0, 1\] unless framework\.cosmos25\.training is 'joint'"),
    ],
)
def test_bad_option_values_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message):
        small_config(*overrides)


def test_more_future_frames_than_the_clip_has_is_refused_at_build(cache):
    with pytest.raises(ConfigError, match=r"framework\.cosmos25\.video_loss_future_frames: 2, but clips of 5 frames "
                                          r"have 1 future latent frame"):
        _model(cache, "framework.cosmos25.video_loss_future_frames=2")


def test_the_video_loss_span_counts_the_further_of_steps_and_the_budget():
    """trainer.video_loss_span: a step has the video loss while the share of the training done lies
    in [start, end): by steps alone, or with a budget the further of the steps' and the seconds'
    share (the LR schedule's position), each bound inclusive at the start; with
    video_loss_interval > 1 a step needs both."""
    from dit4dit_npu.config import TrainerConfig
    from dit4dit_npu.train.trainer import has_video_loss

    by_steps = TrainerConfig(max_train_steps=8, video_loss_span=[0.25, 0.75])
    assert [has_video_loss(by_steps, s, 0.0) for s in range(8)] == [False, False, True, True, True, True, False, False]
    first_half = TrainerConfig(max_train_steps=1000, max_train_time_s=100.0, video_loss_span=[0.0, 0.5])
    # step 10 of 1000 is 1% by steps: the seconds decide
    assert [has_video_loss(first_half, 10, s) for s in (0.0, 49.9, 50.0, 99.0)] == [True, True, False, False]
    # the steps decide when they are further (a run that reaches max_train_steps before its budget)
    assert not has_video_loss(first_half, 500, 1.0)
    last_half = TrainerConfig(max_train_steps=1000, max_train_time_s=100.0, video_loss_span=[0.5, 1.0])
    assert [has_video_loss(last_half, 10, s) for s in (0.0, 49.9, 50.0, 99.9)] == [False, False, True, True]
    every_other = TrainerConfig(max_train_steps=8, video_loss_interval=2, video_loss_span=[0.5, 1.0])
    assert [has_video_loss(every_other, s, 0.0) for s in range(8)] == [False] * 4 + [True, False, True, False]
    # the default: every step
    assert all(has_video_loss(TrainerConfig(max_train_steps=8), s, 0.0) for s in range(8))


def test_a_resume_with_another_video_loss_span_or_interval_is_another_config():
    """Which steps have the video loss is part of the objective: resume.check_config refuses a
    checkpoint whose recorded span or interval differs (checkpoint.fingerprint)."""
    import json

    from dit4dit_npu.train import checkpoint as ckpt_io

    saved = json.loads(json.dumps(ckpt_io.fingerprint(small_config())))
    assert ckpt_io.config_diffs(saved, ckpt_io.fingerprint(small_config("trainer.video_loss_span=[0, 0.5]"))) == [
        "trainer.video_loss_span: checkpoint [0.0, 1.0] vs config [0.0, 0.5]"
    ]
    assert ckpt_io.config_diffs(saved, ckpt_io.fingerprint(small_config("trainer.video_loss_interval=4"))) == [
        "trainer.video_loss_interval: checkpoint 1 vs config 4"
    ]
