"""Video backbone: VAE encode, early-exit feature pass, video flow-matching loss."""

import logging

import pytest
import torch

from dit4dit_npu.config import ConfigError
from dit4dit_npu.models import FrameInputError, build_backbone
from dit4dit_npu.models.testing import small_config

H = W = 32  # -> latents 4x4, 2x2 tokens per latent frame


@pytest.fixture(scope="module")
def backbone():
    return build_backbone(small_config())


def _clip(t: int, b: int = 2, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, 3, t, H, W, generator=g) * 2 - 1


def _prompts(b: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, 7, 64, generator=torch.Generator().manual_seed(seed))  # 2 text layers x 32


def test_encode_shapes_and_pipeline_normalisation(backbone):
    video = _clip(5)
    lat = backbone.encode_video(video)
    assert lat.shape == (2, 16, 2, H // 8, W // 8) and lat.dtype == torch.float32
    # the pipeline's convention: pipe.latents_std holds 1/std and it multiplies
    vae = backbone.vae
    z = vae.encode(video).latent_dist.mode()
    mean = torch.tensor(vae.config.latents_mean).view(1, 16, 1, 1, 1)
    pipe_latents_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1)
    torch.testing.assert_close(lat, (z - mean) * pipe_latents_std)
    assert (
        backbone.normalize(z)
        .sub((z - mean) * torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1))
        .abs()
        .max()
        > 0.1
    )
    torch.testing.assert_close(backbone.denormalize(lat), z, rtol=1e-5, atol=1e-5)


def test_one_frame_encode_equals_latent_zero_of_the_clip(backbone):
    video = _clip(9)
    full = backbone.encode_video(video)
    assert full.shape[2] == 3
    first = backbone.encode_video(video[:, :, :1])
    assert first.shape[2] == 1
    torch.testing.assert_close(first, full[:, :, :1], rtol=1e-5, atol=1e-5)
    # ... and latent 1 does depend on the later frames (the check above is not vacuous)
    other = video.clone()
    other[:, :, 1:] = -other[:, :, 1:]
    again = backbone.encode_video(other)
    torch.testing.assert_close(again[:, :, :1], full[:, :, :1], rtol=1e-5, atol=1e-5)
    assert (again[:, :, 1] - full[:, :, 1]).abs().max() > 1e-3


def test_clip_length_padded_to_1_plus_4k_with_one_warning(backbone, caplog):
    backbone._warned_pad = False
    video = _clip(4)
    with caplog.at_level(logging.WARNING):
        lat = backbone.encode_video(video)
        backbone.encode_video(video)
    assert lat.shape[2] == 2
    warnings = [r for r in caplog.records if "not 1 + 4k" in r.getMessage()]
    assert len(warnings) == 1
    padded = torch.cat([video, video[:, :, -1:]], dim=2)  # repeat the last frame
    torch.testing.assert_close(lat, backbone.encode_video(padded))


def test_frame_size_must_be_divisible_by_16(backbone):
    with pytest.raises(FrameInputError, match="divisible by 16"):
        backbone.encode_video(torch.zeros(1, 3, 1, 24, 32))


def test_feature_sigma_comes_from_the_scheduler(backbone):
    assert abs(backbone.feature_sigma - 200 / 201) < 1e-4


def test_early_exit_equals_hooked_full_pass(backbone):
    cond = backbone.encode_video(_clip(1))
    prompts = _prompts()
    for layer in (0, 1, 2):
        ours = backbone.features(cond, prompts, extract_layer=layer, num_latent_frames=2, seed=7)
        ref, _ = backbone.features_reference(cond, prompts, extract_layer=layer, num_latent_frames=2, seed=7)
        assert ours.shape == (2, 2 * 2 * 2, backbone.hidden_size)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    # later blocks change the tokens, so stopping early is a real difference in work, not output
    a = backbone.features(cond, prompts, 0, 2, seed=7)
    b = backbone.features(cond, prompts, 2, 2, seed=7)
    assert (a - b).abs().max() > 1e-3


def test_feature_pass_builds_no_graph_but_reference_does(backbone):
    cond = backbone.encode_video(_clip(1))
    with torch.enable_grad():
        feats = backbone.features(cond, _prompts(), 1, 2, seed=0)
        assert not feats.requires_grad and feats.grad_fn is None
        ref, full_out = backbone.features_reference(cond, _prompts(), 1, 2, seed=0)
        assert full_out.grad_fn is not None  # the original's wasted graph
        assert ref.grad_fn is None  # and its features were detached anyway
        with_grad = backbone.features(cond, _prompts(), 1, 2, seed=0, grad=True)
        assert with_grad.grad_fn is not None


def test_feature_noise_seeded_and_batch_independent(backbone):
    cond = backbone.encode_video(_clip(1))
    prompts = _prompts()
    a = backbone.features(cond, prompts, 1, 2, seed=3)
    torch.testing.assert_close(a, backbone.features(cond, prompts, 1, 2, seed=3), rtol=0, atol=0)
    assert (a - backbone.features(cond, prompts, 1, 2, seed=4)).abs().max() > 1e-4
    # a sample's features do not depend on which batch it came in
    single = backbone.features(cond[1:], prompts[1:], 1, 2, seed=3)
    torch.testing.assert_close(single, a[1:], rtol=1e-5, atol=1e-6)


def test_extract_layer_out_of_range(backbone):
    cond = backbone.encode_video(_clip(1))
    with pytest.raises(ConfigError, match=r"extract_layer: got 3, expected 0\.\.2"):
        backbone.features(cond, _prompts(), 3, 2)


def test_video_loss_trains_future_frames_only(backbone):
    lat = backbone.encode_video(_clip(9))
    prompts = _prompts()
    torch.manual_seed(0)
    loss = backbone.video_flow_matching_loss(lat, prompts)
    assert loss.ndim == 0 and loss.dtype == torch.float32 and loss.item() > 0
    backbone.transformer.zero_grad(set_to_none=True)
    loss.backward()
    grads = [p.grad for p in backbone.transformer.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    backbone.transformer.zero_grad(set_to_none=True)
    # the conditioning frame never enters the target: changing its ground truth latent in the
    # target slot (frame 0 of x0) leaves the loss unchanged when the conditioning is given apart
    cond = lat[:, :, :1]
    other = lat.clone()
    other[:, :, 0] += 5.0
    torch.manual_seed(0)
    a = backbone.video_flow_matching_loss(lat, prompts, cond)
    torch.manual_seed(0)
    b = backbone.video_flow_matching_loss(other, prompts, cond)
    torch.testing.assert_close(a, b)


def test_single_latent_frame_gives_zero_video_loss_without_a_pass(backbone):
    calls = []
    h = backbone.transformer.register_forward_hook(lambda *a: calls.append(1))
    try:
        loss = backbone.video_flow_matching_loss(backbone.encode_video(_clip(1)), _prompts())
    finally:
        h.remove()
    assert loss.item() == 0.0 and not calls


def test_logit_normal_time_with_high_sigma(backbone):
    fm = backbone.flow_matching
    old = (fm.time_distribution, fm.high_sigma_ratio, fm.high_sigma_min)
    try:
        fm.time_distribution, fm.high_sigma_ratio, fm.high_sigma_min = "logit_normal", 0.5, 0.98
        torch.manual_seed(0)
        t = backbone.sample_time(20000, torch.device("cpu"))
        assert 0 < t.min() and t.max() < 1
        assert 0.4 < (t >= 0.98).float().mean() < 0.6  # ~half replaced by U[0.98, 1)
        fm.time_distribution, fm.high_sigma_ratio = "uniform", None
        t = backbone.sample_time(20000, torch.device("cpu"))
        assert abs(t.mean().item() - 0.5) < 0.02
    finally:
        fm.time_distribution, fm.high_sigma_ratio, fm.high_sigma_min = old


def test_gradient_checkpointing_gives_same_loss_and_grads():
    plain = build_backbone(small_config())
    ckpt = build_backbone(small_config("trainer.enable_gradient_checkpointing=true"))
    assert ckpt.transformer.gradient_checkpointing and not plain.transformer.gradient_checkpointing
    lat = plain.encode_video(_clip(5))
    out = []
    for bb in (plain, ckpt):
        torch.manual_seed(0)
        loss = bb.video_flow_matching_loss(lat, _prompts())
        loss.backward()
        out.append((loss.detach(), bb.transformer.proj_out.weight.grad.clone()))
    torch.testing.assert_close(out[0][0], out[1][0])
    torch.testing.assert_close(out[0][1], out[1][1])
