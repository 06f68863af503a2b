"""DiT4DiT composition: losses per mode, gradient routing, training, inference, trainable weights."""

import pytest
import torch

from dit4dit_npu.config import ConfigError
from dit4dit_npu.models import (
    ActionInputError,
    DiT4DiT,
    FrameInputError,
    PromptCache,
    PromptCacheError,
    build_dit4dit,
    build_prompt_encoder,
)
from dit4dit_npu.models.testing import INSTRUCTIONS, make_batch, small_config


@pytest.fixture(scope="module")
def cache() -> PromptCache:
    c = PromptCache()
    c.build(INSTRUCTIONS, build_prompt_encoder(small_config()))
    return c


def _model(cache: PromptCache, *overrides: str) -> DiT4DiT:
    model = build_dit4dit(small_config(*overrides))
    model.set_prompt_cache(cache)
    return model


def _train(model: DiT4DiT, batch: dict, steps: int, lr: float = 3e-3) -> list[dict[str, float]]:
    """Adam on one batch with the *same* noise draws every step (re-seeded): the flow-matching
    losses then have a fixed regression target and must be fit, while fresh noise would leave an
    irreducible variance no small model fits in a few steps."""
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    hist = []
    for _ in range(steps):
        torch.manual_seed(0)
        out = model(batch)
        opt.zero_grad(set_to_none=True)
        out["total_loss"].backward()
        opt.step()
        hist.append({k: v.item() for k, v in out.items()})
    return hist


def _grads(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad for p in module.parameters() if p.grad is not None and p.grad.abs().sum() > 0]


def test_forward_keys_shapes_and_total(cache):
    model = _model(cache, "trainer.loss_scale.future_video=0.5")
    out = model(make_batch(small_config(), num_views=2, size=(32, 16)))
    assert set(out) == {"action_loss", "video_loss", "total_loss"}
    assert all(v.ndim == 0 and v.dtype == torch.float32 for v in out.values())
    assert out["action_loss"] > 0 and out["video_loss"] > 0
    torch.testing.assert_close(out["total_loss"], out["action_loss"] + 0.5 * out["video_loss"])


def test_action_loss_does_not_reach_the_transformer_by_default(cache):
    model = _model(cache)
    out = model(make_batch(small_config()))
    out["action_loss"].backward(retain_graph=True)
    assert not _grads(model.backbone.transformer)
    assert _grads(model.action_model)
    out["video_loss"].backward()
    assert _grads(model.backbone.transformer)
    assert all(p.grad is None for p in model.backbone.vae.parameters())


def test_backprop_action_to_backbone_flag(cache):
    model = _model(cache, "framework.cosmos25.backprop_action_to_backbone=true")
    model(make_batch(small_config()))["action_loss"].backward()
    blocks = model.backbone.transformer.transformer_blocks
    assert _grads(blocks[0]) and _grads(blocks[1])  # blocks up to extract_layer=1
    assert not _grads(blocks[2]) and not _grads(model.backbone.transformer.proj_out)


@pytest.mark.parametrize("mode", ["joint", "action", "video"])
def test_all_modes_build_and_train(cache, mode):
    model = _model(cache, f"framework.cosmos25.training={mode}")
    batch = make_batch(small_config())
    if mode == "video":
        assert model.action_model is None
        with pytest.raises(ConfigError, match="video"):
            model.predict_action(batch)
    if mode == "action":
        assert not any(p.requires_grad for p in model.backbone.transformer.parameters())
    hist = _train(model, batch, steps=12)
    first, last = hist[0], hist[-1]
    assert last["total_loss"] < 0.7 * first["total_loss"]
    if mode == "action":
        assert first["video_loss"] == 0.0 == last["video_loss"]
    if mode == "video":
        assert first["action_loss"] == 0.0 == last["action_loss"]


def test_action_mode_runs_no_video_pass(cache):
    model = _model(cache, "framework.cosmos25.training=action")
    calls = []
    h = model.backbone.transformer.register_forward_hook(lambda *a: calls.append(1))
    model(make_batch(small_config()))
    h.remove()
    assert not calls  # the feature pass uses the blocks directly; no full transformer forward


def test_tiny_model_overfits_one_batch(cache):
    model = _model(cache)
    hist = _train(model, make_batch(small_config()), steps=60)
    for key in ("action_loss", "video_loss"):
        assert hist[-1][key] < hist[0][key] / 10, (key, hist[0][key], hist[-1][key])


def test_predict_action_is_deterministic_and_uses_frame_zero_only(cache):
    cfg = small_config()
    model = _model(cache)
    model.train()
    obs = make_batch(cfg, training=False)
    a = model.predict_action(obs, seed=3)
    assert a.shape == (2, cfg.framework.action_model.chunk_length, cfg.framework.action_model.action_dim)
    assert a.dtype == torch.float32 and model.training  # mode restored
    torch.testing.assert_close(model.predict_action(obs, seed=3), a, rtol=0, atol=0)
    assert (model.predict_action(obs, seed=4) - a).abs().max() > 1e-4
    one = dict(obs, frames=obs["frames"][:, :1])  # T == 1 at inference
    torch.testing.assert_close(model.predict_action(one, seed=3), a, rtol=1e-5, atol=1e-6)
    other_frame = dict(obs, frames=obs["frames"].flip(0))
    assert (model.predict_action(other_frame, seed=3) - a).abs().max() > 1e-4
    # a row's chunk does not depend on the batch it came in
    row1 = {k: v[1:] for k, v in obs.items()}
    torch.testing.assert_close(model.predict_action(row1, seed=3)[0], a[1], rtol=1e-5, atol=1e-6)


def test_trainable_state_dict_round_trip(tmp_path, cache):
    from safetensors.torch import load_file, save_file

    cfg = small_config()
    model = _model(cache)
    _train(model, make_batch(cfg), steps=2)
    sd = model.trainable_state_dict()
    assert any(k.startswith("backbone.transformer.") for k in sd) and any(
        k.startswith("action_model.") for k in sd
    )
    assert not any(k.startswith("backbone.vae.") for k in sd)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "w.safetensors"))
    fresh = _model(cache)
    obs = make_batch(cfg, training=False, seed=5)
    assert (fresh.predict_action(obs, seed=0) - model.predict_action(obs, seed=0)).abs().max() > 1e-5
    fresh.load_trainable_state_dict(load_file(str(tmp_path / "w.safetensors")))
    torch.testing.assert_close(
        fresh.predict_action(obs, seed=0), model.predict_action(obs, seed=0), rtol=0, atol=0
    )
    fresh.eval(), model.eval()
    batch = make_batch(cfg, seed=6)
    torch.manual_seed(0)
    a = model(batch)
    torch.manual_seed(0)
    b = fresh(batch)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    with pytest.raises(KeyError, match="1 missing"):
        fresh.load_trainable_state_dict({k: v for k, v in sd.items() if k != next(iter(sd))})


def test_action_mode_saves_only_the_head(cache):
    model = _model(cache, "framework.cosmos25.training=action")
    assert all(k.startswith("action_model.") for k in model.trainable_state_dict())


def test_vae_stays_eval(cache):
    model = _model(cache)
    model.train()
    assert model.action_model.training and not model.backbone.vae.training


def test_imagine_video(cache):
    model = _model(cache)
    obs = make_batch(small_config(), training=False, num_views=3, size=(16, 16))
    video = model.imagine_video(obs, num_steps=2, seed=0)
    assert video.shape == (2, 5, 3, 16, 48) and video.dtype == torch.uint8
    assert torch.equal(video, model.imagine_video(obs, num_steps=2, seed=0))


def test_reference_paths_match_ours_where_math_is_equal(cache):
    cfg = small_config()
    batch = make_batch(cfg)
    ours = _model(cache)
    ref = build_dit4dit(
        small_config(
            "framework.cosmos25.reference_text_encoder_per_step=true",
            "framework.cosmos25.reference_full_depth_feature_pass=true",
        ),
        reference_copied_repeats=True,
    )
    enc = ref.prompt_encoder
    calls = []
    h = enc.language_model.register_forward_hook(lambda *a: calls.append(1))
    torch.manual_seed(0)
    a = ours(batch)
    torch.manual_seed(0)
    b = ref(batch)
    torch.manual_seed(0)
    ref(batch)
    h.remove()
    assert len(calls) == 2  # the reference runs the text encoder every step
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_reference_separate_condition_encode_encodes_per_sample(cache):
    model = _model(cache, "framework.cosmos25.reference_separate_condition_encode=true")
    shapes = []
    h = model.backbone.vae.encoder.register_forward_hook(lambda m, i, o: shapes.append(i[0].shape[0]))
    model(make_batch(small_config(), batch_size=3))
    h.remove()
    # the Wan encoder runs once per 1+4 frame chunk: 2 chunks batched + 2 chunks x 3 samples
    assert shapes == [3, 3, 1, 1, 1, 1, 1, 1]


def test_bad_inputs_are_clear_errors(cache):
    cfg = small_config()
    model = _model(cache)
    with pytest.raises(FrameInputError, match="divisible by 16"):
        model(make_batch(cfg, size=(24, 32)))
    with pytest.raises(FrameInputError, match=r"\(B, T, V, 3, H, W\)"):
        model(dict(make_batch(cfg), frames=torch.zeros(2, 5, 3, 32, 32, dtype=torch.uint8)))
    wide = make_batch(cfg)
    wide["action"] = torch.zeros(2, 4, 9)
    wide["action_mask"] = torch.ones(2, 4, 9, dtype=torch.bool)
    with pytest.raises(ActionInputError, match="action has 9 dims"):
        model(wide)
    with pytest.raises(PromptCacheError, match="'an unseen instruction'"):
        model(dict(make_batch(cfg), instruction=["an unseen instruction", INSTRUCTIONS[0]]))
    with pytest.raises(PromptCacheError, match="set_prompt_cache"):
        build_dit4dit(cfg)(make_batch(cfg))
    with pytest.raises(ConfigError, match="extract_layer: got 5"):
        build_dit4dit(small_config("framework.cosmos25.extract_layer=5"))


def test_bf16_autocast_and_bf16_weights(cache):
    """The real run: bf16 autocast over fp32 master weights, or a whole-model bf16 cast
    (DeepSpeed bf16); the head still returns fp32 and losses stay fp32 and finite."""
    model = _model(cache, "trainer.mixed_precision=bf16")
    assert model.autocast_enabled
    batch = make_batch(small_config())
    for m in (model, model.to(torch.bfloat16)):
        out = m(batch)
        out["total_loss"].backward()
        assert all(v.dtype == torch.float32 and torch.isfinite(v) for v in out.values())
        assert _grads(m.backbone.transformer) and _grads(m.action_model)
        m.zero_grad(set_to_none=True)
        assert m.predict_action(batch, seed=0).dtype == torch.float32
