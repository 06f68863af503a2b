"""The random base folder at the real size (dit4dit-make-base, dit4dit_npu/weights/make_base.py):
written tiny here with shards small enough that every sharded part has an index, then loaded by
the code that loads a real Cosmos folder, every weight compared with its file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dit4dit_npu.config import load_config
from dit4dit_npu.weights.make_base import base_sizes, meta_text_encoder, meta_transformer, text_encoder_config
from dit4dit_npu.weights.real_size import QWEN_BASE_TOKENS, QWEN_SPECIAL_TOKENS, QWEN_VOCAB

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs/robotwin/dit4dit_robotwin_tiny.yaml"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    from dit4dit_npu.weights.cli import make_base_main

    out = tmp_path_factory.mktemp("base") / "cosmos"
    assert make_base_main(["--size", "tiny", "--out", str(out), "--max-shard-gb", "0.0001", "--load", "none"]) == 0
    return out


def file_tensors(folder: Path, stem: str) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    index = folder / f"{stem}.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [f"{stem}.safetensors"]
    out = {}
    for name in files:
        with safe_open(str(folder / name), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def test_the_folder_has_the_real_layout_sharded_with_an_index(base: Path) -> None:
    for part, stem in (("transformer", "diffusion_pytorch_model"), ("text_encoder", "model")):
        index = json.loads((base / part / f"{stem}.safetensors.index.json").read_text())
        files = set(index["weight_map"].values())
        assert len(files) > 1 and all((base / part / f).is_file() for f in files), files
        assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in file_tensors(base / part, stem).values())
    assert (base / "vae/diffusion_pytorch_model.safetensors").is_file()
    assert json.loads((base / "model_index.json").read_text())["_class_name"] == "Cosmos2_5_PredictBasePipeline"
    assert all(t.dtype == torch.bfloat16 for t in file_tensors(base / "text_encoder", "model").values())


def test_every_weight_loads_through_the_real_loader(base: Path) -> None:
    """No weight is left at a fresh initialisation: each loaded parameter is its file's tensor
    (a name the loader does not map would be silently re-initialised)."""
    from diffusers import AutoencoderKLWan, CosmosTransformer3DModel
    from transformers import Qwen2_5_VLForConditionalGeneration

    from dit4dit_npu.weights.base_model import load_weights
    from dit4dit_npu.weights.make_base import checkpoint_key

    for cls, part, stem, rename in (
        (CosmosTransformer3DModel, "transformer", "diffusion_pytorch_model", str),
        (AutoencoderKLWan, "vae", "diffusion_pytorch_model", str),
        (Qwen2_5_VLForConditionalGeneration, "text_encoder", "model", checkpoint_key),
    ):
        model = load_weights(cls, base, part, torch.bfloat16)
        saved = file_tensors(base / part, stem)
        state = {rename(k): v for k, v in model.state_dict().items()}
        assert set(state) == set(saved), (part, sorted(set(state) ^ set(saved))[:5])
        for k, v in state.items():
            assert torch.equal(v, saved[k]), (part, k)
        assert any(v.float().std() > 0 for v in state.values())  # random, not a constant fill


def test_the_tokenizer_has_qwen_vocabulary_and_special_ids(base: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(base / "tokenizer"), local_files_only=True)
    assert len(tok) == QWEN_BASE_TOKENS + len(QWEN_SPECIAL_TOKENS) == 151665
    assert [tok.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS] == list(range(151643, 151665))
    assert (tok.pad_token_id, tok.eos_token_id) == (151643, 151645)
    text = "pick up the black bowl and place it on the plate"
    ids = tok(text)["input_ids"]
    assert max(ids) < QWEN_BASE_TOKENS and tok.decode(ids) == text


def test_a_run_config_loads_it_as_a_real_folder(base: Path) -> None:
    """framework.cosmos25.base_model=DIR: the prompt encoder and the backbone, by the run's loader
    (a prompt embedding as wide as the transformer's text projection expects)."""
    from dit4dit_npu.weights import build_backbone, build_prompt_encoder

    cfg = load_config(TINY, [f"framework.cosmos25.base_model={base}"])
    encoder = build_prompt_encoder(cfg)
    emb = encoder.encode(["pick up the bowl"])
    assert emb.shape == (1, cfg.framework.cosmos25.max_sequence_length, encoder.embed_dim)
    assert encoder.language_model.config.vocab_size == QWEN_VOCAB
    backbone = build_backbone(cfg)
    assert backbone.transformer.config.crossattn_proj_in_channels == encoder.embed_dim


def test_full_size_is_the_real_architecture() -> None:
    """On the meta device: Cosmos-Predict2.5-2B's 2.06 B transformer and Qwen2.5-VL-7B (8.29 B with
    its vision tower and output layer), the numbers of their released checkpoints."""
    from dit4dit_npu.weights.qwen_tokenizer import build_qwen_tokenizer

    s = base_sizes("full")
    assert sum(p.numel() for p in meta_transformer(s).parameters()) == 2_059_174_912
    text = meta_text_encoder(text_encoder_config(s, build_qwen_tokenizer()))
    assert sum(p.numel() for p in text.parameters()) == 8_292_166_656


def test_frozen_parts_load_in_bf16_on_cpu_under_bf16_mixed_precision(base: Path) -> None:
    """The full text encoder is 30 GB in fp32, more than a 24 GiB CPU host holds: under
    mixed_precision bf16 the frozen parts load in bf16 on every device (fp32 under "no")."""
    from dit4dit_npu.weights import build_prompt_encoder, build_vae

    for precision, dtype in (("bf16", torch.bfloat16), ("'no'", torch.float32)):
        cfg = load_config(TINY, [f"framework.cosmos25.base_model={base}", f"trainer.mixed_precision={precision}"])
        assert next(build_prompt_encoder(cfg).language_model.parameters()).dtype == dtype
        assert next(build_vae(cfg).parameters()).dtype == dtype
