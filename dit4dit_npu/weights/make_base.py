"""A random base model at the real size, written as Cosmos-Predict2.5-2B's diffusers folder.

    python -m dit4dit_npu.weights.make_base --size full|medium|tiny --out DIR   (dit4dit-make-base)

The folder has the real one's layout (``layout.py``): transformer/, vae/, text_encoder/,
tokenizer/, scheduler/, model_index.json; bf16 safetensors, the transformer and the text encoder
sharded with an index as the released folder has them; the tokenizer of Qwen2.5-VL's shape
(``qwen_tokenizer.py``). ``framework.cosmos25.base_model=DIR`` loads it through the same code as a
real folder. Sizes: ``full`` is the real architecture (2.06 B transformer, Wan2.1 VAE, Qwen2.5-VL-7B
text encoder with its vision tower); ``medium`` keeps every width and the vocabulary at 2 blocks,
2 text layers and 2 vision blocks; ``tiny`` is the tiny config's sizes with the real tokenizer.

Why a streaming writer rather than ``save_pretrained``: the full text encoder is 16.6 GB in bf16
(33 GB in fp32 while it is built), more than a 24 GiB host can hold. Each module is built on the
meta device (shapes only), and each tensor is drawn in chunks from its own seeded generator and
written straight into the shard file, so the writer's memory is one chunk whatever the model size.
The values follow each library's own initialisation: torch's default (uniform +-1/sqrt(fan_in)) for
the diffusers modules, transformers' normal(0, 0.02) for the text encoder; norms 1, biases of
norms 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dit4dit_npu.config import TinyCosmosConfig
from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.files import atomic_folder
from dit4dit_npu.models import tiny
from dit4dit_npu.weights.layout import check_base_model
from dit4dit_npu.weights.model_config import tiny_sizes
from dit4dit_npu.weights.real_size import (
    FULL_SIZE,
    QWEN_VOCAB,
    full_size_text_config,
    full_size_vision_config,
)

SIZES = ("full", "medium", "tiny")
CHUNK = 1 << 24  # values drawn and written at a time: 32 MB of bf16, the writer's working memory
DTYPE = torch.bfloat16  # the released folder's dtype


class MakeBaseError(DiT4DiTError, ValueError):
    """Bad options for the base-folder writer."""


@dataclasses.dataclass(frozen=True)
class BaseSizes:
    """What the writer builds: the transformer/text sizes (the tiny builder's record), the vision
    tower's depth and whether its widths and the VAE are the real ones."""

    name: str
    cosmos: TinyCosmosConfig
    vision_depth: int
    real_widths: bool  # full-width vision tower and Wan2.1 VAE (else the tiny ones)


def base_sizes(size: str, layers: int | None = None, text_layers: int | None = None) -> BaseSizes:
    """The preset ``size``, with the transformer's blocks and the text encoder's layers overridable."""
    if size not in SIZES:
        raise MakeBaseError(f"--size: got {size!r}, expected one of {', '.join(SIZES)}")
    for flag, v in (("--layers", layers), ("--text-layers", text_layers)):
        if v is not None and v < 1:
            raise MakeBaseError(f"{flag}: got {v}, expected >= 1")
    if size == "tiny":
        cosmos, depth, real = TinyCosmosConfig(), 1, False
    else:
        n = 28 if size == "full" else 2
        cosmos, depth, real = dataclasses.replace(FULL_SIZE, num_layers=n, text_num_layers=n), 32 if n == 28 else 2, True
    cosmos = dataclasses.replace(
        cosmos, num_layers=layers or cosmos.num_layers, text_num_layers=text_layers or cosmos.text_num_layers
    )
    return BaseSizes(size, cosmos, depth, real)


# --------------------------------------------------------------------------------------------
# Modules on the meta device, with their configs
# --------------------------------------------------------------------------------------------


def meta_transformer(s: BaseSizes) -> nn.Module:
    from diffusers import CosmosTransformer3DModel

    with torch.device("meta"):
        return CosmosTransformer3DModel(**tiny.transformer_kwargs(tiny_sizes(s.cosmos)))


def meta_vae(s: BaseSizes) -> nn.Module:
    from diffusers import AutoencoderKLWan

    kwargs = {} if s.real_widths else tiny.vae_kwargs(tiny_sizes(s.cosmos))  # the class defaults are Wan2.1's
    with torch.device("meta"):
        return AutoencoderKLWan(**kwargs)


def text_encoder_config(s: BaseSizes, tok: Any) -> Any:
    """Qwen2_5_VLConfig with the tokenizer's special-token ids (those of Qwen2.5-VL)."""
    from transformers import Qwen2_5_VLConfig

    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>", "<|image_pad|>", "<|video_pad|>",
                                                     "<|vision_start|>", "<|vision_end|>")}
    c = s.cosmos
    if s.real_widths:
        text = full_size_text_config(QWEN_VOCAB, c.text_num_layers, ids["<|endoftext|>"], ids["<|im_end|>"])
        text.update(max_position_embeddings=128000, rms_norm_eps=1e-6)
        vision = full_size_vision_config(s.vision_depth)
    else:  # the tiny builder's text model (models/tiny.py) with the real vocabulary
        t = tiny_sizes(c)
        text = dict(
            vocab_size=QWEN_VOCAB, hidden_size=c.text_hidden_size, intermediate_size=2 * c.text_hidden_size,
            num_hidden_layers=c.text_num_layers, num_attention_heads=c.text_num_heads, num_key_value_heads=1,
            max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
            rope_scaling={"mrope_section": tiny.mrope_section(t.text_head_dim), "rope_type": "default", "type": "default"},
            bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        )
        vision = dict(depth=s.vision_depth, hidden_size=16, intermediate_size=16, num_heads=2,
                      out_hidden_size=c.text_hidden_size, patch_size=2, fullatt_block_indexes=[0])
    return Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def meta_text_encoder(config: Any) -> nn.Module:
    from transformers import Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        return Qwen2_5_VLForConditionalGeneration(config)


def checkpoint_key(key: str) -> str:
    """The in-memory name of a Qwen2.5-VL weight -> its name in the released checkpoint (transformers
    >= 4.52 nests the language model and the vision tower; the files keep the flat names)."""
    for new, old in (("model.language_model.", "model."), ("model.visual.", "visual.")):
        if key.startswith(new):
            return old + key[len(new):]
    return key


# --------------------------------------------------------------------------------------------
# Streaming safetensors writer
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Entry:
    key: str  # name in the file
    shape: tuple[int, ...]
    draw: Callable[[torch.Tensor, torch.Generator], None]  # fills a float32 chunk in place

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _fill(kind: str, bound: float = 0.0) -> Callable[[torch.Tensor, torch.Generator], None]:
    if kind == "ones":
        return lambda x, g: x.fill_(1.0)
    if kind == "zeros":
        return lambda x, g: x.zero_()
    if kind == "normal":
        return lambda x, g: x.normal_(0.0, 0.02, generator=g)
    return lambda x, g: x.uniform_(-bound, bound, generator=g)


def entries(module: nn.Module, init: str, rename: Callable[[str], str] = lambda k: k) -> list[Entry]:
    """Every tensor of ``module.state_dict()`` with how its values are drawn: ``init="torch"``
    (torch's layer defaults: weights and biases of linear/conv layers uniform +-1/sqrt(fan_in)) or
    ``"hf"`` (transformers': normal(0, 0.02) for linear/conv/embedding weights, biases 0); every
    other tensor (norm scales) 1, or 0 when it is a bias."""
    out = []
    for key, t in module.state_dict().items():
        prefix, _, name = key.rpartition(".")
        owner = module.get_submodule(prefix) if prefix else module
        layer = isinstance(owner, (nn.Linear, nn.modules.conv._ConvNd, nn.Embedding))
        if not t.is_floating_point():
            raise MakeBaseError(f"{key}: a {t.dtype} tensor, the writer draws floating-point weights only")
        if layer and init == "torch" and not isinstance(owner, nn.Embedding):
            fan_in = math.prod(owner.weight.shape[1:])
            draw = _fill("uniform", 1.0 / math.sqrt(fan_in))
        elif layer and name == "weight":
            draw = _fill("normal" if init == "hf" else "uniform", 1.0)
        elif name in ("bias", "beta"):
            draw = _fill("zeros")
        else:
            draw = _fill("ones")
        out.append(Entry(rename(key), tuple(t.shape), draw))
    return out


def _seed(component: str, key: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{component}:{key}".encode()).digest()[:7], "little")


def _chunks(entry: Entry, seed: int) -> Iterator[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    left = entry.numel
    while left:
        n = min(CHUNK, left)
        x = torch.empty(n)
        entry.draw(x, g)
        yield x.to(DTYPE)
        left -= n


def plan_shards(items: list[Entry], max_shard_bytes: int) -> list[list[Entry]]:
    """Consecutive tensors grouped into files of at most ``max_shard_bytes`` (a larger tensor alone)."""
    shards: list[list[Entry]] = [[]]
    size = 0
    for e in items:
        n = e.numel * DTYPE.itemsize
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += n
    return shards


def write_safetensors(path: Path, items: list[Entry], component: str, seed: int) -> int:
    """One safetensors file, tensor by tensor and chunk by chunk (its format: an 8-byte header
    length, a JSON header of dtype/shape/byte offsets, the raw little-endian data). Returns bytes."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for e in items:
        n = e.numel * DTYPE.itemsize
        header[e.key] = {"dtype": "BF16", "shape": list(e.shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for e in items:
            for chunk in _chunks(e, _seed(component, e.key, seed)):
                f.write(chunk.view(torch.uint8).numpy().data)
    return offset


def write_weights(folder: Path, stem: str, items: list[Entry], component: str, seed: int, max_shard_bytes: int) -> int:
    """``{stem}.safetensors``, or shards ``{stem}-0000i-of-0000n.safetensors`` with
    ``{stem}.safetensors.index.json`` (the names diffusers and transformers write and read)."""
    shards = plan_shards(items, max_shard_bytes)
    if len(shards) == 1:
        return write_safetensors(folder / f"{stem}.safetensors", items, component, seed)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards, 1):
        name = f"{stem}-{i:05d}-of-{len(shards):05d}.safetensors"
        total += write_safetensors(folder / name, shard, component, seed)
        weight_map.update({e.key: name for e in shard})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / f"{stem}.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return total


# --------------------------------------------------------------------------------------------
# The folder
# --------------------------------------------------------------------------------------------


def write_transformer(folder: Path, s: BaseSizes, max_shard_bytes: int, seed: int = 0) -> int:
    """transformer/: config.json + the sharded weights; also used alone for a folder that shares
    another's text encoder at another transformer depth."""
    model = meta_transformer(s)
    (folder / "transformer").mkdir(parents=True, exist_ok=True)
    model.save_config(str(folder / "transformer"))
    return write_weights(folder / "transformer", "diffusion_pytorch_model", entries(model, "torch"), "transformer",
                         seed, max_shard_bytes)


def write_base_model(out: Path, s: BaseSizes, max_shard_bytes: int, seed: int = 0,
                     say: Callable[[str], None] = print) -> dict[str, float]:
    """The whole folder, written to a temporary sibling and renamed (never half a folder at ``out``).
    Returns seconds and bytes per component."""
    from diffusers import __version__ as diffusers_version

    from dit4dit_npu.weights.qwen_tokenizer import build_qwen_tokenizer

    stats: dict[str, float] = {}
    with atomic_folder(out, replace=False) as tmp:
        t0 = time.perf_counter()
        tok = build_qwen_tokenizer()
        tok.save_pretrained(str(tmp / "tokenizer"))
        stats["tokenizer_s"] = time.perf_counter() - t0
        say(f"tokenizer: {len(tok)} tokens in {stats['tokenizer_s']:.1f} s")

        t0 = time.perf_counter()
        stats["transformer_bytes"] = write_transformer(tmp, s, max_shard_bytes, seed)
        stats["transformer_s"] = time.perf_counter() - t0
        say(f"transformer: {stats['transformer_bytes'] / 1e9:.2f} GB in {stats['transformer_s']:.1f} s")

        t0 = time.perf_counter()
        vae = meta_vae(s)
        (tmp / "vae").mkdir()
        vae.save_config(str(tmp / "vae"))
        # one file, as the released VAE (0.25 GB) has it
        stats["vae_bytes"] = write_weights(tmp / "vae", "diffusion_pytorch_model", entries(vae, "torch"), "vae", seed,
                                           max(max_shard_bytes, 1 << 40))
        stats["vae_s"] = time.perf_counter() - t0
        say(f"vae: {stats['vae_bytes'] / 1e9:.2f} GB in {stats['vae_s']:.1f} s")

        t0 = time.perf_counter()
        config = text_encoder_config(s, tok)
        text = meta_text_encoder(config)
        (tmp / "text_encoder").mkdir()
        config.save_pretrained(str(tmp / "text_encoder"))
        stats["text_encoder_bytes"] = write_weights(tmp / "text_encoder", "model", entries(text, "hf", checkpoint_key),
                                                    "text_encoder", seed, max_shard_bytes)
        stats["text_encoder_s"] = time.perf_counter() - t0
        say(f"text_encoder: {stats['text_encoder_bytes'] / 1e9:.2f} GB in {stats['text_encoder_s']:.1f} s")

        tiny.build_scheduler().save_pretrained(str(tmp / "scheduler"))
        (tmp / "model_index.json").write_text(json.dumps(model_index(diffusers_version, type(tok).__name__), indent=2) + "\n")
        check_base_model(tmp)  # never publish an incomplete folder
    return stats


def model_index(diffusers_version: str, tokenizer_class: str) -> dict[str, Any]:
    """The pipeline's model_index.json, as ``save_pretrained`` writes it (no safety checker)."""
    return {
        "_class_name": "Cosmos2_5_PredictBasePipeline",
        "_diffusers_version": diffusers_version,
        "safety_checker": [None, None],
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"],
        "tokenizer": ["transformers", tokenizer_class],
        "transformer": ["diffusers", "CosmosTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


if __name__ == "__main__":  # python -m dit4dit_npu.weights.make_base: the command is weights/cli.py's
    from dit4dit_npu.weights.cli import make_base_main

    raise SystemExit(make_base_main())
