"""Tiny random instances of the real Cosmos-Predict2.5 classes (no weights, no network).

Same diffusers/transformers classes as nvidia/Cosmos-Predict2.5-2B, only smaller. Everything here
is a pure function of ``TinySizes`` (from ``framework.cosmos25.tiny``, validated where it is
declared; weights from ``seed`` under a forked RNG, the tokenizer trained deterministically on a
fixed corpus), so an exported policy that says ``base_model: tiny`` is reproducible from its
config alone. ``weights/tiny_cache.py`` saves these modules as a diffusers folder laid out like
the real one, and the model is loaded back from it through the real loader.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from dit4dit_npu.models.configs import TinySizes
from dit4dit_npu.models.text import SYSTEM_PROMPT

T = TypeVar("T")


# The real converter's scheduler for Cosmos-2.5 (recipe §1): Karras sigmas on the EDM range
# [0.01, 200] mapped to flow sigmas s = sigma / (sigma + 1).
SCHEDULER_KWARGS: dict[str, Any] = dict(
    use_karras_sigmas=True,
    use_flow_sigmas=True,
    prediction_type="flow_prediction",
    sigma_max=200.0,
    sigma_min=0.01,
)

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Qwen2.5-VL's chat template restricted to text (content: a string or a list of text parts).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

_CORPUS = [
    SYSTEM_PROMPT,
    "pick up the black bowl and place it on the plate",
    "open the top drawer of the cabinet and put the bowl inside",
    "lift the pot, stack the blocks, hand over the cup, press the button",
    "system user assistant robot arm gripper table cup left right",
]


def seeded(seed: int, build: Callable[[], T]) -> T:
    """Run ``build`` with the global RNG seeded, then restore the caller's RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def transformer_kwargs(t: TinySizes) -> dict[str, Any]:
    return dict(
        in_channels=16 + 1,  # 16 latent channels + the condition-mask channel
        out_channels=16,
        num_attention_heads=t.num_attention_heads,
        attention_head_dim=t.attention_head_dim,
        num_layers=t.num_layers,
        mlp_ratio=4.0,
        text_embed_dim=t.text_embed_dim,
        adaln_lora_dim=t.adaln_lora_dim,
        max_size=(128, 240, 240),
        patch_size=(1, 2, 2),
        rope_scale=(1.0, 3.0, 3.0),
        concat_padding_mask=True,
        extra_pos_embed_type=None,
        use_crossattn_projection=True,
        # prompt embedding = all text layers concatenated (real: 28 x 3584 = 100352)
        crossattn_proj_in_channels=t.text_hidden_size * t.text_num_layers,
        encoder_hidden_states_channels=t.text_embed_dim,
    )


def vae_kwargs(t: TinySizes) -> dict[str, Any]:
    # z_dim must stay 16 (the default 16-entry latents_mean/std); 4 dim_mult entries and 3
    # temporal flags keep the real x8 spatial / x4 causal temporal factors.
    stats = {"latents_mean": t.vae_latents_mean, "latents_std": t.vae_latents_std}
    return dict(
        base_dim=t.vae_base_dim,
        z_dim=16,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[False, True, True],
        **{k: list(v) for k, v in stats.items() if v is not None},
    )


def build_transformer(t: TinySizes) -> nn.Module:
    from diffusers import CosmosTransformer3DModel

    kwargs = transformer_kwargs(t)
    return seeded(t.seed, lambda: CosmosTransformer3DModel(**kwargs))


def build_vae(t: TinySizes) -> nn.Module:
    from diffusers import AutoencoderKLWan

    kwargs = vae_kwargs(t)
    return seeded(t.seed + 1, lambda: AutoencoderKLWan(**kwargs))


def build_scheduler() -> Any:
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(**SCHEDULER_KWARGS)


def build_tokenizer(vocab_size: int = 384) -> Any:
    """Byte-level BPE (deterministic: fixed corpus, no randomness in BPE training) with the chat
    template and pad token the pipeline's ``padding="max_length"`` needs."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return qwen_fast_tokenizer(tok, model_max_length=32768)


def qwen_fast_tokenizer(tok: Any, model_max_length: int) -> Any:
    """A ``tokenizers.Tokenizer`` as transformers' fast tokenizer with Qwen2.5-VL's end and pad
    tokens, right padding and the chat template: the tiny tokenizer and the real-size one
    (``weights/qwen_tokenizer.py``) differ only in their vocabulary."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        padding_side="right",
        model_max_length=model_max_length,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def mrope_section(head_dim: int) -> list[int]:
    """[t, h, w] rotary sections summing to head_dim / 2 (real 128 -> [16, 24, 24])."""
    half = head_dim // 2
    hw = (3 * half) // 8
    return [half - 2 * hw, hw, hw]


def build_text_encoder(t: TinySizes, tokenizer: Any) -> nn.Module:
    """A full Qwen2_5_VLForConditionalGeneration, like the real folder holds (the caller keeps
    only its language model)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = {s: tokenizer.convert_tokens_to_ids(s) for s in SPECIAL_TOKENS}
    section = mrope_section(t.text_head_dim)
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=t.text_hidden_size,
            intermediate_size=2 * t.text_hidden_size,
            num_hidden_layers=t.text_num_layers,
            num_attention_heads=t.text_num_heads,
            num_key_value_heads=1,
            # only sizes the rotary cache: any prompt length works, so the folder does not
            # depend on max_sequence_length (real: 128000)
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            rope_scaling={"mrope_section": section, "rope_type": "default", "type": "default"},
            rope_theta=1000000.0,
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(
            depth=1,
            hidden_size=16,
            intermediate_size=16,
            num_heads=2,
            out_hidden_size=t.text_hidden_size,
            patch_size=2,
            fullatt_block_indexes=[0],
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    return seeded(t.seed + 2, lambda: Qwen2_5_VLForConditionalGeneration(config)).eval()
