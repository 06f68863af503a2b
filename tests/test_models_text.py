"""Prompt encoder (== the diffusers pipeline's embedding) and the prompt cache."""

import logging

import pytest
import torch

from dit4dit_npu.models.prompt_cache import PromptCache, PromptCacheError
from dit4dit_npu.models.text import PromptEncoder
from dit4dit_npu.weights import base_model_folder, build_prompt_encoder
from dit4dit_npu.weights.prompt_cache import load_prompt_cache, save_prompt_cache
from dit4dit_npu.weights.testing import INSTRUCTIONS, small_config


@pytest.fixture(scope="module")
def cfg():
    return small_config()


@pytest.fixture(scope="module")
def encoder(cfg) -> PromptEncoder:
    return build_prompt_encoder(cfg)


class _CountingEncoder:
    """Counts language-model forwards with a hook (independent of PromptEncoder's own counter)."""

    def __init__(self, enc: PromptEncoder):
        self.calls = 0
        self.handle = enc.language_model.register_forward_hook(self._hook)

    def _hook(self, *_):
        self.calls += 1


def test_encoder_matches_diffusers_pipeline(cfg, encoder):
    """The tiny base folder loads as the real pipeline (full VL text encoder, vision tower and
    lm_head included), and our encoder gives exactly its prompt embeddings."""
    from diffusers import Cosmos2_5_PredictBasePipeline

    class NoOpSafetyChecker:  # the pipeline insists on one; tests use random weights only
        def to(self, *a, **k):
            return self

        def check_text_safety(self, prompt):
            return True

    pipe = Cosmos2_5_PredictBasePipeline.from_pretrained(
        str(base_model_folder(cfg)), safety_checker=NoOpSafetyChecker(), local_files_only=True
    )
    assert any("visual" in n for n, _ in pipe.text_encoder.named_modules())
    t = cfg.framework.cosmos25.tiny
    prompts = ["pick up the cup", "a much longer instruction: open the drawer, then the cabinet"]
    ref, _ = pipe.encode_prompt(prompts, do_classifier_free_guidance=False, max_sequence_length=48)
    ours = encoder.encode(prompts)
    assert ours.shape == (2, 48, t.text_hidden_size * t.text_num_layers) == ref.shape
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    # the two prompts differ, and every layer's slice is per-token standardised
    assert not torch.allclose(ours[0], ours[1])
    first = ours[..., : t.text_hidden_size]
    torch.testing.assert_close(first.mean(-1), torch.zeros_like(first.mean(-1)), atol=1e-4, rtol=0)


def test_encoder_holds_no_vision_tower_or_lm_head(encoder):
    names = [n for n, _ in encoder.language_model.named_modules()]
    assert not any("visual" in n or "lm_head" in n for n in names)


def test_cache_hit_does_not_call_text_encoder(encoder):
    cache = PromptCache()
    counter = _CountingEncoder(encoder)
    try:
        assert cache.build(INSTRUCTIONS[:2], encoder) == 2
        calls = counter.calls
        assert calls >= 1
        assert cache.build(INSTRUCTIONS[:2], encoder) == 0  # all cached: nothing computed
        out = cache.lookup([INSTRUCTIONS[1], INSTRUCTIONS[0], INSTRUCTIONS[1]], "cpu", torch.float32)
        assert counter.calls == calls
        assert cache.build(INSTRUCTIONS[:3], encoder) == 1  # only the new one
        assert counter.calls == calls + 1
    finally:
        counter.handle.remove()
    direct = encoder.encode([INSTRUCTIONS[1], INSTRUCTIONS[0]])
    torch.testing.assert_close(out[:2], direct)
    assert torch.equal(out[0], out[2])


def test_cache_miss_names_the_instruction(encoder):
    cache = PromptCache()
    cache.build(INSTRUCTIONS[:1], encoder)
    with pytest.raises(PromptCacheError, match="never seen this one"):
        cache.lookup([INSTRUCTIONS[0], "never seen this one"], "cpu")


def test_cache_tensors_round_trip(encoder):
    odd = 'odd "quotes", newline\n and ünïcode / slashes'
    cache = PromptCache()
    cache.build([INSTRUCTIONS[0], odd], encoder)
    tensors, meta = cache.to_tensors()
    assert all(isinstance(v, str) for v in meta.values()) and len(tensors) == 2
    back = PromptCache.from_tensors(tensors, meta)
    assert sorted(back.instructions) == sorted([INSTRUCTIONS[0], odd])
    assert back.identity == encoder.identity and back.max_sequence_length == 48
    for s in (INSTRUCTIONS[0], odd):
        assert torch.equal(back.lookup([s], "cpu")[0], cache.lookup([s], "cpu")[0])
    with pytest.raises(PromptCacheError, match="not a prompt cache"):
        PromptCache.from_tensors(tensors, {})


def test_cache_file_round_trip(tmp_path, encoder):
    odd = 'odd "quotes", newline\n and ünïcode / slashes'
    cache = PromptCache()
    cache.build([INSTRUCTIONS[0], odd], encoder)
    path = save_prompt_cache(cache, tmp_path / "sub" / "cache.safetensors")
    assert sorted(p.name for p in path.parent.iterdir()) == ["cache.safetensors"]  # no temp file left
    loaded = load_prompt_cache(path, expect_identity=encoder.identity, expect_max_sequence_length=48)
    assert sorted(loaded.instructions) == sorted([INSTRUCTIONS[0], odd])
    for s in (INSTRUCTIONS[0], odd):
        assert torch.equal(loaded.lookup([s], "cpu")[0], cache.lookup([s], "cpu")[0])
    # a loaded cache extends with the same encoder without recomputing what it holds
    assert loaded.build([odd, INSTRUCTIONS[1]], encoder) == 1


def test_cache_of_another_model_is_refused(tmp_path, encoder):
    cache = PromptCache()
    cache.build(INSTRUCTIONS[:1], encoder)
    path = save_prompt_cache(cache, tmp_path / "cache.safetensors")
    with pytest.raises(PromptCacheError, match="other-model"):
        load_prompt_cache(path, expect_identity="other-model")
    with pytest.raises(PromptCacheError, match="max_sequence_length"):
        load_prompt_cache(path, expect_identity=encoder.identity, expect_max_sequence_length=512)
    foreign = PromptCache("other-model", 48)
    with pytest.raises(PromptCacheError, match="other-model"):
        foreign.build(INSTRUCTIONS[:1], encoder)


def test_not_a_cache_file(tmp_path):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(PromptCacheError, match="x.safetensors: not a prompt cache"):
        load_prompt_cache(tmp_path / "x.safetensors")
    with pytest.raises(PromptCacheError, match="not found"):
        load_prompt_cache(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors at all")
    with pytest.raises(PromptCacheError, match="junk.safetensors: not a readable safetensors file"):
        load_prompt_cache(tmp_path / "junk.safetensors")


def test_truncation_is_warned_once(caplog):
    short = build_prompt_encoder(small_config("framework.cosmos25.max_sequence_length=32"))
    with caplog.at_level(logging.WARNING):
        a = short.encode(["pick up the cup", "open the drawer"])
        short.encode(["stack the blocks"])
    warnings = [r for r in caplog.records if "truncated to max_sequence_length=32" in r.getMessage()]
    assert len(warnings) == 1
    # here the chat template's system prompt fills all 32 tokens: the instructions are lost
    torch.testing.assert_close(a[0], a[1])
