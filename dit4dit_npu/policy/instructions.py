"""The policy's run-time instructions: encoding ones its prompt cache lacks, and capping them.

An exported policy carries the embeddings of its training instructions (prompt_cache.safetensors);
any other instruction is encoded on first use by the base model's text encoder, loaded once and
only then. Apart from ``policy.py`` because it is its own job with its own state (the added
instructions in LRU order, their cap, the lazily built encoder and the lock guarding them), which
the policy's inference methods only call (``add_instructions``) and never read.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

from dit4dit_npu import device as dev
from dit4dit_npu.policy.manifest import inference_config
from dit4dit_npu.transforms.observation import PolicyInputError

log = logging.getLogger("dit4dit_npu.policy.policy")  # the logger these lines always went to


class RunTimeInstructions:
    """Mixed into ``DiT4DiTPolicy`` (it provides ``prompt_cache``, ``manifest`` and ``device``)."""

    prompt_cache: Any
    manifest: Any
    device: Any

    def _init_instructions(self, prompt_cache: Any) -> None:
        self.prompt_cache = prompt_cache
        self._text_encoder: Any = None
        # Instructions encoded at run time (not exported with the policy), least recently used
        # first. ``max_added_instructions`` caps them (None = no cap): each embedding is ~100 MB at
        # full size, so a server must not let network clients grow the cache without bound.
        self.max_added_instructions: int | None = None
        self._added: OrderedDict[str, None] = OrderedDict()
        # Guards the prompt cache and the lazily built text encoder (the server calls from one
        # worker thread, but a user may share a policy between threads).
        self._lock = threading.RLock()

    def add_instructions(self, instructions: list[str]) -> int:
        """Encode instructions not in the prompt cache yet (loads the text encoder once, on
        first need). Returns how many were encoded."""
        with self._lock:
            wanted = list(dict.fromkeys(instructions))
            for s in wanted:
                if s in self._added:
                    self._added.move_to_end(s)
            missing = [s for s in wanted if s not in self.prompt_cache]
            if not missing:
                return 0
            encoder = self._encoder(missing)
            n = self.prompt_cache.build(missing, encoder)
            self._added.update(dict.fromkeys(missing))
            log.info("encoded %d new instruction(s) into the prompt cache", n)
            self._evict_added(keep=set(wanted))
            return n

    def _evict_added(self, keep: set[str]) -> None:
        """Drop the least recently used run-time instructions beyond the cap (never the exported
        ones, never those of the current call)."""
        if self.max_added_instructions is None:
            return
        excess = len(self._added) - self.max_added_instructions
        for s in [s for s in self._added if s not in keep][: max(0, excess)]:
            del self._added[s]
            self.prompt_cache.discard(s)
            log.info("dropped instruction %r from the prompt cache (cap %d)", s, self.max_added_instructions)

    def _encoder(self, missing: list[str]) -> Any:
        if self._text_encoder is None:
            from dit4dit_npu.weights import build_prompt_encoder

            try:
                self._text_encoder = build_prompt_encoder(inference_config(self.manifest.model)).to(self.device)
            except Exception as e:  # base folder without text_encoder/, or weights that do not load
                raise PolicyInputError(
                    f"instruction(s) {missing[:3]} are not in the policy's prompt cache and no text encoder "
                    f"is available to encode them ({e}); use one of the cached instructions "
                    f"{sorted(self.prompt_cache.instructions)[:5]} or a base model with text_encoder/"
                ) from e
        return self._text_encoder

    def release_text_encoder(self) -> None:
        """Free the text encoder (it is ~8B parameters on the real model); cached prompts stay."""
        with self._lock:
            self._text_encoder = None
            dev.empty_cache()
