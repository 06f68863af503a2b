"""The prompt-embedding cache: every instruction's text-encoder output, computed once.

The original ran the 7B text encoder on every training step and every ``predict_action`` call
(B1 in ``bench/reference.py``). An instruction's embedding never changes while the text encoder is frozen, so it is
computed once per unique instruction (``PromptEncoder``, ``text.py``) and kept in a
``PromptCache``: instruction -> (L, D) embedding in memory, refusing embeddings of another text
encoder. Not an ``nn.Module``: it must never end up inside the trained model (nor in DeepSpeed's
engine or a checkpoint's weights). It lives with the models because the text encoder fills it and
``DiT4DiT`` reads it; its file (and a training run's cache, built before the first step) is
``dit4dit_npu/weights/prompt_cache.py``'s, as ``models/`` does no file I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch

from dit4dit_npu.errors import DiT4DiTError

if TYPE_CHECKING:
    from dit4dit_npu.models.text import PromptEncoder


class PromptCacheError(DiT4DiTError, ValueError):
    """Cache miss, or embeddings made by another text encoder."""


def _key(instruction: str) -> str:
    # safetensors keys must be plain strings; instructions can hold anything, so key by a hash
    # and keep the text itself in the metadata.
    return hashlib.sha256(instruction.encode("utf-8")).hexdigest()[:32]


class PromptCache:
    """instruction -> (L, D) embedding, computed once per unique instruction."""

    def __init__(self, identity: str = "", max_sequence_length: int | None = None) -> None:
        self.identity = identity
        self.max_sequence_length = max_sequence_length
        self._store: dict[str, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self._store)

    def __contains__(self, instruction: object) -> bool:
        return instruction in self._store

    @property
    def instructions(self) -> list[str]:
        return list(self._store)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._store.values())

    def _check_encoder(self, encoder: PromptEncoder) -> None:
        if not self.identity and not self._store:
            self.identity, self.max_sequence_length = encoder.identity, encoder.max_sequence_length
            return
        if not self.matches(encoder.identity, encoder.max_sequence_length):
            raise PromptCacheError(
                f"prompt cache was made by text encoder {self.identity!r} (max_sequence_length="
                f"{self.max_sequence_length}), not {encoder.identity!r} (max_sequence_length="
                f"{encoder.max_sequence_length}): start a new cache for this encoder"
            )

    def build(self, instructions: Iterable[str], encoder: PromptEncoder, batch_size: int = 8) -> int:
        """Encode the instructions not cached yet; returns how many were computed."""
        self._check_encoder(encoder)
        missing = sorted({s for s in instructions if s not in self._store})
        for i in range(0, len(missing), batch_size):  # chunked: the real embeddings are ~100 MB each
            chunk = missing[i : i + batch_size]
            for text, emb in zip(chunk, encoder.encode(chunk, batch_size=batch_size).cpu()):
                self._store[text] = emb.clone()  # own storage, not a view of the chunk
        return len(missing)

    def add(self, instruction: str, embedding: torch.Tensor) -> None:
        self._store[instruction] = embedding.detach().cpu()

    def discard(self, instruction: str) -> None:
        """Forget one instruction if cached (a policy's bounded cache of run-time prompts)."""
        self._store.pop(instruction, None)

    def to(self, device: torch.device | str) -> PromptCache:
        """Keep the embeddings on ``device`` (saves a host->device copy per step when they fit)."""
        self._store = {k: v.to(device) for k, v in self._store.items()}
        return self

    def lookup(
        self, instructions: Sequence[str], device: torch.device | str, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        missing = [s for s in dict.fromkeys(instructions) if s not in self._store]
        if missing:
            raise PromptCacheError(
                f"{len(missing)} instruction(s) not in the prompt cache ({len(self._store)} cached): "
                + "; ".join(repr(s) for s in missing[:5])
                + (" ..." if len(missing) > 5 else "")
                + ". Build the cache over the dataset's instructions before training (PromptCache.build)"
            )
        return torch.stack([self._store[s] for s in instructions]).to(device=device, dtype=dtype)

    def matches(self, identity: str | None, max_sequence_length: int | None) -> bool:
        """Made by that text encoder (None = do not check that part)?"""
        return (identity is None or identity == self.identity) and (
            max_sequence_length is None or max_sequence_length == self.max_sequence_length
        )

    # -------------------------------------------------------------------------- tensors

    def to_tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """-> (tensors, string metadata), e.g. for a safetensors file. Keys are hashes of the
        instructions (a safetensors key must be a plain string; an instruction can hold anything);
        the instructions themselves travel in the metadata."""
        tensors = {_key(s): t.detach().cpu().contiguous() for s, t in self._store.items()}
        meta = {
            "identity": self.identity,
            "max_sequence_length": json.dumps(self.max_sequence_length),
            "instructions": json.dumps({_key(s): s for s in self._store}),
        }
        return tensors, meta

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> PromptCache:
        """Inverse of ``to_tensors``."""
        if "identity" not in meta or "instructions" not in meta:
            raise PromptCacheError("not a prompt cache (no identity/instructions metadata)")
        cache = cls(meta["identity"], json.loads(meta.get("max_sequence_length", "null")))
        names = json.loads(meta["instructions"])
        if set(names) != set(tensors):
            raise PromptCacheError(
                f"prompt cache metadata names {len(names)} instructions but holds {len(tensors)} embeddings"
            )
        cache._store = {names[k]: t for k, t in tensors.items()}
        return cache

    def merge_from(self, other: PromptCache) -> None:
        if other.identity != self.identity or other.max_sequence_length != self.max_sequence_length:
            raise PromptCacheError(
                f"cannot merge prompt caches of different text encoders ({other.identity!r} vs {self.identity!r})"
            )
        self._store.update(other._store)
