"""DiT4DiT: video-diffusion features -> flow-matching action head, trained jointly.

Input: a ``Batch`` (``dit4dit_npu/batch.py``) that fits the ``BatchSpec`` the model was built for,
checked once here at the boundary. Config: ``DiT4DiTConfig`` (from ``framework.cosmos25``: the
training mode and whether the action loss reaches the backbone); ``autocast`` is the trainer's
(``trainer.mixed_precision``). Training modes (``framework.cosmos25.training``):

- ``joint``: action and video losses. By default (as the original) the features are
  computed without grad, so only the video loss trains the transformer;
  ``backprop_action_to_backbone`` lets the action loss reach it too.
- ``action``: frozen backbone (requires_grad False), features only, no video loss.
- ``video``: no action head; the video loss only.

Cheaper joint steps (each off by default; docs/training.md): ``one_pass`` (the head reads block
``extract_layer`` of the video-loss pass, some samples at the inference noise convention),
``forward(video_loss=False)`` (the trainer's ``video_loss_interval``) and the backbone's
``video_loss_future_frames``.

``forward`` returns the two losses; how they are weighted is the trainer's business. Prompt
embeddings come from a ``PromptCache`` (``set_prompt_cache``): the text encoder is not part of
this module.
"""

from __future__ import annotations

import logging

import torch
from einops import rearrange
from torch import nn

from dit4dit_npu import device as dev
from dit4dit_npu.batch import Batch, BatchError, BatchSpec
from dit4dit_npu.errors import ConfigError
from dit4dit_npu.models.action_head import FlowMatchingActionHead
from dit4dit_npu.models.configs import DiT4DiTConfig
from dit4dit_npu.models.cosmos import CosmosBackbone
from dit4dit_npu.models.imagine import imagine
from dit4dit_npu.models.lora import has_lora
from dit4dit_npu.models.noise import InferenceNoise, TrainingNoise, checked, noise_from
from dit4dit_npu.models.pixels import to_uint8, to_vae_range
from dit4dit_npu.models.prompt_cache import PromptCache, PromptCacheError
from dit4dit_npu.models.rtc import PrefixGuidance
from dit4dit_npu.models.vae import vae_latents

log = logging.getLogger(__name__)


class DiT4DiT(nn.Module):
    def __init__(
        self,
        backbone: CosmosBackbone,
        action_model: FlowMatchingActionHead | None,
        cfg: DiT4DiTConfig,
        spec: BatchSpec,
        *,
        autocast: bool,
    ) -> None:
        """``autocast``: bf16 autocast on the device type (device.py) around the backbone; the
        head stays fp32."""
        super().__init__()
        mode = cfg.training
        if (action_model is None) != (mode == "video"):
            need = "has no action head" if mode == "video" else "needs an action head"
            raise ConfigError(f"framework.cosmos25.training: {mode!r} {need}")
        if action_model is not None:
            if action_model.chunk_length != spec.chunk_length:
                raise ConfigError(
                    f"framework.action_model.chunk_length: the head predicts {action_model.chunk_length} "
                    f"steps but the batches bring chunks of {spec.chunk_length}"
                )
            widths = (action_model.state_width, action_model.action_width)
            if widths != (spec.state_width, spec.action_width):
                raise ConfigError(
                    f"datasets.vla_data.max_action_dim: the head takes (state, action) = {widths}, the batch spec "
                    f"brings {(spec.state_width, spec.action_width)}"
                )
        backbone.check_frame_size(*spec.frame_size)
        self.backbone = backbone
        self.action_model = action_model
        self.cfg = cfg
        self.spec = spec
        self.autocast = autocast
        if (n := backbone.padded_frames(spec.num_frames)) != spec.num_frames:
            log.warning(
                "clips of %d frames are not 1 + %dk: each is padded to %d by repeating its last frame "
                "(choose the clip length to avoid this)",
                spec.num_frames,
                backbone.temporal_factor,
                n,
            )
        k = backbone.cfg.video_loss_future_frames
        if k is not None and k >= (have := backbone.latent_frames(spec.num_frames)):
            raise ConfigError(
                f"framework.cosmos25.video_loss_future_frames: {k}, but clips of {spec.num_frames} frames have "
                f"{have - 1} future latent frame(s) (set fewer, or null for all)"
            )
        self.prompt_cache: PromptCache | None = None
        if mode == "action":
            backbone.transformer.requires_grad_(False)

    @property
    def training_mode(self) -> str:
        """joint | action | video (``framework.cosmos25.training``; not nn.Module's ``training``)."""
        return self.cfg.training

    @property
    def feature_latent_frames(self) -> int:
        """Latent frames of the feature pass: those of the pass the head trains on, so inference sees
        the same S: the training clip's, or with one_pass the video loss's."""
        return self.video_latent_frames if self.cfg.one_pass else self.backbone.latent_frames(self.spec.num_frames)

    @property
    def video_latent_frames(self) -> int:
        """Latent frames the video loss reads: the observation + ``video_loss_future_frames``
        (default all the clip's)."""
        have, k = self.backbone.latent_frames(self.spec.num_frames), self.backbone.cfg.video_loss_future_frames
        return have if k is None else min(have, 1 + k)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    # ------------------------------------------------------------------ inputs

    def set_prompt_cache(self, cache: PromptCache) -> None:
        self.prompt_cache = cache

    def prompt_embeddings(self, instructions: list[str]) -> torch.Tensor:
        if self.prompt_cache is None:
            raise PromptCacheError("no prompt cache: call model.set_prompt_cache(cache) before forward")
        # Under autocast keep the cache's dtype (autocast casts for the matmul); else the weights'.
        dtype = None if self.autocast else self.backbone.dtype
        return self.prompt_cache.lookup(instructions, self.device, dtype)

    def video_input(self, frames: torch.Tensor) -> torch.Tensor:
        """Batch frames uint8 (B, T, 3, H, W) -> VAE input (B, 3, T, H, W) in [-1, 1]."""
        return video_input(frames)

    def _checked(self, batch: Batch, training: bool) -> Batch:
        batch.validate(self.spec, training=training)
        if batch.latents is not None:
            self._check_latent_shape(batch.latents)
        return batch.to(self.device)

    def _check_latent_shape(self, latents: torch.Tensor) -> None:
        bb = self.backbone
        h, w = (n // bb.spatial_factor for n in self.spec.frame_size)
        want = (bb.vae.config.z_dim, bb.latent_frames(self.spec.num_frames), h, w)
        if tuple(latents.shape[1:]) != want:
            raise BatchError(
                f"batch.latents: expected (B, {', '.join(map(str, want))}) for {self.spec.num_frames} frames of "
                f"{self.spec.frame_size[0]}x{self.spec.frame_size[1]}, got {tuple(latents.shape)} (a latent cache "
                "of another clip or image size?)"
            )

    def clip_latents(
        self, batch: Batch, condition_noise: torch.Tensor | None = None, video: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (normalised clip latents (B, 16, T_lat, h, w), conditioning latent (B, 16, 1, h, w)):
        from the batch's precomputed VAE latents (a latent cache) or one batched VAE encode of its
        frames; the rest of the step is the same either way. Only the latent frames the step reads
        are encoded (the VAE is causal: latent j depends on pixel frames up to 4j alone): latent 0
        without a video loss ("action" mode, ``video=False``), 1 + ``video_loss_future_frames``
        with that option, else the whole clip."""
        need = 1 if (self.training_mode == "action" or not video) else self.video_latent_frames
        whole = need == self.backbone.latent_frames(self.spec.num_frames)
        if batch.latents is not None:
            if self.backbone.cfg.condition_latent == "sample":
                raise BatchError(
                    "batch.latents: a latent cache stores posterior means, but this model conditions on a "
                    "posterior sample (condition_latent='sample'); train from video frames instead"
                )
            latents = self.backbone.normalize(batch.latents[:, :, :need])
            return latents, latents[:, :, :1]
        clip = self.video_input(batch.frames)
        if not whole:  # the pixel frames of the first `need` latents (no padding needed: 1 + 4k)
            clip = clip[:, :, : 1 + self.backbone.temporal_factor * (need - 1)]
        return self.backbone.encode_clip(clip, condition_noise)

    def _observation(
        self, batch: Batch, condition_noise: torch.Tensor | None = None, seed: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Conditioning latent (frame 0 only: later frames are never 'future' input (the original took extra input images, such as
        more views, as future frames); the
        causal VAE gives the same latent as the whole clip's encode) and prompt embeddings."""
        # a posterior-sample conditioning latent is drawn from its own stream of the call's seed
        g = torch.Generator().manual_seed(seed + 1) if seed is not None else None
        _, cond = self.backbone.encode_clip(self.video_input(batch.frames[:, :1]), condition_noise, g)
        return cond, self.prompt_embeddings(batch.instruction)

    # ------------------------------------------------------------------ training

    def forward(
        self, batch: Batch, noise: TrainingNoise | dict | None = None, video_loss: bool = True
    ) -> dict[str, torch.Tensor]:
        """-> {"action_loss", "video_loss"}, float32 scalars (a loss the mode lacks is 0).
        ``noise``: explicit draws for an exact replay (``noise.py``); unset fields are drawn.
        ``video_loss=False``: a joint step without its video loss (``trainer.video_loss_interval``):
        the feature pass of the observation and the action loss only, as at inference."""
        if not video_loss and self.training_mode != "joint":
            raise ValueError(f"video_loss=False: only a joint model skips its video loss, not {self.training_mode!r}")
        n = noise_from(noise, TrainingNoise) or TrainingNoise()
        batch = self._checked(batch, training=True)
        prompts = self.prompt_embeddings(batch.instruction)
        video = self.training_mode != "action" and video_loss
        # one batched encode (or the cached latents) gives conditioning + targets
        latents, cond = self.clip_latents(batch, n.condition, video)
        action_loss = vloss = latents.new_zeros(())
        grad = self.cfg.backprop_action_to_backbone and self.training_mode == "joint" and torch.is_grad_enabled()
        with dev.autocast(enabled=self.autocast):
            if self.cfg.one_pass and video:
                vloss, feats, sigma = self._one_pass(latents, prompts, cond, n)
                action_loss = self.action_model.loss(
                    feats if grad else feats.detach(), batch.state, batch.action, batch.action_mask,
                    n.action, n.action_time, sigma,
                )
                return {"action_loss": action_loss, "video_loss": vloss}
            if self.action_model is not None:
                feats = self.backbone.features(cond, prompts, self.feature_latent_frames, grad=grad, noise=n.feature)
                action_loss = self.action_model.loss(
                    feats, batch.state, batch.action, batch.action_mask, n.action, n.action_time,
                    self._feature_sigma(feats.shape[0]),
                )
            if video:
                vloss = self.backbone.video_flow_matching_loss(latents, prompts, cond, n.video_time, n.video)
        return {"action_loss": action_loss, "video_loss": vloss}

    def _one_pass(
        self, latents: torch.Tensor, prompts: torch.Tensor, cond: torch.Tensor, n: TrainingNoise
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The video loss and the head's features from one pass (``framework.cosmos25.one_pass``):
        each sample at the inference noise convention with probability ``inference_noise_share``."""
        b = latents.shape[0]
        u = checked(n.one_pass_draw, "one_pass_draw", (b,), latents.device)
        u = torch.rand(b, device=latents.device) if u is None else u
        return self.backbone.video_loss_and_features(
            latents, prompts, cond, u < self.cfg.inference_noise_share, n.video_time, n.video, n.feature
        )

    def _feature_sigma(self, b: int) -> torch.Tensor:
        """The noise level of the feature pass's features, (B,): what a head conditioned on it reads."""
        return torch.full((b,), self.backbone.feature_sigma, device=self.device)

    # ------------------------------------------------------------------ inference

    @torch.no_grad()
    def predict_action(
        self,
        batch: Batch,
        seed: int | None = None,
        noise: InferenceNoise | dict | None = None,
        guidance: PrefixGuidance | None = None,
    ) -> torch.Tensor:
        """Observation batch (frame 0 is used) -> normalised chunk (B, chunk_length, action_width),
        float32, padded dims included (PolicyIO drops them).

        Deterministic under ``seed`` (feature and action noise from CPU generators), dropout off
        whatever mode the module is in (the original evaluated in train mode).
        ``noise``: the action start, feature-pass latents and (condition_latent="sample") the
        conditioning eps, given explicitly (``noise.py``); given fields override ``seed``.
        ``guidance``: real-time chunking onto a previous chunk (``rtc.py``; normalized space): only
        the action head's Euler loop runs with autograd, for its vector-Jacobian products."""
        if self.action_model is None:
            raise ConfigError("framework.cosmos25.training: predict_action needs an action head; training is 'video'")
        n = noise_from(noise, InferenceNoise) or InferenceNoise()
        batch = self._checked(batch, training=False)
        was_training = self.training
        self.train(False)
        try:
            _, feats = self._features(batch, seed, n)
            g = torch.Generator().manual_seed(seed) if seed is not None else None
            return self.action_model.sample(
                feats, batch.state, g, n.action, guidance, self._feature_sigma(feats.shape[0])
            )
        finally:
            self.train(was_training)

    @torch.no_grad()
    def observation_features(self, batch: Batch, seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """What the action head reads, for analysis (a linear probe): -> (normalised conditioning
        latent (B, 16, 1, h, w), block ``extract_layer``'s output (B, S, hidden)), exactly as
        ``predict_action`` computes them under the same ``seed``."""
        batch = self._checked(batch, training=False)
        was_training = self.training
        self.train(False)
        try:
            return self._features(batch, seed, InferenceNoise())
        finally:
            self.train(was_training)

    def _features(self, batch: Batch, seed: int | None, n: InferenceNoise) -> tuple[torch.Tensor, torch.Tensor]:
        cond, prompts = self._observation(batch, n.condition, seed)
        with dev.autocast(enabled=self.autocast):
            feats = self.backbone.features(cond, prompts, self.feature_latent_frames, call_seed=seed, noise=n.feature)
        return cond, feats

    @torch.no_grad()
    def imagine_video(self, batch: Batch, num_steps: int = 2, seed: int | None = None) -> torch.Tensor:
        """The backbone's predicted clip from frame 0: uint8 (B, T_out, 3, H, W)."""
        batch = self._checked(batch, training=False)
        was_training = self.training
        self.train(False)
        try:
            cond, prompts = self._observation(batch, seed=seed)
            with dev.autocast(enabled=self.autocast):
                return imagine(self.backbone, cond, prompts, self.feature_latent_frames, num_steps, seed)
        finally:
            self.train(was_training)

    @torch.no_grad()
    def reconstruct_video(self, frames: torch.Tensor) -> torch.Tensor:
        """The VAE's round trip of a clip, for inspection next to ``imagine_video``: uint8 frames
        (B, T, 3, H, W) at the model's frame size -> encode (posterior mean, as the video loss's
        targets) -> decode -> uint8 (B, T, 3, H, W). Any T: padded to 1 + 4k as training pads."""
        if frames.ndim != 5 or frames.shape[2] != 3 or tuple(frames.shape[-2:]) != tuple(self.spec.frame_size):
            raise BatchError(
                f"frames: expected uint8 (B, T, 3, {self.spec.frame_size[0]}, {self.spec.frame_size[1]}), "
                f"got {tuple(frames.shape)}"
            )
        vae, t = self.backbone.vae, frames.shape[1]
        latents = vae_latents(vae, self.video_input(frames.to(self.device)))  # what a latent cache stores
        with dev.autocast(enabled=self.autocast):
            video = vae.decode(latents, return_dict=False)[0]
        return rearrange(to_uint8(video[:, :, :t]), "b c t h w -> b t c h w").contiguous()

    def use_backbone_dtype(self, dtype: torch.dtype) -> None:
        """Cast the video backbone (inference: half the memory, no per-op weight casts); the
        action head stays fp32. Reduced-precision weights need autocast for their fp32 inputs."""
        self.backbone.to(dtype)
        if dtype != torch.float32:
            self.autocast = True

    # ------------------------------------------------------------------ trainable weights

    def _trainable_prefixes(self) -> tuple[str, ...]:
        # The frozen base (VAE always; the transformer in "action" mode) is referred to by path.
        prefixes = ("action_model.",) if self.action_model is not None else ()
        if self.training_mode != "action" and not has_lora(self.backbone.transformer):
            prefixes = ("backbone.transformer.",) + prefixes
        return prefixes

    def _trainable_params(self) -> dict[str, nn.Parameter]:
        pre = self._trainable_prefixes()
        return {k: v for k, v in self.named_parameters() if k.startswith(pre)}

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Transformer (unless training "action") + action head: what an exported policy stores
        as its weights. A transformer carrying LoRA adapters contributes nothing here: its base is
        frozen and its adapters are ``models/lora.py``'s ``adapter_state_dict``."""
        return {k: v.detach() for k, v in self._trainable_params().items()}

    def load_trainable_state_dict(self, sd: dict[str, torch.Tensor], strict: bool = True) -> None:
        """Copy ``sd`` into the trainable weights, each in its parameter's dtype. A parameter still
        on the meta device (a module tree built without its weights: ``build_dit4dit(...,
        load_transformer=False)``) takes the tensor itself (cast to its dtype) instead of a copy;
        a weight left on meta is refused, strict or not (the model could not run)."""
        params = self._trainable_params()
        missing = sorted(set(params) - set(sd))
        unexpected = sorted(set(sd) - set(params))
        if strict and (missing or unexpected):
            raise KeyError(
                f"trainable weights do not match this model (training {self.training_mode!r}): "
                f"{len(missing)} missing (e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]})"
            )
        with torch.no_grad():
            for k, p in params.items():
                if k in sd:
                    if sd[k].shape != p.shape:
                        raise ValueError(f"{k}: checkpoint shape {tuple(sd[k].shape)} != model {tuple(p.shape)}")
                    if p.is_meta:
                        owner, _, name = k.rpartition(".")
                        setattr(self.get_submodule(owner), name,
                                nn.Parameter(sd[k].to(p.dtype), requires_grad=p.requires_grad))
                    else:
                        p.copy_(sd[k].to(p.dtype))
        left = [k for k, t in [*self.named_parameters(), *self.named_buffers()] if t.is_meta]
        if left:
            raise KeyError(f"{len(left)} weights of this model were never loaded (e.g. {left[:3]})")


def video_input(frames: torch.Tensor) -> torch.Tensor:
    """Batch frames uint8 (B, T, 3, H, W) -> VAE input (B, 3, T, H, W) in [-1, 1] (also what the
    latent cache encodes, ``data/encode_latents.py``)."""
    return rearrange(to_vae_range(frames), "b t c h w -> b c t h w")
