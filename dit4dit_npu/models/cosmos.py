"""Video backbone: Cosmos-Predict2.5 transformer + Wan VAE.

Per training step, versus the original (B2-B4 in ``bench/reference.py``, which rebuilds its way):
- one batched VAE encode of the clip (posterior mean, no grad); latent frame 0 conditions;
- the feature pass runs under ``no_grad`` and stops after block ``extract_layer`` (the original
  ran all blocks and the output head with an autograd graph it then discarded; that path is
  rebuilt from these same modules in ``bench/reference.py``);
- the video flow-matching pass is the only one with gradients.
Tensors are channels-first video: (B, C, T, H, W), latents (B, 16, T_lat, H/8, W/8).
A clip's VAE encode itself (also used without a backbone) is ``vae.py``.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import torch
from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
from torch import nn

from dit4dit_npu import device as dev
from dit4dit_npu.errors import ConfigError
from dit4dit_npu.models.configs import BackboneConfig, VideoTimeConfig
from dit4dit_npu.models.cosmos_blocks import run_blocks, run_split
from dit4dit_npu.models.noise import NoiseError, checked
from dit4dit_npu.models.vae import (
    causal_length,
    pad_to_causal_length,
    vae_latents,
    vae_layout,
    vae_temporal_factor,
)
from dit4dit_npu.models.wan_frame import first_frame_moments


def fresh_schedule(scheduler: Any, num_steps: int, device: torch.device | None = None) -> Any:
    """A copy of the scheduler set to ``num_steps`` (``set_timesteps`` and ``step`` mutate it)."""
    s = copy.deepcopy(scheduler)
    with warnings.catch_warnings():  # diffusers' numpy-2 __array__ DeprecationWarning, not ours
        warnings.simplefilter("ignore", DeprecationWarning)
        s.set_timesteps(num_steps, device=device)
    return s


def first_step_sigma(scheduler: Any) -> float:
    """sigma of a 1-step schedule = the feature pass's noise level (real config: 200/201 ~ 0.995).

    Read from the scheduler, never hard-coded, so a different scheduler_config.json is honoured.
    """
    return float(fresh_schedule(scheduler, 1).sigmas[0])


class CosmosBackbone(nn.Module):
    """Transformer (trainable) + VAE (always frozen, eval) + the scheduler's sigma convention.

    Config: ``BackboneConfig`` (from ``framework.cosmos25``); ``gradient_checkpointing`` is the
    trainer's (``trainer.enable_gradient_checkpointing``)."""

    def __init__(
        self,
        transformer: nn.Module,
        vae: nn.Module,
        scheduler: Any,
        cfg: BackboneConfig,
        gradient_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.transformer = transformer
        self.vae = vae.eval().requires_grad_(False)
        self.scheduler = scheduler  # stateless use only (copies are stepped)
        z = vae.config.z_dim
        # Convention: latents_std holds the TRUE per-channel std (the VAE config's value) and we
        # normalise z_n = (z - mean) / std, as DiT4DiT does at the diffusers commit it pins (its
        # pipe.latents_std was the true std there; diffusers >= 0.39 stores 1/std and multiplies,
        # the same maths). Plain fp32 tensors, not buffers: a bf16 cast of the whole model
        # (DeepSpeed) must not round these constants.
        self.latents_mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32).view(1, z, 1, 1, 1)
        self.latents_std = torch.tensor(vae.config.latents_std, dtype=torch.float32).view(1, z, 1, 1, 1)
        self.temporal_factor = vae_temporal_factor(vae)  # 4 (causal: T_lat = (T-1)//4+1)
        self.spatial_factor = 2 ** len(vae.config.temperal_downsample)  # 8
        self.feature_sigma = first_step_sigma(scheduler)
        if not 0 <= cfg.extract_layer < self.num_layers:  # the depth is the loaded model's
            raise ConfigError(
                f"framework.cosmos25.extract_layer: got {cfg.extract_layer}, expected 0..{self.num_layers - 1} "
                f"(the transformer has {self.num_layers} blocks)"
            )
        if gradient_checkpointing:
            transformer.enable_gradient_checkpointing()

    # ------------------------------------------------------------------ properties / mode

    @property
    def hidden_size(self) -> int:
        c = self.transformer.config
        return int(c.num_attention_heads * c.attention_head_dim)

    @property
    def num_layers(self) -> int:
        return len(self.transformer.transformer_blocks)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.transformer.parameters()).dtype

    def train(self, mode: bool = True) -> CosmosBackbone:
        super().train(mode)
        self.vae.eval()  # frozen: never in train mode, whatever the caller does
        return self

    def padded_frames(self, num_frames: int) -> int:
        """Pixel frames the VAE encodes for a clip of ``num_frames`` (padded to 1 + 4k)."""
        return causal_length(num_frames, self.temporal_factor)

    def latent_frames(self, num_frames: int) -> int:
        """Latent frames of a clip of ``num_frames`` pixel frames (after padding to 1 + 4k)."""
        return (self.padded_frames(num_frames) - 1) // self.temporal_factor + 1

    def check_frame_size(self, height: int, width: int) -> None:
        mult = self.spatial_factor * self.transformer.config.patch_size[1]  # 8 x 2 = 16
        if height % mult or width % mult:  # the frame is PolicyIO's: the image size tiled by the layout
            raise ConfigError(
                f"datasets.vla_data.image_size (x the view layout): tiled frame {height}x{width} must be divisible "
                f"by {mult} (VAE x{self.spatial_factor}, then patch x{mult // self.spatial_factor})"
            )

    # ------------------------------------------------------------------ VAE

    def pad_clip(self, video: torch.Tensor) -> torch.Tensor:
        """(B, 3, T, H, W): pad T to 1 + 4k by repeating the last frame."""
        return pad_to_causal_length(video, self.temporal_factor)

    def normalize(self, z: torch.Tensor) -> torch.Tensor:
        return (z.float() - self.latents_mean.to(z.device)) / self.latents_std.to(z.device)

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        return z.float() * self.latents_std.to(z.device) + self.latents_mean.to(z.device)

    @property
    def vae_dtype(self) -> torch.dtype:
        return next(self.vae.parameters()).dtype

    @torch.no_grad()
    def encode_clip(
        self,
        video: torch.Tensor,
        condition_noise: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, 3, T, H, W) in [-1, 1] -> (normalised posterior-mean latents, conditioning latent
        (B, 16, 1, h, w)), from one encode. The conditioning latent is latent 0 of the mean, or
        with ``condition_latent="sample"`` mean + std * eps (``condition_noise``, else one draw
        from ``generator`` shared by the batch, else global-RNG draws per sample): the causal VAE
        gives latent 0 the same posterior whatever follows frame 0, so this equals DiT4DiT's
        separate encode of frame 0 zero-padded. A single frame (inference's observation) is
        encoded by the VAE's 2-D equivalent (``wan_frame.py``: a third of the work)."""
        dist = self._posterior(self.pad_clip(video).to(self.vae_dtype))
        latents = self.normalize(dist.mode())
        if self.cfg.condition_latent == "mean":
            if condition_noise is not None:
                raise NoiseError(
                    "noise.condition: this model conditions on the posterior mean (condition_latent='mean') "
                    "and draws no conditioning noise"
                )
            return latents, latents[:, :, :1]
        mean0, std0 = dist.mean[:, :, :1], dist.std[:, :, :1]
        eps = checked(condition_noise, "condition", tuple(mean0.shape), mean0.device)
        if eps is None and generator is not None:
            eps = torch.randn((1, *mean0.shape[1:]), generator=generator).to(mean0.device).expand_as(mean0)
        eps = torch.randn_like(mean0) if eps is None else eps.to(mean0.dtype)
        return latents, self.normalize(mean0 + std0 * eps)

    def _posterior(self, video: torch.Tensor) -> DiagonalGaussianDistribution:
        moments = first_frame_moments(self.vae, video) if video.shape[2] == 1 else None
        if moments is None:
            moments = self.vae.encode(vae_layout(self.vae, video)).latent_dist.parameters.contiguous()
        return DiagonalGaussianDistribution(moments)

    @torch.no_grad()
    def encode_video(self, video: torch.Tensor) -> torch.Tensor:
        """(B, 3, T, H, W) in [-1, 1] -> normalised latents (B, 16, T_lat, H/8, W/8), float32.

        One batched encode, posterior mean (deterministic, like the pipeline's ``argmax``). With
        T == 1 only the conditioning latent is computed: the Wan VAE is causal and encodes pixel
        frame 0 alone, so this equals latent 0 of the whole clip's encode.
        """
        return self.normalize(vae_latents(self.vae, video))

    # ------------------------------------------------------------------ transformer inputs

    def transformer_inputs(
        self, cond: torch.Tensor, x: torch.Tensor, sigma: torch.Tensor, prompt_embeds: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Conditioned transformer inputs: frame 0 replaced by the clean conditioning latent, a
        condition-mask channel, and a per-frame timestep (conditional_frame_timestep on frame 0,
        ``sigma`` (B,) elsewhere), as the pipeline's denoising loop builds them."""
        b, _, t, h, w = x.shape
        ind = torch.zeros(1, 1, t, 1, 1, device=x.device)
        ind[:, :, 0] = 1.0
        mask = ind.expand(b, 1, t, h, w)
        lat = mask * cond.float() + (1 - mask) * x.float()
        if self.cfg.round_timesteps:
            sigma = sigma.to(self.compute_dtype).float()
        tau = ind * self.cfg.conditional_frame_timestep + (1 - ind) * sigma.float().view(b, 1, 1, 1, 1)
        dtype = self.dtype
        if not torch.is_autocast_enabled(dev.device_type()):
            # without autocast the weights' dtype rules; under it, leave the prompt embeddings as
            # cached (bf16 for the real model: ~100 MB per sample, not worth an fp32 copy)
            prompt_embeds = prompt_embeds.to(dtype)
        return dict(
            hidden_states=lat.to(dtype),
            timestep=tau,  # fp32 is fine: the time embedding casts it
            encoder_hidden_states=prompt_embeds,
            condition_mask=mask.to(dtype),
            padding_mask=x.new_zeros(1, 1, h, w, dtype=dtype),  # batch must be 1 (diffusers repeats it)
        )

    @property
    def compute_dtype(self) -> torch.dtype:
        """What the transformer computes in: the autocast dtype under autocast, else its weights'."""
        kind = dev.device_type()
        return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else self.dtype

    def feature_noise(self, cond: torch.Tensor, num_latent_frames: int, seed: int | None) -> torch.Tensor:
        """Future-frame noise of the feature pass. Seeded: one CPU generator draw of (1, ...) shared
        by the batch, so a sample's features depend on its observation only (not on the batch or
        the device) and training sees the same noise as inference. Unseeded (None): independent
        global-RNG noise per sample, like the original (not repeatable)."""
        b, c, _, h, w = cond.shape
        if seed is None:
            return torch.randn(b, c, num_latent_frames, h, w, device=cond.device)
        g = torch.Generator().manual_seed(seed)
        noise = torch.randn(1, c, num_latent_frames, h, w, generator=g)
        return noise.to(cond.device).expand(b, -1, -1, -1, -1)

    def feature_seed(self, call_seed: int | None = None) -> int | None:
        """The configured seed wins (it is what training saw); a call's seed only fills in for None."""
        s = self.cfg.feature_noise_seed
        return s if s is not None else call_seed

    def feature_inputs(
        self,
        cond: torch.Tensor,
        prompt_embeds: torch.Tensor,
        num_latent_frames: int,
        call_seed: int | None = None,
        noise: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Transformer inputs of the feature pass: the first denoising step, future latents = noise
        at ``feature_sigma`` (``noise``: explicit latents (B, 16, T_lat, h, w), see noise.py)."""
        b, c, _, h, w = cond.shape
        noise = checked(noise, "feature", (b, c, num_latent_frames, h, w), cond.device)
        if noise is None:
            noise = self.feature_noise(cond, num_latent_frames, self.feature_seed(call_seed))
        sigma = torch.full((cond.shape[0],), self.feature_sigma, device=cond.device)
        return self.transformer_inputs(cond, noise, sigma, prompt_embeds)

    # ------------------------------------------------------------------ feature pass

    def features(
        self,
        cond: torch.Tensor,
        prompt_embeds: torch.Tensor,
        num_latent_frames: int,
        call_seed: int | None = None,
        grad: bool = False,
        noise: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, 16, 1, h, w) conditioning latent -> block ``extract_layer`` output (B, S, hidden),
        S = num_latent_frames * h/2 * w/2. No autograd graph unless ``grad``
        (backprop_action_to_backbone)."""
        with torch.set_grad_enabled(grad), dev.attention_context(self.cfg.attention_backend):
            inputs = self.feature_inputs(cond, prompt_embeds, num_latent_frames, call_seed, noise)
            return run_blocks(self.transformer, **inputs, last_block=self.cfg.extract_layer)

    # ------------------------------------------------------------------ video flow matching

    def video_flow_matching_loss(
        self,
        latents: torch.Tensor,
        prompt_embeds: torch.Tensor,
        cond: torch.Tensor | None = None,
        t: torch.Tensor | None = None,
        z: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Flow-matching MSE on the future latent frames (the original's objective): x_t = (1-t) x0 + t z,
        target z - x0, one t per sample, frame 0 clean at conditional_frame_timestep. With one
        latent frame there is nothing to predict: returns 0 without running the transformer.
        ``t`` (B,) and ``z`` (B, 16, T_lat - 1, h, w): explicit noise (noise.py). With
        ``video_loss_batch_fraction`` < 1 only the batch's first ceil(fraction * B) samples (and
        draws) enter: the rest never reach the transformer."""
        if latents.shape[2] < 2:
            return latents.new_zeros(())
        cond = latents[:, :, :1] if cond is None else cond
        b, c, n, h, w = latents.shape
        t = checked(t, "video_time", (b,), latents.device)
        z = checked(z, "video", (b, c, n - 1, h, w), latents.device)
        # video_loss_batch_fraction < 1: the first k samples only (explicit draws: their first k)
        k = min(b, math.ceil(self.cfg.video_loss_batch_fraction * b))
        if k < b:
            latents, prompt_embeds, cond = latents[:k], prompt_embeds[:k], cond[:k]
            t, z, b = (None if t is None else t[:k]), (None if z is None else z[:k]), k
        x0 = latents.float()
        t = sample_video_time(self.cfg.flow_matching, b, x0.device) if t is None else t
        # frame 0 of z only reaches x_t's frame 0, which the conditioning latent replaces
        z = torch.randn_like(x0) if z is None else torch.cat([torch.zeros_like(x0[:, :, :1]), z], dim=2)
        tv = t.view(-1, 1, 1, 1, 1)
        x_t = (1 - tv) * x0 + tv * z
        with dev.attention_context(self.cfg.attention_backend):
            v = self.transformer(**self.transformer_inputs(cond, x_t, t, prompt_embeds), return_dict=False)[0]
        return torch.mean((v[:, :, 1:].float() - (z - x0)[:, :, 1:]) ** 2)


    def video_loss_and_features(
        self,
        latents: torch.Tensor,
        prompt_embeds: torch.Tensor,
        cond: torch.Tensor,
        at_inference_noise: torch.Tensor,
        t: torch.Tensor | None = None,
        z: torch.Tensor | None = None,
        feature_noise: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The one-pass joint step: one transformer pass gives the video flow-matching loss and
        block ``extract_layer``'s output for the action head -> (loss, features (B, S, hidden),
        the noise level sigma (B,) each sample's features were computed at).

        Samples where ``at_inference_noise`` (B,) bool holds run at the feature pass's convention,
        what ``predict_action`` computes: future latents = the feature-pass noise itself (seeded as
        ``features`` seeds it; ``feature_noise`` (B, 16, T_lat, h, w) given explicitly) at
        ``feature_sigma``; their video target is that noise minus the clean latents, the pipeline's
        first denoising step (it too starts from pure noise at sigma ~0.995, not from a 0.5%
        mixture). The other samples are ordinary flow-matching samples at the video loss's own t.
        The graph reaches the features: the caller detaches them unless the action loss is to
        train the backbone."""
        b, c, n, h, w = latents.shape
        t = checked(t, "video_time", (b,), latents.device)
        z = checked(z, "video", (b, c, n - 1, h, w), latents.device)
        f = checked(feature_noise, "feature", (b, c, n, h, w), latents.device)
        x0 = latents.float()
        t = sample_video_time(self.cfg.flow_matching, b, x0.device) if t is None else t
        z = torch.randn_like(x0) if z is None else torch.cat([torch.zeros_like(x0[:, :, :1]), z], dim=2)
        f = self.feature_noise(cond, n, self.feature_seed()) if f is None else f
        m = at_inference_noise.view(b, 1, 1, 1, 1)
        z = torch.where(m, f.float(), z)
        tv = t.view(-1, 1, 1, 1, 1)
        x_t = torch.where(m, z, (1 - tv) * x0 + tv * z)
        sigma = torch.where(at_inference_noise, torch.full_like(t, self.feature_sigma), t)
        with dev.attention_context(self.cfg.attention_backend):
            inputs = self.transformer_inputs(cond, x_t, sigma, prompt_embeds)
            feats, v = run_split(self.transformer, **inputs, split_block=self.cfg.extract_layer)
        return torch.mean((v[:, :, 1:].float() - (z - x0)[:, :, 1:]) ** 2), feats, sigma


def sample_video_time(cfg: VideoTimeConfig, n: int, device: torch.device) -> torch.Tensor:
    """n flow-matching times in [0, 1) from ``cfg.time_distribution``."""
    if cfg.time_distribution == "uniform":
        return torch.rand(n, device=device)
    t = torch.sigmoid(torch.randn(n, device=device))
    if cfg.high_sigma_ratio:
        lo = 0.98 if cfg.high_sigma_min is None else cfg.high_sigma_min
        high = lo + (1 - lo) * torch.rand(n, device=device)
        t = torch.where(torch.rand(n, device=device) < cfg.high_sigma_ratio, high, t)
    return t
