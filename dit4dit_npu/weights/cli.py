"""The command of the weights layer: ``dit4dit-make-base`` (``python -m dit4dit_npu.weights.make_base``),
a random base folder at the real size (``make_base.py``), loaded back through the real loader."""

from __future__ import annotations

import argparse
import gc
import resource
import time
from pathlib import Path

from dit4dit_npu.console import entry_point
from dit4dit_npu.weights.make_base import SIZES, MakeBaseError, base_sizes, folder_bytes, write_base_model

LOADS = ("all", "backbone", "none")


def peak_rss_gib() -> float:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def make_base_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dit4dit-make-base",
        description="Write a random-weight base model laid out like Cosmos-Predict2.5-2B's diffusers folder "
        "(framework.cosmos25.base_model=DIR loads it), then time loading it back.",
    )
    p.add_argument("--size", choices=SIZES, required=True,
                   help="full: the real architecture (~21 GB); medium: real widths, 2 blocks / 2 text layers; "
                        "tiny: the tiny config's sizes (all with Qwen2.5-VL's tokenizer shape)")
    p.add_argument("--out", type=Path, required=True, help="folder to write (must not exist, or be empty)")
    p.add_argument("--layers", type=int, default=None, help="transformer blocks (default: the size's)")
    p.add_argument("--text-layers", type=int, default=None, help="text encoder layers (default: the size's)")
    p.add_argument("--max-shard-gb", type=float, default=4.0,
                   help="largest weights file of the transformer and the text encoder, GB (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default: %(default)s)")
    p.add_argument("--load", choices=LOADS, default="all",
                   help="load back after writing and time it: every part (the full text encoder needs ~16 GB), "
                        "the backbone parts and tokenizer only, or none (default: %(default)s)")
    return p


@entry_point
def make_base_main(argv: list[str] | None = None) -> int:
    args = make_base_parser().parse_args(argv)
    sizes = base_sizes(args.size, args.layers, args.text_layers)
    if args.max_shard_gb <= 0:
        raise MakeBaseError(f"--max-shard-gb: got {args.max_shard_gb}, expected > 0")
    out = args.out.expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MakeBaseError(f"--out {out}: exists and is not an empty folder (delete it or name another)")
    t0 = time.perf_counter()
    write_base_model(out, sizes, int(args.max_shard_gb * 1e9), args.seed)
    print(f"wrote {out} ({args.size}) in {time.perf_counter() - t0:.1f} s: {folder_bytes(out) / 1e9:.2f} GB on disk; "
          f"writer peak RSS {peak_rss_gib():.2f} GiB")
    if args.load != "none":
        load_back(out, args.load == "all")
    return 0


def load_back(folder: Path, text_encoder: bool) -> None:
    """Each part through the loader training and inference use (``base_model.load_weights``), in
    bf16, one at a time (freed before the next), timed."""
    import torch
    from diffusers import AutoencoderKLWan, CosmosTransformer3DModel, UniPCMultistepScheduler
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    from dit4dit_npu.weights.base_model import load, load_weights

    parts = [("tokenizer", lambda: load(AutoTokenizer, folder, "tokenizer")),
             ("scheduler", lambda: load(UniPCMultistepScheduler, folder, "scheduler")),
             ("vae", lambda: load_weights(AutoencoderKLWan, folder, "vae", torch.bfloat16)),
             ("transformer", lambda: load_weights(CosmosTransformer3DModel, folder, "transformer", torch.bfloat16))]
    if text_encoder:
        parts.append(("text_encoder",
                      lambda: load_weights(Qwen2_5_VLForConditionalGeneration, folder, "text_encoder", torch.bfloat16)))
    for name, fn in parts:
        t0 = time.perf_counter()
        part = fn()
        n = sum(p.numel() for p in part.parameters()) if hasattr(part, "parameters") else len(part) if name == "tokenizer" else 0
        what = f"{n:,} tokens" if name == "tokenizer" else f"{n / 1e9:.3f} B parameters" if n else "config"
        print(f"load {name}: {time.perf_counter() - t0:.1f} s ({what}); peak RSS so far {peak_rss_gib():.2f} GiB")
        del part
        gc.collect()
