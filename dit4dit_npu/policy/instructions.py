"""The policy's run-time instructions: encoding ones its prompt cache lacks, and capping them.

An exported policy carries the embeddings of its training instructions (prompt_cache.safetensors);
any other instruction is encoded on first use by the base model's text encoder, loaded once and
only then. Apart from ``policy.py`` because it is its own job with its own state (the added
instructions in LRU order, their cap, the lazily built encoder). ``DiT4DiTPolicy`` holds one and
calls it only under the policy's lock, which also guards the model calls that read the cache, so
this class takes no lock of its own.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from dit4dit_npu import device as dev
from dit4dit_npu.policy.manifest import inference_config
from dit4dit_npu.transforms.observation import PolicyInputError

log = logging.getLogger("dit4dit_npu.policy.policy")  # the logger these lines always went to


class RunTimeInstructions:
    """The prompt cache of one policy and the instructions added to it at run time.

    ``max_added`` caps those (None = no cap): each embedding is ~100 MB at full size, so a server
    must not let network clients grow the cache without bound. A setting of the policy, given
    when it is built (``DiT4DiTPolicy.from_pretrained(..., max_added_instructions=N)``)."""

    def __init__(self, prompt_cache: Any, manifest: Any, max_added: int | None = None) -> None:
        if max_added is not None and (isinstance(max_added, bool) or not isinstance(max_added, int) or max_added < 0):
            raise PolicyInputError(f"max_added_instructions: expected an int >= 0 or None, got {max_added!r}")
        self.cache = prompt_cache
        self.manifest = manifest
        self.max_added = max_added
        self.text_encoder: Any = None
        # Instructions encoded at run time (not exported with the policy), least recently used first.
        self._added: OrderedDict[str, None] = OrderedDict()

    def add(self, instructions: list[str], device: Any) -> int:
        """Encode instructions not in the prompt cache yet (loads the text encoder onto ``device``
        once, on first need). Returns how many were encoded."""
        wanted = list(dict.fromkeys(instructions))
        for s in wanted:
            if s in self._added:
                self._added.move_to_end(s)
        missing = [s for s in wanted if s not in self.cache]
        if not missing:
            return 0
        n = self.cache.build(missing, self._encoder(missing, device))
        self._added.update(dict.fromkeys(missing))
        log.info("encoded %d new instruction(s) into the prompt cache", n)
        self._evict_added(keep=set(wanted))
        return n

    def _evict_added(self, keep: set[str]) -> None:
        """Drop the least recently used run-time instructions beyond the cap (never the exported
        ones, never those of the current call)."""
        if self.max_added is None:
            return
        excess = len(self._added) - self.max_added
        for s in [s for s in self._added if s not in keep][: max(0, excess)]:
            del self._added[s]
            self.cache.discard(s)
            log.info("dropped instruction %r from the prompt cache (cap %d)", s, self.max_added)

    def _encoder(self, missing: list[str], device: Any) -> Any:
        if self.text_encoder is None:
            from dit4dit_npu.weights import build_prompt_encoder

            try:
                self.text_encoder = build_prompt_encoder(inference_config(self.manifest.model)).to(device)
            except Exception as e:  # base folder without text_encoder/, or weights that do not load
                raise PolicyInputError(
                    f"instruction(s) {missing[:3]} are not in the policy's prompt cache and no text encoder "
                    f"is available to encode them ({e}); use one of the cached instructions "
                    f"{sorted(self.cache.instructions)[:5]} or a base model with text_encoder/"
                ) from e
        return self.text_encoder

    def release_text_encoder(self) -> None:
        """Free the text encoder (it is ~8B parameters on the real model); cached prompts stay."""
        self.text_encoder = None
        dev.empty_cache()
