"""The prompt cache's file, and a training run's cache (``models/prompt_cache.py`` is the cache).

- ``save_prompt_cache`` / ``load_prompt_cache``: one safetensors file next to checkpoints and in
  policy folders (atomic writes; a cache of another text encoder is refused);
- ``prepare_prompt_cache``: a training run's cache, built by the run's text encoder before the
  first step (here because building that encoder is this package's job, ``build.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dit4dit_npu.files import atomic_path
from dit4dit_npu.models.prompt_cache import PromptCache, PromptCacheError
from dit4dit_npu.weights.build import build_prompt_encoder

if TYPE_CHECKING:
    from dit4dit_npu.config import Config


# --------------------------------------------------------------------------------------------
# The file
# --------------------------------------------------------------------------------------------


def save_prompt_cache(cache: PromptCache, path: str | Path) -> Path:
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors, meta = cache.to_tensors()
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
    return path


def load_prompt_cache(
    path: str | Path,
    expect_identity: str | None = None,
    expect_max_sequence_length: int | None = None,
) -> PromptCache:
    """Read a cache file; with ``expect_*`` given, a cache of another text encoder is an error."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise PromptCacheError(f"prompt cache file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        cache = PromptCache.from_tensors(tensors, meta)
    except PromptCacheError as e:
        raise PromptCacheError(f"{path}: {e}") from None
    except Exception as e:  # safetensors raises its own error types for a damaged file
        raise PromptCacheError(f"{path}: not a readable safetensors file ({e})") from None
    if not cache.matches(expect_identity, expect_max_sequence_length):
        raise PromptCacheError(
            f"prompt cache {path} was made by text encoder {cache.identity!r} with max_sequence_length="
            f"{cache.max_sequence_length}, expected {expect_identity!r} with "
            f"{expect_max_sequence_length}; delete it to rebuild"
        )
    return cache


# --------------------------------------------------------------------------------------------
# A training run's cache
# --------------------------------------------------------------------------------------------

# A real Cosmos prompt embedding is 512 x 100352 bf16 values (~100 MB per instruction). Up to this
# size the whole cache lives on the device, saving a host->device copy of B embeddings per step;
# beyond it (many instructions) it stays in host memory.
PROMPT_CACHE_ON_DEVICE_BYTES = 2 * 2**30


def prepare_prompt_cache(cfg: Config, accelerator: Any, instructions: list[str], run_dir: Path) -> PromptCache:
    """Rank 0 encodes the instructions the cache file lacks and saves it; every rank loads it.

    Building under ``building_outside_deepspeed`` is the caller's job (the text encoder must not
    be ZeRO-3 partitioned). The encoder is freed before training starts.
    """
    path = Path(cfg.framework.cosmos25.prompt_cache or run_dir / "prompt_cache.safetensors")
    if accelerator.is_main_process:
        cache = _load_or_empty(path, accelerator.print)
        _encode_missing(cfg, cache, instructions)
        save_prompt_cache(cache, path)
    accelerator.wait_for_everyone()
    cache = load_prompt_cache(path)
    if cache.nbytes <= PROMPT_CACHE_ON_DEVICE_BYTES:
        cache.to(accelerator.device)
    return cache


def _encode_missing(cfg: Config, cache: PromptCache, instructions: list[str]) -> None:
    missing = [t for t in dict.fromkeys(instructions) if t not in cache]
    if missing:
        encoder = build_prompt_encoder(cfg)
        cache.build(missing, encoder)
        del encoder  # the 7B text model never stays resident during training


def _load_or_empty(path: Path, say: Callable[[str], None]) -> PromptCache:
    """The cache file, or an empty cache when there is none or it is damaged: it only holds what
    the text encoder recomputes, so a torn file costs one encode, not the run."""
    if not path.is_file():
        return PromptCache()
    try:
        return load_prompt_cache(path)
    except PromptCacheError as e:
        say(f"{e}; rebuilding the prompt cache")
        return PromptCache()
