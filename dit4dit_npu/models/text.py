"""Prompt embeddings exactly as the diffusers Cosmos-Predict2.5 pipeline computes them, and a cache.

The original ran the 7B text encoder (through the VL model, with its unused vision tower resident
and a (B, 512, 152k) lm_head product) on every training step and every ``predict_action`` call
(SPEC B1). An instruction's embedding never changes while the text encoder is frozen, so we
compute it once per unique instruction, keep it in a ``PromptCache`` and free the text encoder.
Neither class is an ``nn.Module``: they must never end up inside the trained model (nor in
DeepSpeed's engine or a checkpoint). The cache is pure memory; its file (safetensors, written
next to checkpoints and policies) is ``dit4dit_npu/policy/prompts.py``'s business.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from dit4dit_npu.errors import DiT4DiTError

log = logging.getLogger(__name__)

# The Cosmos-Predict2.5 pipeline's system prompt (diffusers ``_get_prompt_embeds``).
SYSTEM_PROMPT = "You are a helpful assistant who will provide prompts to an image generator."


def _ids(encoded: Any) -> list[int]:
    # transformers 5.x returns a BatchEncoding, 4.x a list of ids
    return encoded["input_ids"] if not isinstance(encoded, list) and "input_ids" in encoded else encoded


class PromptCacheError(DiT4DiTError, ValueError):
    """Cache miss, or embeddings made by another text encoder."""


class PromptEncoder:
    """Tokenizer + the text model only (no vision tower, no lm_head).

    ``encode`` = the pipeline's ``_get_prompt_embeds``: chat template with its system prompt,
    padded/truncated to ``max_sequence_length``, no attention mask (pad positions are attended,
    as in the pipeline), all decoder-layer outputs ``hidden_states[1:]`` each normalised per token
    ``(h - mean) / (std + 1e-8)`` and concatenated -> (B, L, num_layers * hidden).
    """

    def __init__(
        self, tokenizer: Any, language_model: nn.Module, max_sequence_length: int = 512, identity: str = ""
    ) -> None:
        self.tokenizer = tokenizer
        self.language_model = language_model.eval().requires_grad_(False)
        self.max_sequence_length = max_sequence_length
        # Names the weights the embeddings come from; a cache built by another model is refused.
        self.identity = identity
        self.num_calls = 0  # language-model forwards
        self._warned_truncation = False

    @property
    def device(self) -> torch.device:
        return next(self.language_model.parameters()).device

    @property
    def embed_dim(self) -> int:
        cfg = self.language_model.config
        return int(cfg.hidden_size * cfg.num_hidden_layers)

    def to(self, device: torch.device | str) -> PromptEncoder:
        self.language_model.to(device)
        return self

    def tokenize(self, prompts: Sequence[str]) -> torch.Tensor:
        rows = []
        for prompt in prompts:
            chat = [
                {"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]},
                {"role": "user", "content": [{"type": "text", "text": prompt}]},
            ]
            common = dict(tokenize=True, add_generation_prompt=False, add_vision_id=False)
            ids = _ids(
                self.tokenizer.apply_chat_template(
                    chat, max_length=self.max_sequence_length, truncation=True, padding="max_length", **common
                )
            )
            rows.append(torch.as_tensor(ids, dtype=torch.long))
            full = len(_ids(self.tokenizer.apply_chat_template(chat, **common)))
            if full > self.max_sequence_length and not self._warned_truncation:
                # the pipeline truncates silently; with a short max length the system prompt alone
                # can fill it, and then every instruction gets the same embedding
                log.warning(
                    "prompt of %d tokens truncated to max_sequence_length=%d (the text encoder's): %r",
                    full,
                    self.max_sequence_length,
                    prompt,
                )
                self._warned_truncation = True
        return torch.stack(rows)

    @torch.no_grad()
    def encode(self, prompts: Sequence[str], batch_size: int = 8) -> torch.Tensor:
        """list of B strings -> (B, L, D) in the language model's dtype, on its device."""
        prompts = list(prompts)
        if not prompts:
            raise ValueError("PromptEncoder.encode: empty prompt list")
        out = []
        for i in range(0, len(prompts), batch_size):
            ids = self.tokenize(prompts[i : i + batch_size]).to(self.device)
            self.num_calls += 1
            hidden = self.language_model(
                input_ids=ids, output_hidden_states=True, use_cache=False
            ).hidden_states
            layers = [(h - h.mean(-1, keepdim=True)) / (h.std(-1, keepdim=True) + 1e-8) for h in hidden[1:]]
            out.append(torch.cat(layers, dim=-1))
        return torch.cat(out)


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
