"""weights/: the model a run config describes, the tiny folder, loading a diffusers folder."""

import dataclasses
import json
import logging
import re
import shutil

import pytest
import torch

from dit4dit_npu.config import ConfigError
from dit4dit_npu.models import tiny
from dit4dit_npu.weights import (
    TINY_CACHE_ENV,
    base_model_folder,
    build_action_head,
    build_backbone,
    build_dit4dit,
    build_prompt_encoder,
    build_vae,
    load_weights,
    save_tiny_base_model,
    text_identity,
    tiny_base_model,
    tiny_cache_root,
)
from dit4dit_npu.weights.model_config import (
    backbone_config,
    dit4dit_config,
    lora_adapter_config,
    run_head_config,
    tiny_sizes,
)
from dit4dit_npu.weights.testing import small_config, small_spec


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """A real-layout folder at a path of its own (as a user's Cosmos-Predict2.5-2B folder)."""
    return save_tiny_base_model(small_config(), tmp_path_factory.mktemp("cosmos") / "Cosmos-Predict2.5-2B")


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tiny_is_reproducible_from_config():
    cfg = small_config()
    torch.manual_seed(123)
    before = torch.rand(1)
    a = build_dit4dit(cfg, small_spec(cfg))
    torch.manual_seed(123)
    b = build_dit4dit(cfg, small_spec(cfg))
    assert torch.equal(torch.rand(1), before)  # building never consumes the caller's RNG
    assert _same(a, b)
    other = small_config("framework.cosmos25.tiny.seed=1")
    c = build_dit4dit(other, small_spec(other))
    assert not _same(a.backbone.transformer, c.backbone.transformer)
    assert _same(a.action_model, c.action_model)  # head init comes from the run seed


def test_tiny_sizes_follow_config():
    cfg = small_config("framework.cosmos25.tiny.num_layers=5", "framework.cosmos25.tiny.text_num_layers=3")
    bb = build_backbone(cfg)
    assert bb.num_layers == 5 and bb.hidden_size == 32
    assert bb.transformer.config.crossattn_proj_in_channels == 3 * 32
    assert build_prompt_encoder(cfg).embed_dim == 3 * 32


def test_tiny_is_a_folder_laid_out_like_the_real_one():
    cfg = small_config()
    folder = base_model_folder(cfg)
    assert folder.parent == tiny_cache_root()
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "Cosmos2_5_PredictBasePipeline"
    assert index["transformer"] == ["diffusers", "CosmosTransformer3DModel"]
    assert index["vae"] == ["diffusers", "AutoencoderKLWan"]
    assert index["text_encoder"] == ["transformers", "Qwen2_5_VLForConditionalGeneration"]
    assert index["scheduler"] == ["diffusers", "UniPCMultistepScheduler"]
    for part in ("transformer", "vae", "text_encoder"):
        assert list((folder / part).glob("*.safetensors")), part
    assert (folder / "tokenizer" / "tokenizer_config.json").is_file()
    # the weights are exactly the tiny modules (save/load is lossless), and what the build loads
    sizes = cfg.framework.cosmos25.tiny
    assert _same(build_backbone(cfg).transformer, tiny.build_transformer(sizes))
    assert _same(build_backbone(cfg).vae, tiny.build_vae(sizes))


def test_tiny_folder_is_written_once_and_keyed_by_sizes(tmp_path, monkeypatch):
    monkeypatch.setenv(TINY_CACHE_ENV, str(tmp_path / "cache"))
    sizes = small_config().framework.cosmos25.tiny
    first = tiny_base_model(sizes)
    assert first.parent == tmp_path / "cache" and (first / "model_index.json").is_file()
    stamp = (first / "transformer" / "config.json").stat().st_mtime_ns
    assert tiny_base_model(sizes) == first
    assert (first / "transformer" / "config.json").stat().st_mtime_ns == stamp  # not rewritten
    other = tiny_base_model(small_config("framework.cosmos25.tiny.seed=1").framework.cosmos25.tiny)
    assert other != first
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([first.name, other.name])  # no temp left


def test_tiny_and_a_folder_load_through_the_same_code(base_dir):
    cfg = small_config()
    from_dir = small_config(f"framework.cosmos25.base_model={base_dir}")
    assert _same(build_backbone(from_dir), build_backbone(cfg))
    ours, loaded = build_prompt_encoder(cfg), build_prompt_encoder(from_dir)
    assert not any("visual" in n for n, _ in loaded.language_model.named_modules())
    torch.testing.assert_close(loaded.encode(["pick up the cup"]), ours.encode(["pick up the cup"]))
    # the tiny identity is the config's (path- and version-independent); a folder's is its content
    assert ours.identity == text_identity(cfg) and ours.identity.startswith("tiny:")
    assert loaded.identity.startswith("cosmos25:") and loaded.identity != ours.identity


def test_weights_load_in_the_asked_dtype_on_the_installed_libraries(base_dir):
    """The weights loader in bf16 (what accelerators use for the frozen parts): the dtype keyword
    differs between diffusers versions (< 0.40 rejects dtype=), so this runs on the minimums too."""
    from diffusers import AutoencoderKLWan, CosmosTransformer3DModel
    from transformers import Qwen2_5_VLForConditionalGeneration

    for loader, part in (
        (CosmosTransformer3DModel, "transformer"),
        (AutoencoderKLWan, "vae"),
        (Qwen2_5_VLForConditionalGeneration, "text_encoder"),
    ):
        module = load_weights(loader, base_dir, part, torch.bfloat16)
        assert {p.dtype for p in module.parameters()} == {torch.bfloat16}, part


def test_missing_folder_is_a_clear_error(tmp_path):
    cfg = small_config(f"framework.cosmos25.base_model={tmp_path / 'nope'}")
    with pytest.raises(ConfigError, match=r"base_model: .*nope.* neither 'tiny' nor a folder.*transformer/"):
        build_backbone(cfg)


def test_partial_folder_names_the_missing_component(tmp_path, base_dir):
    partial = tmp_path / "partial"
    shutil.copytree(base_dir, partial)
    shutil.rmtree(partial / "vae")
    (partial / "tokenizer" / "tokenizer_config.json").unlink()
    cfg = small_config(f"framework.cosmos25.base_model={partial}")
    with pytest.raises(ConfigError, match=r"missing vae/config\.json"):
        build_backbone(cfg)
    with pytest.raises(ConfigError, match=r"missing tokenizer/tokenizer_config\.json"):
        build_prompt_encoder(cfg)


def test_component_without_weights_is_a_clear_error(tmp_path, base_dir):
    broken = tmp_path / "broken"
    shutil.copytree(base_dir, broken)
    for f in (broken / "transformer").glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ConfigError, match="cannot load .*transformer"):
        build_backbone(small_config(f"framework.cosmos25.base_model={broken}"))


def test_model_config_errors_name_the_run_key():
    cfg = small_config("framework.cosmos25.extract_layer=5")
    with pytest.raises(ConfigError, match=r"^framework\.cosmos25\.extract_layer: got 5, expected 0\.\.2"):
        build_dit4dit(cfg, small_spec(cfg))
    cfg = small_config()
    with pytest.raises(ConfigError, match=r"^datasets\.vla_data\.image_size .*24x32 must be divisible by 16"):
        build_dit4dit(cfg, small_spec(cfg, frame_size=(24, 32)))
    with pytest.raises(ConfigError, match=r"^framework\.action_model\.chunk_length: .* 4 steps .* 6"):
        build_dit4dit(cfg, small_spec(small_config("framework.action_model.chunk_length=6")))
    with pytest.raises(ConfigError, match=r"^framework\.cosmos25\.tiny\.attention_head_dim: got 10"):
        small_config("framework.cosmos25.tiny.attention_head_dim=10")  # refused where it is declared


def test_head_config_from_presets_and_the_spec():
    cfg = small_config(
        "framework.action_model.action_model_type=DiT-B",
        "framework.action_model.input_embedding_dim=96",
        "framework.action_model.diffusion_model_cfg.num_attention_heads=6",
    )
    head = build_action_head(cfg, small_spec(cfg, state_width=28, action_width=16), cross_attention_dim=32)
    a = cfg.framework.action_model
    assert (a.dim, a.num_heads, a.head_dim) == (96, 6, 64)  # overrides, then the DiT-B preset
    assert head.model.blocks[0].attn1.heads == 6 and head.model.blocks[0].attn1.head_dim == 64
    assert (head.state_width, head.action_width, head.chunk_length) == (28, 16, 4)


def test_feature_frames_follow_the_spec_clip(caplog):
    cfg = small_config()
    with caplog.at_level(logging.WARNING):
        model = build_dit4dit(cfg, small_spec(cfg, num_frames=4))
    assert model.feature_latent_frames == 2  # 4 frames pad to 5 -> 2 latent frames
    assert [r for r in caplog.records if "not 1 + 4k" in r.getMessage()]
    assert build_dit4dit(cfg, small_spec(cfg, num_frames=9)).feature_latent_frames == 3


def test_a_damaged_tiny_folder_says_how_to_fix_it(tmp_path, monkeypatch, base_dir):
    """The tiny folder is the project's own cache: its load error says to delete it (a real
    Cosmos folder's does not)."""
    monkeypatch.setenv(TINY_CACHE_ENV, str(tmp_path / "cache"))
    folder = tiny_base_model(small_config().framework.cosmos25.tiny)
    weights = folder / "vae" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ConfigError, match=f"cannot load .*vae.*the cached tiny model is damaged: delete {folder},"):
        build_vae(small_config())
    broken = tmp_path / "broken"
    shutil.copytree(base_dir, broken)
    (broken / "vae" / "diffusion_pytorch_model.safetensors").write_bytes(b"x" * 100)
    with pytest.raises(ConfigError, match="cannot load .*vae") as e:
        build_vae(small_config(f"framework.cosmos25.base_model={broken}"))
    assert "cached tiny model" not in str(e.value)


def test_tiny_vae_latent_statistics_follow_config():
    """The tiny VAE normalizes with the statistics the config gives (its own, measured by
    python -m dit4dit_npu.data.latent_stats), else the real Wan2.1 VAE's; raw latents (what a latent cache holds)
    do not depend on them, so the cache's VAE identity does not either."""
    from dit4dit_npu.weights import vae_identity

    real = build_backbone(small_config())
    mean, std = [0.1 * i for i in range(16)], [0.05] * 16
    own = small_config(f"framework.cosmos25.tiny.vae_latents_mean={mean}", f"framework.cosmos25.tiny.vae_latents_std={std}")
    bb = build_backbone(own)
    assert bb.latents_mean.flatten().tolist() == pytest.approx(mean)
    assert bb.latents_std.flatten().tolist() == pytest.approx(std)
    assert real.latents_std.flatten().tolist() != pytest.approx(std)  # default: diffusers' (the real VAE's)
    z = torch.randn(1, 16, 1, 4, 4)
    assert torch.allclose(bb.normalize(z), (z - torch.tensor(mean).view(1, -1, 1, 1, 1)) / 0.05)
    assert _same(bb.vae, real.vae)  # same weights: only the normalization differs
    assert vae_identity(own) == vae_identity(small_config())
    for bad, expected in (
        ([0.05] * 15, "framework.cosmos25.tiny.vae_latents_std: got [0.05"),
        ([0.05] * 15 + [0.0], "framework.cosmos25.tiny.vae_latents_std: got [0.05"),
    ):
        with pytest.raises(ConfigError, match=re.escape(expected)):
            small_config(f"framework.cosmos25.tiny.vae_latents_std={bad}")


def test_the_modules_records_are_derived_from_the_run_config():
    """models/ never sees the run config: weights/model_config.py copies each record's fields from
    the same-named keys and resolves the rest (preset sizes, chunk length, alpha, trainer noise)."""
    cfg = small_config("trainer.state_noise_std=0.3", "framework.cosmos25.lora.rank=2",
                       "framework.cosmos25.feature_noise_seed=7", "framework.cosmos25.training=video")
    c, a = cfg.framework.cosmos25, cfg.framework.action_model
    head = run_head_config(cfg)
    assert (head.dim, head.num_heads, head.head_dim, head.chunk_length) == (a.dim, a.num_heads, a.head_dim, a.chunk_length)
    assert head.state_noise_std == 0.3 and head.diffusion_model_cfg.num_layers == a.diffusion_model_cfg.num_layers
    bb = backbone_config(c)
    assert (bb.extract_layer, bb.feature_noise_seed, bb.flow_matching.time_distribution) == (1, 7, "uniform")
    assert dit4dit_config(cfg.framework).training == "video"
    assert lora_adapter_config(c.lora).alpha == 2.0  # null alpha = rank (scale 1)
    # the tiny cache's key is unchanged (a fitted VAE's file is keyed by its content, weights/tiny_cache.py)
    assert dataclasses.asdict(tiny_sizes(c.tiny)) == {k: v for k, v in dataclasses.asdict(c.tiny).items() if k != "vae_weights"}


def test_a_transformer_built_without_its_weights_must_be_given_every_one():
    """build_dit4dit(load_transformer=False) leaves the transformer on the meta device for a policy
    file's weights (policy/folder.py): a model with a weight still on meta is refused, strict or
    not; given all of them it is the built model, weight for weight. LoRA's frozen base is the base
    folder's, so it never takes this path."""
    cfg = small_config()
    spec = small_spec(cfg)
    full = build_dit4dit(cfg, spec)
    bare = build_dit4dit(cfg, spec, load_transformer=False)
    assert all(p.is_meta for p in bare.backbone.transformer.parameters())
    head_only = {k: v for k, v in full.trainable_state_dict().items() if not k.startswith("backbone.transformer.")}
    with pytest.raises(KeyError, match="never loaded"):
        bare.load_trainable_state_dict(head_only, strict=False)
    bare = build_dit4dit(cfg, spec, load_transformer=False)
    bare.load_trainable_state_dict(full.trainable_state_dict())
    want = full.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in bare.state_dict().items())
    with pytest.raises(ValueError, match="LoRA"):
        lora = small_config("framework.cosmos25.lora.rank=4")
        build_dit4dit(lora, small_spec(lora), load_transformer=False)
