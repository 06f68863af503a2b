"""Inference API: an exported policy folder -> robot-unit action chunks.

    from dit4dit_npu import DiT4DiTPolicy

    policy = DiT4DiTPolicy.from_pretrained("runs/x/checkpoints/step_005000/policy")
    actions = policy.predict_action({
        "observation.images.cam_high": img_hwc_uint8, ...,   # one per camera key, any size
        "state": q,                                          # (state_dim,) robot units
        "instruction": "lift the pot",
    })                                                       # -> (chunk_length, action_dim)

Batched input (images (B, H, W, 3), state (B, state_dim), instruction list or one str) returns
(B, chunk_length, action_dim). Images are resized by the same swscale path as training decode
(``data.video.resize_rgb``), the state is encoded by the checkpoint's own ``Normalizer`` and the
chunk is unnormalized with it, padded dims removed: no normalized action leaves this module (the
original returned normalized actions and left unnormalization to each client, SPEC 5.1, A19).

The folder format is defined by ``export_policy`` in ``policy_folder.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dit4dit_npu import device as dev
from dit4dit_npu.config import Config
from dit4dit_npu.data.normalize import Normalizer, pad_to
from dit4dit_npu.data.video import resize_rgb
from dit4dit_npu.policy.folder import (
    FORMAT_VERSION,
    PolicyLoadError,
    export_policy,
    load_policy_folder,
)

log = logging.getLogger(__name__)

__all__ = ["DiT4DiTPolicy", "FORMAT_VERSION", "PolicyInputError", "PolicyLoadError", "export_policy"]

STATE, INSTRUCTION = "state", "instruction"
# openpi clients call the instruction "prompt"; accepting it costs nothing and avoids a
# confusing "missing instruction" for the most common integration.
ALIASES = {"prompt": INSTRUCTION}
# Live camera aspect ratio may differ this much from the training videos' before it is an error.
ASPECT_TOLERANCE = 0.02


class PolicyInputError(ValueError):
    """An observation the policy cannot take; the message says what was expected and what came."""


class DiT4DiTPolicy:
    """A trained DiT4DiT model with its normalizer and prompt cache, ready for inference."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: Config,
        normalizer: Normalizer,
        prompt_cache: Any,
        info: dict[str, Any],
        path: Path | None = None,
    ) -> None:
        self.model = model.eval()
        self.path = path  # the policy folder it was loaded from (None when built in memory)
        self.cfg = cfg
        self.normalizer = normalizer
        self.prompt_cache = prompt_cache
        self.info = info
        d = cfg.datasets.vla_data
        self.camera_keys: list[str] = list(d.camera_keys)
        self.image_size: tuple[int, int] = (int(d.image_size[0]), int(d.image_size[1]))
        self.state_dim = normalizer.state_dim
        self.action_dim = normalizer.action_dim
        self.chunk_length = cfg.framework.action_model.chunk_length
        # {camera: [[H, W], ...]} of the training videos, when the datasets declared them.
        self.source_image_sizes: dict[str, list[list[int]]] = info.get("source_image_sizes") or {}
        self._text_encoder: Any = None
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
        overrides: list[str] | None = None,
        backbone_dtype: torch.dtype | None = None,
    ) -> DiT4DiTPolicy:
        """Load an exported policy folder (or a checkpoint / run folder that holds one).

        ``base_model`` replaces the base-model path recorded at export (the frozen Cosmos weights
        are referred to, never copied); ``overrides`` are config overrides (``a.b=c``) applied on
        top of the recorded config, e.g. the bench's reference-path switches. ``backbone_dtype``
        (e.g. ``torch.bfloat16`` on an accelerator) casts the video backbone for inference: half
        the memory and no per-op weight casts under autocast; the action head stays fp32. The
        default keeps the training precision (fp32 weights + the config's autocast).
        """
        loaded = load_policy_folder(policy_dir, base_model=base_model, overrides=overrides)
        target = torch.device(device) if device is not None else dev.get_device()
        if backbone_dtype is not None:
            if backbone_dtype not in (torch.float32, dev.autocast_dtype()):
                raise ValueError(f"backbone_dtype: expected float32 or {dev.autocast_dtype()}, got {backbone_dtype}")
            loaded.model.backbone.to(backbone_dtype)
            # Reduced-precision weights need autocast on for their fp32 inputs, whatever the run used.
            if backbone_dtype != torch.float32:
                loaded.model.cfg = dataclasses.replace(loaded.model.cfg, autocast=True)
        model = loaded.model.to(target)
        return cls(model, loaded.cfg, loaded.normalizer, loaded.prompt_cache, loaded.info, loaded.path)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def metadata(self) -> dict[str, Any]:
        """What a client needs to build observations (sent by the server on connect)."""
        return {
            "policy": "dit4dit_npu",
            "format_version": FORMAT_VERSION,
            "camera_keys": self.camera_keys,
            "image_size": list(self.image_size),
            "source_image_sizes": self.source_image_sizes,
            "state_dim": self.state_dim,
            "action_dim": self.action_dim,
            "chunk_length": self.chunk_length,
            "step": self.info.get("step"),
            "base_model": self.info.get("base_model"),
            "instructions": sorted(self.prompt_cache.instructions),
            "observation_keys": [*self.camera_keys, STATE, INSTRUCTION],
        }

    # ------------------------------------------------------------------ instructions

    def add_instructions(self, instructions: list[str]) -> int:
        """Encode instructions not in the prompt cache yet (loads the text encoder once, on
        first need). Returns how many were encoded."""
        with self._lock:
            missing = [s for s in dict.fromkeys(instructions) if s not in self.prompt_cache]
            if not missing:
                return 0
            encoder = self._encoder(missing)
            n = self.prompt_cache.build(missing, encoder)
            log.info("encoded %d new instruction(s) into the prompt cache", n)
            return n

    def _encoder(self, missing: list[str]) -> Any:
        if self._text_encoder is None:
            from dit4dit_npu.models import build_prompt_encoder

            try:
                self._text_encoder = build_prompt_encoder(self.cfg).to(self.device)
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

    # ------------------------------------------------------------------ observations

    def preprocess(self, obs: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Observation dict -> (model batch in the schema of ``batch.py``, whether it was batched)."""
        if not isinstance(obs, dict):
            raise PolicyInputError(f"observation must be a dict, got {type(obs).__name__}")
        obs = {ALIASES.get(k, k): v for k, v in obs.items()}
        self._check_keys(obs)
        views, batched = [], None
        for key in self.camera_keys:
            imgs, is_batch = self._images(key, obs[key])
            if batched is None:
                batched = is_batch
            elif is_batch != batched or len(imgs) != len(views[0]):
                raise PolicyInputError(
                    f"{key}: {len(imgs)} image(s) {'batched' if is_batch else 'single'}, but "
                    f"{self.camera_keys[0]} has {len(views[0])} ({'batched' if batched else 'single'}); "
                    "every camera needs the same batch size"
                )
            views.append(imgs)
        b = len(views[0])
        state = self._state(obs[STATE], b, bool(batched))
        instructions = self._instructions(obs[INSTRUCTION], b, bool(batched))
        self.add_instructions(instructions)
        frames = torch.from_numpy(np.stack(views, axis=1))  # (B, V, H, W, 3)
        frames = frames.permute(0, 1, 4, 2, 3)[:, None].contiguous()  # (B, T=1, V, 3, H, W)
        encoded = pad_to(self.normalizer.encode_state(state), self.cfg.datasets.vla_data.max_state_dim)
        batch = {
            "frames": frames,
            "instruction": instructions,
            "state": torch.from_numpy(np.ascontiguousarray(encoded, dtype=np.float32)),
        }
        return batch, bool(batched)

    def _check_keys(self, obs: dict[str, Any]) -> None:
        expected = [*self.camera_keys, STATE, INSTRUCTION]
        missing = [k for k in expected if k not in obs]
        unknown = [k for k in obs if k not in expected]
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"missing {missing}")
            if unknown:
                parts.append(f"unexpected {unknown}")
            raise PolicyInputError(
                f"observation keys: {'; '.join(parts)}. Expected exactly {expected} "
                f"(camera keys from the training config), got {sorted(map(str, obs))}"
            )

    def _images(self, key: str, value: Any) -> tuple[np.ndarray, bool]:
        img = np.asarray(value)
        if img.dtype != np.uint8:
            raise PolicyInputError(
                f"{key}: expected a uint8 RGB image, got dtype {img.dtype}"
                + (" (scale [0, 1] floats with (x * 255).round().astype(np.uint8))" if img.dtype.kind == "f" else "")
            )
        if img.ndim not in (3, 4) or img.shape[-1] != 3:
            hint = " (channels-first? use HWC: img.transpose(1, 2, 0))" if img.ndim in (3, 4) and img.shape[-3] == 3 else ""
            raise PolicyInputError(f"{key}: expected (H, W, 3) or (B, H, W, 3) uint8, got shape {img.shape}{hint}")
        batched = img.ndim == 4
        imgs = img if batched else img[None]
        if len(imgs) == 0 or min(imgs.shape[1:3]) < 2:
            raise PolicyInputError(f"{key}: empty image or batch, shape {img.shape}")
        h, w = imgs.shape[1:3]
        if (h, w) != self.image_size:
            self._check_aspect(key, h, w)
            imgs = np.stack([resize_rgb(np.ascontiguousarray(x), self.image_size) for x in imgs])
        return imgs, batched

    def _check_aspect(self, key: str, h: int, w: int) -> None:
        """A frame of another aspect ratio than the training videos would be distorted differently
        than anything the model saw: refuse it rather than silently act on it."""
        sizes = self.source_image_sizes.get(key)
        if not sizes:
            return
        if any(abs((w / h) / (sw / sh) - 1.0) <= ASPECT_TOLERANCE for sh, sw in sizes):
            return
        raise PolicyInputError(
            f"{key}: image size {h}x{w} (HxW) has another aspect ratio than the training videos "
            f"({' or '.join(f'{sh}x{sw}' for sh, sw in sizes)}); crop to that aspect ratio, or pass "
            f"images already at the model size {self.image_size[0]}x{self.image_size[1]}"
        )

    def _state(self, value: Any, b: int, batched: bool) -> np.ndarray:
        try:
            state = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise PolicyInputError(f"state: expected numbers, got {type(value).__name__} ({e})") from None
        want = (b, self.state_dim) if batched else (self.state_dim,)
        if state.shape != want:
            raise PolicyInputError(
                f"state: expected shape {want} (state_dim={self.state_dim}, robot units, unpadded), got {state.shape}"
            )
        if not np.isfinite(state).all():
            raise PolicyInputError("state: contains NaN or inf")
        return (state if batched else state[None]).astype(np.float32)

    def _instructions(self, value: Any, b: int, batched: bool) -> list[str]:
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        if isinstance(value, str):
            texts = [value] * b
        elif batched and isinstance(value, list | tuple) and all(isinstance(s, str) for s in value):
            texts = list(value)
            if len(texts) != b:
                raise PolicyInputError(f"instruction: {len(texts)} strings for a batch of {b}")
        else:
            raise PolicyInputError(
                f"instruction: expected a str{' or a list of str' if batched else ''}, got {type(value).__name__}"
            )
        if any(not s.strip() for s in texts):
            raise PolicyInputError("instruction: empty string")
        return texts

    # ------------------------------------------------------------------ inference

    def postprocess(self, normalized: torch.Tensor, batched: bool) -> np.ndarray:
        """Model output (B, H_a, padded dims) -> robot units (B, H_a, action_dim) or (H_a, action_dim)."""
        chunk = normalized.detach().float().cpu().numpy()[..., : self.action_dim]
        actions = self.normalizer.unnormalize_action(chunk).astype(np.float32)
        return actions if batched else actions[0]

    @torch.inference_mode()
    def predict_action(self, obs: dict[str, Any], seed: int | None = None) -> np.ndarray:
        """Observation -> action chunk in robot units: (chunk, action_dim), or (B, chunk, action_dim)
        for batched input. Same ``seed`` and input -> same output."""
        batch, batched = self.preprocess(obs)
        with self._lock:
            normalized = self.model.predict_action(batch, seed=seed)
        return self.postprocess(normalized, batched)

    @torch.inference_mode()
    def predict_video(self, obs: dict[str, Any], steps: int = 2, seed: int | None = None) -> np.ndarray:
        """The backbone's imagined future from the current frames: uint8 (T, H, W_tiled, 3), or
        (B, T, H, W_tiled, 3) for batched input; views tiled as the model sees them, frame 0 is
        the reconstruction of the observation."""
        if steps < 1:
            raise PolicyInputError(f"steps: expected >= 1, got {steps}")
        batch, batched = self.preprocess(obs)
        with self._lock:
            video = self.model.imagine_video(batch, num_steps=steps, seed=seed)
        out = video.permute(0, 1, 3, 4, 2).cpu().numpy()  # (B, T, H, W, 3)
        return out if batched else out[0]
