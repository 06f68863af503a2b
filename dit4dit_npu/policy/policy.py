"""Inference API: an exported policy folder -> robot-unit action chunks.

    from dit4dit_npu import DiT4DiTPolicy

    policy = DiT4DiTPolicy.from_pretrained("runs/x/checkpoints/step_005000/policy")
    actions = policy.predict_action({
        "observation.images.cam_high": img_hwc_uint8, ...,   # one per camera key, any size
        "state": q,                                          # (state_dim,) robot units
        "instruction": "lift the pot",
    })                                                       # -> (chunk_length, action_dim)

Batched input (images (B, H, W, 3), state (B, state_dim), instruction list or one str) returns
(B, chunk_length, action_dim). The checkpoint's own PolicyIO turns the observation into the
model's batch and the predicted chunk back into robot units, exactly as the training data was
transformed: ``predict_action`` never returns normalized actions (the original returned normalized
actions and left unnormalization to each client, SPEC 5.1, A19). Only ``predict_normalized``
does, for the server's DiT4DiT protocol, whose clients un-normalize themselves.
``predict_action(obs)`` is ``predict_parsed(io.parse_observation(obs))``; the server calls the two
halves apart, parsing each request once on arrival. Neither ever returns NaN/inf
(``NonFiniteActionError``).

The folder format is defined by ``folder.py`` (files) and ``manifest.py`` (policy.json).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dit4dit_npu import device as dev
from dit4dit_npu.batch import Batch
from dit4dit_npu.policy.folder import load_policy_folder
from dit4dit_npu.policy.manifest import FORMAT_VERSION, PolicyManifest, inference_config
from dit4dit_npu.transforms.observation import Observation, PolicyInputError
from dit4dit_npu.transforms.policy_io import NonFiniteActionError, PolicyIO

log = logging.getLogger(__name__)

__all__ = ["DiT4DiTPolicy", "NonFiniteActionError", "PolicyInputError"]

# A live state whose min-max position (training range -> [-1, 1]) exceeds this is warned about:
# one whole training range beyond either edge.
STATE_RANGE_WARNING = 3.0
_warned_state_range = False


def state_out_of_range(stats: Any, state: np.ndarray, limit: float = STATE_RANGE_WARNING) -> list[int]:
    """Dims of ``state`` (..., D) whose min-max normalized value exceeds ``limit`` in magnitude,
    whatever the policy's state encoding (dims constant in training are skipped)."""
    center, half = (stats.min + stats.max) / 2, (stats.max - stats.min) / 2
    live = half > 0
    z = np.abs(state.reshape(-1, len(half))[:, live] - center[live]) / half[live]
    return np.flatnonzero(live)[(z > limit).any(0)].tolist()


class DiT4DiTPolicy:
    """A trained DiT4DiT model with its PolicyIO and prompt cache, ready for inference.

    ``manifest`` is the folder's policy.json in memory (``policy/manifest.py``): the model
    section, the recorded datasets and held-out episodes, joint names; ``io`` every transform
    between robot and model."""

    def __init__(
        self,
        model: torch.nn.Module,
        manifest: PolicyManifest,
        io: PolicyIO,
        prompt_cache: Any,
        path: Path | None = None,
    ) -> None:
        self.model = model.eval()
        self.path = path  # the policy folder it was loaded from (None when built in memory)
        self.manifest = manifest
        self.io = io
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
        model.set_prompt_cache(prompt_cache)

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(
        cls,
        policy_dir: str | Path,
        device: torch.device | str | None = None,
        base_model: str | None = None,
        backbone_dtype: torch.dtype | None = None,
        merge_lora: bool = False,
    ) -> DiT4DiTPolicy:
        """Load an exported policy folder (or a checkpoint / run folder that holds one).

        ``base_model`` replaces the base-model path recorded at export (the frozen Cosmos weights
        are referred to, never copied). ``backbone_dtype`` (e.g. ``torch.bfloat16`` on an
        accelerator) casts the video backbone for inference: half the memory and no per-op
        weight casts under autocast; the action head stays fp32. The default keeps the training
        precision (fp32 weights + the config's autocast). ``merge_lora`` folds a LoRA policy's
        adapter into the base transformer at load (no adapter cost per step).
        """
        loaded = load_policy_folder(policy_dir, base_model=base_model, merge_lora=merge_lora)
        target = torch.device(device) if device is not None else dev.get_device()
        if backbone_dtype is not None:
            if backbone_dtype not in (torch.float32, dev.autocast_dtype()):
                raise ValueError(f"backbone_dtype: expected float32 or {dev.autocast_dtype()}, got {backbone_dtype}")
            loaded.model.use_backbone_dtype(backbone_dtype)
        model = loaded.model.to(target)
        return cls(model, loaded.manifest, loaded.io, loaded.prompt_cache, loaded.path)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # The observation contract, read from the PolicyIO (one owner).
    @property
    def camera_keys(self) -> list[str]:
        return list(self.io.camera_keys)

    @property
    def image_size(self) -> tuple[int, int]:
        return self.io.image_size

    @property
    def state_dim(self) -> int:
        return self.io.state_dim

    @property
    def action_dim(self) -> int:
        return self.io.action_dim

    @property
    def chunk_length(self) -> int:
        return self.io.chunk_length

    @property
    def metadata(self) -> dict[str, Any]:
        """What a client needs to build observations (sent by the server on connect)."""
        return {
            "policy": "dit4dit_npu",
            "format_version": FORMAT_VERSION,
            "camera_keys": self.camera_keys,
            "image_size": list(self.image_size),
            "source_image_sizes": self.io.source_sizes,
            "state_dim": self.state_dim,
            "action_dim": self.action_dim,
            "chunk_length": self.chunk_length,
            "step": self.manifest.step,
            "base_model": self.manifest.base_model,
            "instructions": sorted(self.prompt_cache.instructions),
            "observation_keys": [*self.camera_keys, "state", "instruction"],
        }

    # ------------------------------------------------------------------ instructions

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

    # ------------------------------------------------------------------ inference

    @torch.inference_mode()
    def predict_action(self, obs: dict[str, Any], seed: int | None = None, noise: Any = None) -> np.ndarray:
        """Observation -> action chunk in robot units: (chunk, action_dim), or (B, chunk, action_dim)
        for batched input. Same ``seed`` and input -> same output.

        ``noise``: the call's random draws given explicitly, for an exact replay or a comparison
        with another implementation: a dict (or ``InferenceNoise``) with ``action`` (B,
        chunk, action width) the Euler start in the model's normalized, padded action space,
        ``feature`` (B, 16, T_lat, h, w) the feature-pass latents, and ``condition`` (B, 16, 1,
        h, w) the conditioning latent's posterior eps (policies imported from DiT4DiT); B = 1 for
        unbatched input. See dit4dit_npu/models/noise.py."""
        return self.predict_parsed(self.io.parse_observation(obs), seed=seed, noise=noise)

    @torch.inference_mode()
    def predict_parsed(self, observation: Observation, seed: int | None = None, noise: Any = None) -> np.ndarray:
        """``predict_action`` for an observation already parsed by ``io.parse_observation`` (checked,
        resized): the server parses each request once, on arrival, and batches the parsed ones
        (``concat_observations``). Raises ``NonFiniteActionError`` rather than return NaN/inf."""
        self._warn_state_out_of_range(observation.state)
        batch = self.io.encode_parsed(observation)
        self.add_instructions(batch.instruction)
        with self._lock:
            normalized = self.model.predict_action(batch, seed=seed, noise=noise)
        actions = self._finite(self.io.decode_actions(normalized), "predict_action")
        return actions if observation.batched else actions[0]

    def _finite(self, actions: np.ndarray, call: str) -> np.ndarray:
        """Nothing non-finite reaches a robot or a client: raise instead of returning NaN/inf.
        The one check, for both outputs (robot units and normalized, whose padded dims follow
        the real ones)."""
        bad = ~np.isfinite(actions)
        if bad.any():
            joints = np.flatnonzero(bad.reshape(-1, actions.shape[-1]).any(0)).tolist()
            names = list(self.manifest.data.action_names or [f"action[{j}]" for j in range(self.action_dim)])
            names += [f"padding[{j}]" for j in range(len(names), actions.shape[-1])]
            raise NonFiniteActionError(
                f"{call} produced {int(bad.sum())} NaN/inf value(s) of {bad.size} (joints "
                f"{[names[j] for j in joints[:6]]}); refusing to return them: the observation is far outside "
                "the training data, or the policy's weights/normalizer are damaged"
            )
        return actions

    def _warn_state_out_of_range(self, state: np.ndarray) -> None:
        """Warn (once per process) when a live state (robot units, (B, state_dim)) lies far outside
        the training range: the model never saw such inputs and its actions there are guesses."""
        global _warned_state_range
        if _warned_state_range or not self.io.state_dim:
            return
        joints = state_out_of_range(self.io.stats["state"], state)
        if joints:
            _warned_state_range = True
            names = self.manifest.data.state_names or [f"state[{j}]" for j in range(self.io.state_dim)]
            log.warning(
                "state far outside the training range (min-max normalized |x| > %g) in %s; actions "
                "there are extrapolation. Check the robot's units and joint order (warned once per process)",
                STATE_RANGE_WARNING, [names[j] for j in joints],
            )

    @torch.inference_mode()
    def predict_video(self, obs: dict[str, Any], steps: int = 2, seed: int | None = None) -> np.ndarray:
        """The backbone's imagined future from the current frames: uint8 (T, H, W_tiled, 3), or
        (B, T, H, W_tiled, 3) for batched input; views tiled as the model sees them, frame 0 is
        the reconstruction of the observation."""
        if steps < 1:
            raise PolicyInputError(f"steps: expected >= 1, got {steps}")
        batch, batched = self.io.encode_observation(obs)
        self.add_instructions(batch.instruction)
        with self._lock:
            video = self.model.imagine_video(batch, num_steps=steps, seed=seed)
        out = video.permute(0, 1, 3, 4, 2).cpu().numpy()  # (B, T, H, W, 3)
        return out if batched else out[0]

    @torch.inference_mode()
    def predict_normalized(
        self, frames: np.ndarray, state: np.ndarray | None, instructions: list[str], seed: int | None = None
    ) -> np.ndarray:
        """Model-space inputs -> the model's normalized chunk (B, chunk, action_width) float32,
        padded dims included: what the original DiT4DiT model returned to its own clients, which
        un-normalize themselves. ``frames``: uint8 (B, H, W_tiled, 3), the views already resized and
        tiled as ``io.frame_size``; ``state``: (B, state_width), already encoded and padded (None
        when the policy takes no state). The server's DiT4DiT protocol; robots should use
        ``predict_action``. Raises ``NonFiniteActionError`` rather than return NaN/inf."""
        batch = Batch(
            frames=torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)[:, None].contiguous(),
            instruction=list(instructions),
            state=None if state is None else torch.from_numpy(np.asarray(state, dtype=np.float32)),
        )
        self.add_instructions(batch.instruction)
        with self._lock:
            normalized = self.model.predict_action(batch, seed=seed).float().cpu().numpy()
        return self._finite(normalized, "predict_normalized")
