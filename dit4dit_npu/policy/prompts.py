"""The prompt-cache file: ``PromptCache`` <-> one safetensors file (checkpoints, policy folders).

The cache itself is pure memory (``models/text.py``); this is the only code that reads or writes
it. Writes are atomic (temp file + rename: a crash never leaves half a cache), and a load can
insist on the text encoder that made the embeddings, so a cache of another model is refused.
"""

from __future__ import annotations

from pathlib import Path

from dit4dit_npu.files import atomic_path
from dit4dit_npu.models.text import PromptCache, PromptCacheError


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
