"""Explicit noise (replayable calls) and DiT4DiT's model conventions as options: the conditioning
latent as a posterior sample, timesteps rounded to the compute dtype."""

import numpy as np
import pytest
import torch

from dit4dit_npu import device as dev
from dit4dit_npu.models.noise import InferenceNoise, NoiseError, TrainingNoise
from dit4dit_npu.models.prompt_cache import PromptCache
from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder
from dit4dit_npu.weights.testing import INSTRUCTIONS, make_batch, small_config, small_spec

SAMPLE = "framework.cosmos25.condition_latent=sample"


@pytest.fixture(scope="module")
def cache() -> PromptCache:
    c = PromptCache()
    c.build(INSTRUCTIONS, build_prompt_encoder(small_config()))
    return c


def _model(cache, *overrides):
    cfg = small_config(*overrides)
    model = build_dit4dit(cfg, small_spec(cfg)).eval()
    model.set_prompt_cache(cache)
    return model, small_spec(cfg)


def _inference_noise(model, spec, b, seed, condition=True):
    g = torch.Generator().manual_seed(seed)
    h, w = spec.frame_size[0] // 8, spec.frame_size[1] // 8
    return InferenceNoise(
        action=torch.randn(b, spec.chunk_length, spec.action_width, generator=g),
        feature=torch.randn(b, 16, model.feature_latent_frames, h, w, generator=g),
        condition=torch.randn(b, 16, 1, h, w, generator=g) if condition else None,
    )


def test_predict_action_replays_exactly_whatever_the_global_rng(cache):
    model, spec = _model(cache, SAMPLE, "framework.cosmos25.feature_noise_seed=null")
    batch = make_batch(spec, batch_size=2, training=False)
    noise = _inference_noise(model, spec, 2, 0)
    torch.manual_seed(1)
    a = model.predict_action(batch, noise=noise)
    torch.manual_seed(2)
    b = model.predict_action(batch, noise={k: getattr(noise, k).numpy() for k in ("action", "feature", "condition")})
    assert torch.equal(a, b)
    torch.manual_seed(1)
    unseeded = model.predict_action(batch)
    assert not torch.allclose(a, unseeded)  # the noise given is what was used
    other = _inference_noise(model, spec, 2, 5)
    for field in ("action", "feature", "condition"):  # each draw reaches the output
        swapped = InferenceNoise(**{k: getattr(other if k == field else noise, k) for k in ("action", "feature", "condition")})
        assert not torch.allclose(model.predict_action(batch, noise=swapped), a), field


def test_condition_sample_equals_mean_plus_std_eps(cache):
    model, spec = _model(cache, SAMPLE)
    video = model.video_input(make_batch(spec, training=False).frames)
    dist = model.backbone.vae.encode(video).latent_dist
    eps = torch.randn(2, 16, 1, spec.frame_size[0] // 8, spec.frame_size[1] // 8)
    latents, cond = model.backbone.encode_clip(video, eps)
    mean, std = dist.mean[:, :, :1], torch.exp(0.5 * dist.logvar[:, :, :1].clamp(-30.0, 20.0))
    torch.testing.assert_close(cond, model.backbone.normalize(mean + std * eps))
    torch.testing.assert_close(latents, model.backbone.normalize(dist.mean))  # the targets stay the mean
    _, cond0 = model.backbone.encode_clip(video, torch.zeros_like(eps))
    torch.testing.assert_close(cond0, latents[:, :, :1])


def test_condition_noise_needs_the_sample_option(cache):
    model, spec = _model(cache)
    batch = make_batch(spec, training=False)
    noise = _inference_noise(model, spec, 2, 0)
    with pytest.raises(NoiseError, match="noise.condition: this model conditions on the posterior mean"):
        model.predict_action(batch, noise=noise)


@pytest.mark.parametrize(
    "field, shape, message",
    [("action", (2, 1, 1), "noise.action: expected shape"), ("feature", (1, 16, 1, 4, 4), "noise.feature: expected")],
)
def test_wrong_noise_shape_is_one_line(cache, field, shape, message):
    model, spec = _model(cache)
    with pytest.raises(NoiseError, match=message):
        model.predict_action(make_batch(spec, training=False), noise={field: np.zeros(shape, np.float32)})
    with pytest.raises(NoiseError, match="unknown field"):
        model.predict_action(make_batch(spec, training=False), noise={"latents": np.zeros(3, np.float32)})


def test_training_noise_replays_and_repeats_are_an_axis(cache):
    model, spec = _model(cache, SAMPLE)
    batch = make_batch(spec, batch_size=2)
    b, r = 2, model.action_model.repeats
    h, w = spec.frame_size[0] // 8, spec.frame_size[1] // 8
    t_lat = model.feature_latent_frames
    g = torch.Generator().manual_seed(0)
    noise = TrainingNoise(
        condition=torch.randn(b, 16, 1, h, w, generator=g),
        feature=torch.randn(b, 16, t_lat, h, w, generator=g),
        video_time=torch.rand(b, generator=g),
        video=torch.randn(b, 16, t_lat - 1, h, w, generator=g),
        action=torch.randn(b, r, spec.chunk_length, spec.action_width, generator=g),
        action_time=torch.rand(b, r, generator=g),
    )
    with torch.no_grad():
        torch.manual_seed(1)
        first = model(batch, noise=noise)
        torch.manual_seed(2)
        again = model(batch, noise=noise)
        # repeats of one sample are exchangeable: the loss is a mean over them
        flipped = model(batch, noise=TrainingNoise(**{**noise.__dict__, "action": noise.action.flip(1),
                                                      "action_time": noise.action_time.flip(1)}))
        other = model(batch, noise=TrainingNoise(**{**noise.__dict__, "action": noise.action.flip(0)}))
    assert all(torch.equal(first[k], again[k]) for k in first)
    torch.testing.assert_close(first["action_loss"], flipped["action_loss"])
    assert not torch.allclose(first["action_loss"], other["action_loss"])  # but not between samples


def test_round_timesteps_to_the_compute_dtype(cache):
    """DiT4DiT cast sigma to the transformer dtype: under bf16 the feature pass sees 0.99609375,
    not 0.99502486; the conditioning frame keeps its fp32 timestep."""
    for rounded in (False, True):
        model, spec = _model(cache, f"framework.cosmos25.round_timesteps={str(rounded).lower()}")
        bb = model.backbone
        cond = torch.zeros(1, 16, 1, 4, 4)
        sigma = torch.full((1,), bb.feature_sigma)
        with dev.autocast():
            tau = bb.transformer_inputs(cond, torch.zeros(1, 16, 2, 4, 4), sigma, torch.zeros(1, 3, 64))["timestep"]
        assert abs(bb.feature_sigma - 0.99502486) < 1e-7
        assert tau[0, 0, 0].item() == float(np.float32(1e-4))  # fp32, not bf16 (which is 1.0014e-4)
        assert tau[0, 0, 1].item() == (0.99609375 if rounded else pytest.approx(0.99502486, abs=1e-7))
        with torch.autocast(dev.device_type(), enabled=False):  # fp32 weights, no autocast: no effect
            tau32 = bb.transformer_inputs(cond, torch.zeros(1, 16, 2, 4, 4), sigma, torch.zeros(1, 3, 64))["timestep"]
        assert tau32[0, 0, 1].item() == pytest.approx(0.99502486, abs=1e-7)


def test_policy_predict_action_passes_noise(tmp_path):
    from policy_fixtures import observation_from_sample, shared_tiny_setup

    from dit4dit_npu import DiT4DiTPolicy

    setup = shared_tiny_setup()
    policy = DiT4DiTPolicy.from_pretrained(setup.policy_dir, device="cpu")
    obs = observation_from_sample(policy.camera_keys, setup.data.train_dataset.raw_sample(0))
    spec = policy.io.spec
    h, w = spec.frame_size[0] // 8, spec.frame_size[1] // 8
    g = torch.Generator().manual_seed(0)
    noise = {"action": torch.randn(1, spec.chunk_length, spec.action_width, generator=g),
             "feature": torch.randn(1, 16, policy.model.feature_latent_frames, h, w, generator=g)}
    torch.manual_seed(3)
    a = policy.predict_action(obs, noise=noise)
    torch.manual_seed(4)
    assert np.array_equal(a, policy.predict_action(obs, noise=noise))
    assert not np.allclose(a, policy.predict_action(obs, noise={**noise, "action": -noise["action"]}))
