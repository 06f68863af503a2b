"""Prompt embeddings exactly as the diffusers Cosmos-Predict2.5 pipeline computes them.

The original ran the 7B text encoder (through the VL model, with its unused vision tower resident
and a (B, 512, 152k) lm_head product) on every training step and every ``predict_action`` call
(B1 in ``bench/reference.py``). Here ``PromptEncoder`` runs once per unique instruction, its output is kept in the
prompt cache (``prompt_cache.py``; its file and its building: ``dit4dit_npu/weights``) and the text
encoder is freed. ``PromptEncoder`` is not an ``nn.Module``: it must never end up inside the
trained model (nor in DeepSpeed's engine or a checkpoint).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

# The Cosmos-Predict2.5 pipeline's system prompt (diffusers ``_get_prompt_embeds``).
SYSTEM_PROMPT = "You are a helpful assistant who will provide prompts to an image generator."


def _ids(encoded: Any) -> list[int]:
    # transformers 5.x returns a BatchEncoding, 4.x a list of ids
    return encoded["input_ids"] if not isinstance(encoded, list) and "input_ids" in encoded else encoded


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
