"""DiT4DiT: video-diffusion features -> flow-matching action head, trained jointly (SPEC §1-2).

Batch schema: ``dit4dit_npu/batch.py`` (frames (B, T, V, 3, H, W) uint8 or float [0, 1],
instruction list[str], state, action, action_mask). Modes (``framework.cosmos25.training``):

- ``joint``: L = L_action + lambda * L_video. By default (as the original, SPEC A1) the features
  are computed without grad, so only L_video trains the transformer; ``backprop_action_to_backbone``
  lets L_action reach it too.
- ``action``: frozen backbone (requires_grad False), features only, no video loss.
- ``video``: no action head; L_video only.

The text encoder is not part of this module: prompt embeddings come from a ``PromptCache``
(``set_prompt_cache``), except with ``reference_text_encoder_per_step`` (bench only), where a
``PromptEncoder`` is held *unregistered* (so it is never trained, sharded, or checkpointed).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dit4dit_npu import device as dev
from dit4dit_npu.config import ConfigError, Cosmos25Config
from dit4dit_npu.models.action_head import FlowMatchingActionHead
from dit4dit_npu.models.cosmos import CosmosBackbone
from dit4dit_npu.models.imagine import imagine
from dit4dit_npu.models.text import PromptCache, PromptCacheError, PromptEncoder
from dit4dit_npu.models.views import FrameInputError, tile_views, to_vae_range

Batch = dict[str, Any]


class DiT4DiT(nn.Module):
    def __init__(
        self,
        backbone: CosmosBackbone,
        action_model: FlowMatchingActionHead | None,
        cosmos: Cosmos25Config,
        *,
        feature_latent_frames: int,
        video_loss_weight: float = 1.0,
        autocast_enabled: bool = True,
        prompt_encoder: PromptEncoder | None = None,
    ) -> None:
        super().__init__()
        self.mode = cosmos.training
        if (action_model is None) != (self.mode == "video"):
            raise ConfigError(
                f"framework.cosmos25.training={self.mode!r} "
                + ("has no action head" if self.mode == "video" else "needs an action head")
            )
        backbone.check_extract_layer(cosmos.extract_layer)
        self.backbone = backbone
        self.action_model = action_model
        self.cosmos = cosmos
        # Latent frames of the feature pass (the training clip's, so inference sees the same S).
        self.feature_latent_frames = feature_latent_frames
        self.video_loss_weight = video_loss_weight
        self.autocast_enabled = autocast_enabled
        self.prompt_cache: PromptCache | None = None
        self.prompt_encoder = prompt_encoder  # plain object: not a registered submodule
        if cosmos.reference_text_encoder_per_step and prompt_encoder is None:
            raise ConfigError("framework.cosmos25.reference_text_encoder_per_step needs a PromptEncoder")
        if self.mode == "action":
            backbone.transformer.requires_grad_(False)

    # ------------------------------------------------------------------ inputs

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def set_prompt_cache(self, cache: PromptCache) -> None:
        self.prompt_cache = cache

    def prompt_embeddings(self, instructions: list[str]) -> torch.Tensor:
        if isinstance(instructions, str):
            raise PromptCacheError("batch['instruction'] must be a list of strings, got one str")
        # Under autocast keep the cache's dtype (autocast casts for the matmul); else the weights'.
        device, dtype = self.device, None if self.autocast_enabled else self.backbone.dtype
        if self.cosmos.reference_text_encoder_per_step:
            assert self.prompt_encoder is not None
            if self.prompt_encoder.device != device:
                self.prompt_encoder.to(device)
            return self.prompt_encoder.encode(list(instructions)).to(device=device, dtype=dtype)
        if self.prompt_cache is None:
            raise PromptCacheError("no prompt cache: call model.set_prompt_cache(cache) before forward")
        return self.prompt_cache.lookup(list(instructions), device, dtype)

    def video_input(self, frames: torch.Tensor) -> torch.Tensor:
        """(B, T, V, 3, H, W) uint8/float -> VAE input (B, 3, T, H', W') in [-1, 1], views tiled."""
        if not isinstance(frames, torch.Tensor) or frames.ndim != 6 or frames.shape[3] != 3:
            shape = tuple(frames.shape) if isinstance(frames, torch.Tensor) else type(frames).__name__
            raise FrameInputError(f"batch['frames']: expected (B, T, V, 3, H, W), got {shape}")
        tiled = tile_views(frames.to(self.device, non_blocking=True), self.cosmos.view_layout)
        self.backbone.check_frame_size(tiled.shape[-2], tiled.shape[-1])
        return to_vae_range(tiled).permute(0, 2, 1, 3, 4)

    def _get(self, batch: Batch, key: str) -> torch.Tensor | None:
        value = batch.get(key)
        return value.to(self.device, non_blocking=True) if value is not None else None

    def _condition(self, video: torch.Tensor, latents: torch.Tensor | None) -> torch.Tensor:
        if self.cosmos.reference_separate_condition_encode:
            n = (self.feature_latent_frames - 1) * self.backbone.temporal_factor + 1
            return self.backbone.encode_condition_reference(video[:, :, :1], max(n, video.shape[2]))
        if latents is None:  # inference: encode frame 0 only (causal VAE: same latent)
            latents = self.backbone.encode_video(video[:, :, :1])
        return latents[:, :, :1]

    def _features(
        self, cond: torch.Tensor, prompts: torch.Tensor, seed: int | None, grad: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> (features, whatever must stay alive until the loss is computed)."""
        c = self.cosmos
        if c.reference_full_depth_feature_pass:
            return self.backbone.features_reference(
                cond, prompts, c.extract_layer, self.feature_latent_frames, seed
            )
        feats = self.backbone.features(
            cond, prompts, c.extract_layer, self.feature_latent_frames, seed, grad=grad
        )
        return feats, None

    # ------------------------------------------------------------------ training

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
        """-> {"action_loss", "video_loss", "total_loss"} (a loss absent in the mode is 0)."""
        video = self.video_input(batch["frames"])
        prompts = self.prompt_embeddings(batch["instruction"])
        # one batched encode gives conditioning + targets; "action" mode needs only frame 0
        latents = self.backbone.encode_video(video if self.mode != "action" else video[:, :, :1])
        cond = self._condition(video, latents)
        zero = latents.new_zeros(())
        action_loss = video_loss = zero
        with dev.autocast(enabled=self.autocast_enabled):
            if self.action_model is not None:
                grad = (
                    self.cosmos.backprop_action_to_backbone
                    and self.mode == "joint"
                    and torch.is_grad_enabled()
                )
                feats, _keep_alive = self._features(cond, prompts, self.cosmos.feature_noise_seed, grad)
                action_loss = self.action_model.loss(
                    feats,
                    self._get(batch, "state"),
                    batch["action"].to(self.device),
                    self._get(batch, "action_mask"),
                )
            if self.mode != "action":
                video_loss = self.backbone.video_flow_matching_loss(latents, prompts, cond)
        total = action_loss + self.video_loss_weight * video_loss
        return {"action_loss": action_loss, "video_loss": video_loss, "total_loss": total}

    # ------------------------------------------------------------------ inference

    def _obs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Conditioning latent (frame 0 only; later frames are never 'future' input, SPEC A5) and
        prompt embeddings of an observation batch."""
        video = self.video_input(batch["frames"][:, :1])
        return self._condition(video, None), self.prompt_embeddings(batch["instruction"])

    def _feature_seed(self, seed: int | None) -> int | None:
        # The model's own seed wins (it is what training saw); a call seed only fills in for None.
        s = self.cosmos.feature_noise_seed
        return s if s is not None else seed

    @torch.no_grad()
    def predict_action(self, batch: Batch, seed: int | None = None) -> torch.Tensor:
        """Observation batch -> normalised action chunk (B, H_a, action_dim), float32.

        Deterministic under ``seed`` (feature and action noise from CPU generators), dropout off
        whatever mode the module is in (the original evaluated in train mode, SPEC A6)."""
        if self.action_model is None:
            raise ConfigError("predict_action needs an action head; framework.cosmos25.training is 'video'")
        was_training = self.training
        self.train(False)
        try:
            cond, prompts = self._obs(batch)
            with dev.autocast(enabled=self.autocast_enabled):
                feats, _ = self._features(cond, prompts, self._feature_seed(seed), grad=False)
            g = torch.Generator().manual_seed(seed) if seed is not None else None
            return self.action_model.sample(feats, self._get(batch, "state"), g)
        finally:
            self.train(was_training)

    @torch.no_grad()
    def imagine_video(self, batch: Batch, num_steps: int = 2, seed: int | None = None) -> torch.Tensor:
        """The backbone's predicted clip from frame 0: uint8 (B, T_out, 3, H, W_tiled)."""
        was_training = self.training
        self.train(False)
        try:
            cond, prompts = self._obs(batch)
            with dev.autocast(enabled=self.autocast_enabled):
                return imagine(self.backbone, cond, prompts, self.feature_latent_frames, num_steps, seed)
        finally:
            self.train(was_training)

    # ------------------------------------------------------------------ trainable weights

    def _trainable_prefixes(self) -> tuple[str, ...]:
        # The frozen base (VAE always; the transformer in "action" mode) is referred to by path.
        prefixes = ("action_model.",) if self.action_model is not None else ()
        if self.mode != "action":
            prefixes = ("backbone.transformer.",) + prefixes
        return prefixes

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Transformer (unless mode "action") + action head: what an exported policy stores."""
        pre = self._trainable_prefixes()
        return {k: v.detach() for k, v in self.named_parameters() if k.startswith(pre)}

    def load_trainable_state_dict(self, sd: dict[str, torch.Tensor], strict: bool = True) -> None:
        pre = self._trainable_prefixes()
        params = {k: v for k, v in self.named_parameters() if k.startswith(pre)}
        missing = sorted(set(params) - set(sd))
        unexpected = sorted(set(sd) - set(params))
        if strict and (missing or unexpected):
            raise KeyError(
                f"trainable weights do not match this model (mode {self.mode!r}): "
                f"{len(missing)} missing (e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]})"
            )
        with torch.no_grad():
            for k, p in params.items():
                if k in sd:
                    if sd[k].shape != p.shape:
                        raise ValueError(
                            f"{k}: checkpoint shape {tuple(sd[k].shape)} != model {tuple(p.shape)}"
                        )
                    p.copy_(sd[k].to(p.dtype))
