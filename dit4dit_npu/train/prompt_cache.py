"""The run's prompt-embedding cache: every instruction encoded once, before the first step.

The one place where training builds, saves and loads the run's cache file; the file format is
the policy folder's (``policy/prompts.py``), so a run's cache and an exported one are the same.
"""

from __future__ import annotations

from pathlib import Path

from dit4dit_npu.config import Config

# A real Cosmos prompt embedding is 512 x 100352 bf16 values (~100 MB per instruction). Up to this
# size the whole cache lives on the device, saving a host->device copy of B embeddings per step;
# beyond it (many instructions) it stays in host memory.
PROMPT_CACHE_ON_DEVICE_BYTES = 2 * 2**30


def prepare_prompt_cache(cfg: Config, accelerator, instructions: list[str], run_dir: Path):
    """Rank 0 encodes the instructions the cache file lacks and saves it; every rank loads it.

    Building under ``building_outside_deepspeed`` is the caller's job (the text encoder must not
    be ZeRO-3 partitioned). The encoder is freed before training starts.
    """
    path = Path(cfg.framework.cosmos25.prompt_cache or run_dir / "prompt_cache.safetensors")
    if accelerator.is_main_process:
        cache = _load_or_empty(path, accelerator.print)
        _encode_missing(cfg, cache, instructions)
        _save(cache, path)
    accelerator.wait_for_everyone()
    cache = _load(path)
    if cache.nbytes <= PROMPT_CACHE_ON_DEVICE_BYTES:
        cache.to(accelerator.device)
    return cache


def _encode_missing(cfg: Config, cache, instructions: list[str]) -> None:
    from dit4dit_npu.weights import build_prompt_encoder

    missing = [t for t in dict.fromkeys(instructions) if t not in cache]
    if missing:
        encoder = build_prompt_encoder(cfg)
        cache.build(missing, encoder)
        del encoder  # the 7B text model never stays resident during training


def _load_or_empty(path: Path, say):
    """The cache file, or an empty cache when there is none or it is damaged: it only holds what
    the text encoder recomputes, so a torn file costs one encode, not the run."""
    from dit4dit_npu.models import PromptCacheError

    if not path.is_file():
        return _empty()
    try:
        return _load(path)
    except PromptCacheError as e:
        say(f"{e}; rebuilding the prompt cache")
        return _empty()


def _empty():
    from dit4dit_npu.models import PromptCache

    return PromptCache()


def _load(path: Path):
    from dit4dit_npu.policy.prompts import load_prompt_cache

    return load_prompt_cache(path)


def _save(cache, path: Path) -> None:
    from dit4dit_npu.policy.prompts import save_prompt_cache

    save_prompt_cache(cache, path)
