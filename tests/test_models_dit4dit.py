"""DiT4DiT composition: the batch boundary, losses per mode, gradient routing, training,
inference, trainable weights."""

import dataclasses

import pytest
import torch

from dit4dit_npu.batch import BatchError, BatchSpec
from dit4dit_npu.config import ConfigError
from dit4dit_npu.models import DiT4DiT
from dit4dit_npu.models.prompt_cache import PromptCache, PromptCacheError
from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder
from dit4dit_npu.weights.testing import INSTRUCTIONS, make_batch, small_config, small_spec


@pytest.fixture(scope="module")
def cache() -> PromptCache:
    c = PromptCache()
    c.build(INSTRUCTIONS, build_prompt_encoder(small_config()))
    return c


def _model(cache: PromptCache, *overrides: str, spec: BatchSpec | None = None) -> DiT4DiT:
    cfg = small_config(*overrides)
    model = build_dit4dit(cfg, spec or small_spec(cfg))
    model.set_prompt_cache(cache)
    return model


def _total(out: dict[str, torch.Tensor], video_weight: float = 1.0) -> torch.Tensor:
    return out["action_loss"] + video_weight * out["video_loss"]  # the trainer's weighting


def _train(model: DiT4DiT, batch, steps: int, lr: float = 3e-3) -> list[dict[str, float]]:
    """Adam on one batch with the *same* noise draws every step (re-seeded): the flow-matching
    losses then have a fixed regression target and must be fit, while fresh noise would leave an
    irreducible variance no small model fits in a few steps."""
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    hist = []
    for _ in range(steps):
        torch.manual_seed(0)
        out = model(batch)
        opt.zero_grad(set_to_none=True)
        _total(out).backward()
        opt.step()
        hist.append({k: v.item() for k, v in out.items()} | {"total": _total(out).item()})
    return hist


def _grads(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad for p in module.parameters() if p.grad is not None and p.grad.abs().sum() > 0]


def test_forward_returns_the_two_losses(cache):
    cfg = small_config()
    spec = small_spec(cfg, frame_size=(32, 48))  # e.g. 3 views of 32 x 16, tiled by PolicyIO
    out = _model(cache, spec=spec)(make_batch(spec))
    assert set(out) == {"action_loss", "video_loss"}  # their weighting is the trainer's
    assert all(v.ndim == 0 and v.dtype == torch.float32 for v in out.values())
    assert out["action_loss"] > 0 and out["video_loss"] > 0


def test_action_loss_does_not_reach_the_transformer_by_default(cache):
    model = _model(cache)
    out = model(make_batch(model.spec))
    out["action_loss"].backward(retain_graph=True)
    assert not _grads(model.backbone.transformer)
    assert _grads(model.action_model)
    out["video_loss"].backward()
    assert _grads(model.backbone.transformer)
    assert all(p.grad is None for p in model.backbone.vae.parameters())


def test_backprop_action_to_backbone_flag(cache):
    model = _model(cache, "framework.cosmos25.backprop_action_to_backbone=true")
    model(make_batch(model.spec))["action_loss"].backward()
    blocks = model.backbone.transformer.transformer_blocks
    assert _grads(blocks[0]) and _grads(blocks[1])  # blocks up to extract_layer=1
    assert not _grads(blocks[2]) and not _grads(model.backbone.transformer.proj_out)
    assert _grads(model.action_model)


@pytest.mark.parametrize("mode", ["joint", "action", "video"])
def test_all_modes_build_and_train(cache, mode):
    model = _model(cache, f"framework.cosmos25.training={mode}")
    batch = make_batch(model.spec)
    if mode == "video":
        assert model.action_model is None
        with pytest.raises(ConfigError, match="training: predict_action needs an action head"):
            model.predict_action(batch)
    if mode == "action":
        assert not any(p.requires_grad for p in model.backbone.transformer.parameters())
    hist = _train(model, batch, steps=12)
    first, last = hist[0], hist[-1]
    assert last["total"] < 0.7 * first["total"]
    if mode == "action":
        assert first["video_loss"] == 0.0 == last["video_loss"]
    if mode == "video":
        assert first["action_loss"] == 0.0 == last["action_loss"]


def test_action_mode_runs_no_video_pass(cache):
    model = _model(cache, "framework.cosmos25.training=action")
    calls = []
    h = model.backbone.transformer.register_forward_hook(lambda *a: calls.append(1))
    model(make_batch(model.spec))
    h.remove()
    assert not calls  # the feature pass uses the blocks directly; no full transformer forward


@pytest.mark.slow  # over 4 s of one core: the full tier (the fast tier keeps to 3 minutes)
def test_tiny_model_overfits_one_batch(cache):
    model = _model(cache)
    hist = _train(model, make_batch(model.spec), steps=60)
    for key in ("action_loss", "video_loss"):
        assert hist[-1][key] < hist[0][key] / 10, (key, hist[0][key], hist[-1][key])


def test_widths_come_from_the_spec(cache):
    """Padded widths wider than the robot's (e.g. sin/cos state, max_action_dim > action dims)
    are whatever PolicyIO says: the model takes them as they are, with no config copy to match."""
    cfg = small_config()
    spec = small_spec(cfg, state_width=28, action_width=16)
    model = _model(cache, spec=spec)
    batch = make_batch(spec)
    batch.action_mask[..., 14:] = False  # 14 real dims, 2 padding
    out = model(batch)
    _total(out).backward()
    assert torch.isfinite(out["action_loss"])
    assert model.predict_action(batch, seed=0).shape == (2, spec.chunk_length, 16)
    no_state = dataclasses.replace(spec, state_width=0)
    model = _model(cache, spec=no_state)
    assert model.action_model.state_encoder is None
    assert model.predict_action(make_batch(no_state, training=False), seed=0).shape == (2, spec.chunk_length, 16)


def test_predict_action_is_deterministic_and_uses_frame_zero_only(cache):
    model = _model(cache)
    spec = model.spec
    model.train()
    clip = make_batch(spec, training=False, num_frames=spec.num_frames)
    a = model.predict_action(clip, seed=3)
    assert a.shape == (2, spec.chunk_length, spec.action_width)
    assert a.dtype == torch.float32 and model.training  # mode restored
    torch.testing.assert_close(model.predict_action(clip, seed=3), a, rtol=0, atol=0)
    assert (model.predict_action(clip, seed=4) - a).abs().max() > 1e-4
    one = dataclasses.replace(clip, frames=clip.frames[:, :1])  # T == 1 at inference
    torch.testing.assert_close(model.predict_action(one, seed=3), a, rtol=1e-5, atol=1e-6)
    other_frame = dataclasses.replace(clip, frames=clip.frames.flip(0))
    assert (model.predict_action(other_frame, seed=3) - a).abs().max() > 1e-4
    # a row's chunk does not depend on the batch it came in
    row1 = dataclasses.replace(clip, frames=clip.frames[1:], instruction=clip.instruction[1:], state=clip.state[1:])
    torch.testing.assert_close(model.predict_action(row1, seed=3)[0], a[1], rtol=1e-5, atol=1e-6)


def test_trainable_state_dict_round_trip(tmp_path, cache):
    from safetensors.torch import load_file, save_file

    model = _model(cache)
    spec = model.spec
    _train(model, make_batch(spec), steps=2)
    sd = model.trainable_state_dict()
    assert any(k.startswith("backbone.transformer.") for k in sd) and any(
        k.startswith("action_model.") for k in sd
    )
    assert not any(k.startswith("backbone.vae.") for k in sd)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "w.safetensors"))
    fresh = _model(cache)
    obs = make_batch(spec, training=False, seed=5)
    assert (fresh.predict_action(obs, seed=0) - model.predict_action(obs, seed=0)).abs().max() > 1e-5
    fresh.load_trainable_state_dict(load_file(str(tmp_path / "w.safetensors")))
    torch.testing.assert_close(
        fresh.predict_action(obs, seed=0), model.predict_action(obs, seed=0), rtol=0, atol=0
    )
    fresh.eval(), model.eval()
    batch = make_batch(spec, seed=6)
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
    cfg = small_config()
    spec = small_spec(cfg, frame_size=(16, 48))
    model = _model(cache, spec=spec)
    obs = make_batch(spec, training=False)
    video = model.imagine_video(obs, num_steps=2, seed=0)
    assert video.shape == (2, 5, 3, 16, 48) and video.dtype == torch.uint8
    assert torch.equal(video, model.imagine_video(obs, num_steps=2, seed=0))


def test_batches_are_validated_at_the_boundary(cache):
    model = _model(cache)
    spec = model.spec
    good = make_batch(spec)
    cases = [
        (dataclasses.replace(good, frames=good.frames[:, :, None]), r"frames: expected uint8 \(B, T, 3, H, W\)"),
        (dataclasses.replace(good, frames=good.frames.float() / 255), "frames: expected uint8"),
        (dataclasses.replace(good, frames=good.frames[..., :16]), r"frame size \(32, 16\), expected \(32, 32\)"),
        (dataclasses.replace(good, frames=good.frames[:, :3]), "3 clip frames, expected 5"),
        (dataclasses.replace(good, action=torch.zeros(2, 4, 9)), r"batch\.action: expected .*\(2, 4, 6\)"),
        (dataclasses.replace(good, state=None), r"batch\.state: missing"),
        (dataclasses.replace(good, action_mask=None), r"batch\.action_mask: missing"),
    ]
    for bad, message in cases:
        with pytest.raises(BatchError, match=message):
            model(bad)
    with pytest.raises(BatchError, match="frame size"):
        model.predict_action(dataclasses.replace(good, frames=good.frames[..., :16]))
    with pytest.raises(PromptCacheError, match="'an unseen instruction'"):
        model(dataclasses.replace(good, instruction=["an unseen instruction", INSTRUCTIONS[0]]))
    cfg = small_config()
    with pytest.raises(PromptCacheError, match="set_prompt_cache"):
        build_dit4dit(cfg, spec)(good)


def test_bf16_autocast_and_bf16_weights(cache):
    """The real run: bf16 autocast over fp32 master weights, or a whole-model bf16 cast
    (DeepSpeed bf16); the head still returns fp32 and losses stay fp32 and finite."""
    model = _model(cache, "trainer.mixed_precision=bf16")
    assert model.autocast
    batch = make_batch(model.spec)
    for m in (model, model.to(torch.bfloat16)):
        out = m(batch)
        _total(out).backward()
        assert all(v.dtype == torch.float32 and torch.isfinite(v) for v in out.values())
        assert _grads(m.backbone.transformer) and _grads(m.action_model)
        m.zero_grad(set_to_none=True)
        assert m.predict_action(batch, seed=0).dtype == torch.float32
