"""The real model's sizes: Cosmos-Predict2.5-2B's transformer, Wan2.1's VAE, Qwen2.5-VL-7B's text
encoder and tokenizer (their released configs), in the terms the builders here take.

One owner for these facts: the random full-size base folder (``make_base.py``), the memory
planner's parameter counts and activation fits (``train/activations.py``, ``train/memory_plan.py``)
and the benches all read them from here.
"""

from __future__ import annotations

from typing import Any

from dit4dit_npu.config import TinyCosmosConfig

# Cosmos-Predict2.5-2B's transformer, Wan2.1's VAE and Qwen2.5-VL-7B's text model, as the tiny
# builder's sizes (models/tiny.py builds the same classes from these).
FULL_SIZE = TinyCosmosConfig(
    num_layers=28, num_attention_heads=16, attention_head_dim=128, text_embed_dim=1024, adaln_lora_dim=256,
    vae_base_dim=96, text_hidden_size=3584, text_num_layers=28, text_num_heads=28,
)
QWEN_VOCAB = 152064  # Qwen2.5-VL's vocabulary (the embedding table's rows)
QWEN_BASE_TOKENS = 151643  # its byte-level BPE's tokens; the special tokens follow, from id 151643 on
# Qwen2.5-VL's special tokens in id order (151643 ... 151664): len(tokenizer) = 151665 < QWEN_VOCAB
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)
# Qwen2's pre-tokenizer split (before the byte-level mapping), as its tokenizer.json has it
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def full_size_text_config(vocab_size: int, layers: int = 28, pad_id: int = 0, eos_id: int = 0) -> dict:
    """Qwen2.5-VL-7B's language model (``Qwen2_5_VLTextConfig`` keyword arguments)."""
    return dict(
        vocab_size=vocab_size, hidden_size=3584, intermediate_size=18944, num_hidden_layers=layers,
        num_attention_heads=28, num_key_value_heads=4, rope_theta=1e6, max_position_embeddings=2048,
        rope_scaling={"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
        bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id,
    )


def full_size_vision_config(depth: int = 32) -> dict[str, Any]:
    """Qwen2.5-VL-7B's vision tower (``Qwen2_5_VLVisionConfig`` keyword arguments): in the folder as
    the real one holds it, never run (the prompt encoder drops it after loading)."""
    return dict(
        depth=depth, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584, patch_size=14,
        spatial_merge_size=2, temporal_patch_size=2, window_size=112, in_channels=3, hidden_act="silu",
        tokens_per_second=2, fullatt_block_indexes=[i for i in (7, 15, 23, 31) if i < depth] or [depth - 1],
    )
