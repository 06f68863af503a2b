"""Builders: tiny reproducibility, loading a local diffusers folder, clear errors for bad folders."""

import shutil

import pytest
import torch

from dit4dit_npu.config import ConfigError
from dit4dit_npu.models import (
    build_backbone,
    build_dit4dit,
    build_prompt_encoder,
    clip_frames,
    save_tiny_base_model,
)
from dit4dit_npu.models.testing import small_config


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return save_tiny_base_model(small_config(), tmp_path_factory.mktemp("cosmos") / "Cosmos-Predict2.5-2B")


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tiny_is_reproducible_from_config():
    torch.manual_seed(123)
    before = torch.rand(1)
    a = build_dit4dit(small_config())
    torch.manual_seed(123)
    b = build_dit4dit(small_config())
    assert torch.equal(torch.rand(1), before)  # building never consumes the caller's RNG
    assert _same(a, b)
    c = build_dit4dit(small_config("framework.cosmos25.tiny.seed=1"))
    assert not _same(a.backbone.transformer, c.backbone.transformer)
    assert _same(a.action_model, c.action_model)  # head init comes from the run seed


def test_tiny_sizes_follow_config():
    cfg = small_config("framework.cosmos25.tiny.num_layers=5", "framework.cosmos25.tiny.text_num_layers=3")
    bb = build_backbone(cfg)
    assert bb.num_layers == 5 and bb.hidden_size == 32
    assert bb.transformer.config.crossattn_proj_in_channels == 3 * 32
    assert build_prompt_encoder(cfg).embed_dim == 3 * 32


def test_load_from_local_folder_equals_tiny(base_dir):
    cfg = small_config()
    from_dir = small_config(f"framework.cosmos25.base_model={base_dir}")
    assert _same(build_backbone(from_dir), build_backbone(cfg))
    ours, loaded = build_prompt_encoder(cfg), build_prompt_encoder(from_dir)
    assert not any("visual" in n for n, _ in loaded.language_model.named_modules())
    torch.testing.assert_close(loaded.encode(["pick up the cup"]), ours.encode(["pick up the cup"]))
    assert loaded.identity.startswith("cosmos25:") and loaded.identity != ours.identity


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


def test_feature_frames_follow_the_data_clip():
    cfg = small_config(
        "datasets.vla_data.video_delta_indices=[0,1,2,3,4,5,6,7]",
        "datasets.vla_data.action_video_freq_ratio=2",
    )
    assert clip_frames(cfg) == 4
    assert build_dit4dit(cfg).feature_latent_frames == 2  # 4 frames pad to 5 -> 2 latent frames
