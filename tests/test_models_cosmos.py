"""Video backbone: VAE encode, early-exit feature pass, video flow-matching loss."""

import dataclasses

import pytest
import torch

from dit4dit_npu.config import ConfigError, Cosmos25Config, FlowMatchingConfig
from dit4dit_npu.models import CosmosBackbone
from dit4dit_npu.models.cosmos import run_blocks, sample_video_time
from dit4dit_npu.weights import build_backbone
from dit4dit_npu.weights.model_config import backbone_config, video_time
from dit4dit_npu.weights.testing import small_config

H = W = 32  # -> latents 4x4, 2x2 tokens per latent frame


@pytest.fixture(scope="module")
def backbone():
    return build_backbone(small_config())


def _clip(t: int, b: int = 2, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, 3, t, H, W, generator=g) * 2 - 1


def _prompts(b: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, 7, 64, generator=torch.Generator().manual_seed(seed))  # 2 text layers x 32


def hooked_full_pass(transformer: torch.nn.Module, inputs: dict, layer: int) -> torch.Tensor:
    """The original's way to get features: the whole transformer with a forward hook on a block."""
    captured = []
    handle = transformer.transformer_blocks[layer].register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        transformer(**inputs, return_dict=False)
    finally:
        handle.remove()
    return captured[0]


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
    # DiT4DiT multiplied by the std (a bug we do not reproduce): visibly different
    times_std = (z - mean) * torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1)
    assert (backbone.normalize(z) - times_std).abs().max() > 0.1
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


def test_clip_length_padded_to_1_plus_4k(backbone):
    video = _clip(4)
    lat = backbone.encode_video(video)
    assert lat.shape[2] == 2
    padded = torch.cat([video, video[:, :, -1:]], dim=2)  # repeat the last frame
    torch.testing.assert_close(lat, backbone.encode_video(padded))


def test_frame_size_must_be_divisible_by_16(backbone):
    backbone.check_frame_size(32, 48)
    with pytest.raises(ConfigError, match=r"image_size .*: tiled frame 24x32 must be divisible by 16"):
        backbone.check_frame_size(24, 32)


def test_feature_sigma_comes_from_the_scheduler(backbone):
    assert abs(backbone.feature_sigma - 200 / 201) < 1e-4


def test_early_exit_equals_hooked_full_pass(backbone):
    cond = backbone.encode_video(_clip(1))
    inputs = backbone.feature_inputs(cond, _prompts(), num_latent_frames=2, call_seed=7)
    outs = []
    for layer in range(backbone.num_layers):
        ours = run_blocks(backbone.transformer, **inputs, last_block=layer)
        assert ours.shape == (2, 2 * 2 * 2, backbone.hidden_size)
        torch.testing.assert_close(ours, hooked_full_pass(backbone.transformer, inputs, layer), rtol=1e-5, atol=1e-6)
        outs.append(ours)
    # later blocks change the tokens, so stopping early is a real difference in work, not output
    assert (outs[0] - outs[-1]).abs().max() > 1e-3
    # the feature pass is run_blocks at the configured layer (extract_layer=1 in the small config)
    torch.testing.assert_close(backbone.features(cond, _prompts(), 2, call_seed=7), outs[1], rtol=0, atol=0)


def test_feature_pass_builds_a_graph_only_when_asked(backbone):
    cond = backbone.encode_video(_clip(1))
    with torch.enable_grad():
        feats = backbone.features(cond, _prompts(), 2)
        assert not feats.requires_grad and feats.grad_fn is None
        assert backbone.features(cond, _prompts(), 2, grad=True).grad_fn is not None


def test_feature_noise_seeded_and_batch_independent(backbone):
    cond = backbone.encode_video(_clip(1))
    prompts = _prompts()
    unseeded = dataclasses.replace(backbone.cfg, feature_noise_seed=None)
    free = CosmosBackbone(backbone.transformer, backbone.vae, backbone.scheduler, unseeded)
    a = free.features(cond, prompts, 2, call_seed=3)
    torch.testing.assert_close(a, free.features(cond, prompts, 2, call_seed=3), rtol=0, atol=0)
    assert (a - free.features(cond, prompts, 2, call_seed=4)).abs().max() > 1e-4
    # a sample's features do not depend on which batch it came in
    torch.testing.assert_close(free.features(cond[1:], prompts[1:], 2, call_seed=3), a[1:], rtol=1e-5, atol=1e-6)
    # the configured seed (what training saw) wins over a call's seed
    assert backbone.cfg.feature_noise_seed == 42
    torch.testing.assert_close(
        backbone.features(cond, prompts, 2, call_seed=3), free.features(cond, prompts, 2, call_seed=42)
    )


def test_extract_layer_out_of_range(backbone):
    with pytest.raises(ConfigError, match=r"extract_layer: got 3, expected 0\.\.2"):
        CosmosBackbone(backbone.transformer, backbone.vae, backbone.scheduler, backbone_config(Cosmos25Config(extract_layer=3)))


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


def test_video_time_distributions():
    torch.manual_seed(0)
    cfg = video_time(FlowMatchingConfig(time_distribution="logit_normal", high_sigma_ratio=0.5, high_sigma_min=0.98))
    t = sample_video_time(cfg, 20000, torch.device("cpu"))
    assert 0 < t.min() and t.max() < 1
    assert 0.4 < (t >= 0.98).float().mean() < 0.6  # ~half replaced by U[0.98, 1)
    t = sample_video_time(video_time(FlowMatchingConfig(time_distribution="logit_normal")), 20000, torch.device("cpu"))
    assert abs(t.mean().item() - 0.5) < 0.02 and (t >= 0.98).float().mean() < 0.01
    t = sample_video_time(video_time(FlowMatchingConfig()), 20000, torch.device("cpu"))
    assert abs(t.mean().item() - 0.5) < 0.02 and abs((t < 0.25).float().mean().item() - 0.25) < 0.02


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


def test_video_loss_batch_fraction_runs_the_first_samples_only(backbone):
    """video_loss_batch_fraction: the loss of the batch's first ceil(f * B) samples, and only they
    reach the transformer (the saving is real), same explicit draws."""
    lat = backbone.encode_video(_clip(5, b=4))
    prompts = _prompts(b=4)
    g = torch.Generator().manual_seed(3)
    t = torch.rand(4, generator=g)
    z = torch.randn(4, 16, lat.shape[2] - 1, *lat.shape[3:], generator=g)
    half = CosmosBackbone(backbone.transformer, backbone.vae, backbone.scheduler,
                          backbone_config(Cosmos25Config(extract_layer=1, video_loss_batch_fraction=0.5)))
    seen = []
    h = backbone.transformer.register_forward_hook(lambda _m, args, kw, _o: seen.append(kw["hidden_states"].shape[0]),
                                                   with_kwargs=True)
    try:
        sub = half.video_flow_matching_loss(lat, prompts, t=t, z=z)
        first_two = backbone.video_flow_matching_loss(lat[:2], prompts[:2], t=t[:2], z=z[:2])
        whole = backbone.video_flow_matching_loss(lat, prompts, t=t, z=z)
    finally:
        h.remove()
    assert seen == [2, 2, 4]
    torch.testing.assert_close(sub, first_two)
    assert not torch.allclose(sub, whole)
    quarter = CosmosBackbone(backbone.transformer, backbone.vae, backbone.scheduler,
                             backbone_config(Cosmos25Config(extract_layer=1, video_loss_batch_fraction=0.3)))
    torch.testing.assert_close(quarter.video_flow_matching_loss(lat, prompts, t=t, z=z),  # ceil(0.3 * 4) = 2
                               first_two)


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5, float("nan")])
def test_video_loss_batch_fraction_out_of_range_is_one_line(bad):
    with pytest.raises(ConfigError, match=r"framework\.cosmos25\.video_loss_batch_fraction: got .*expected in \(0, 1\]"):
        Cosmos25Config(video_loss_batch_fraction=bad).check("framework.cosmos25")
