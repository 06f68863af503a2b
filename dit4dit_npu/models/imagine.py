"""The backbone's imagined future: a short UniPC sampling loop from the conditioning latent plus a
VAE decode, as the Cosmos-Predict2.5 pipeline's image2world path does (batched, no CFG, no
safety checker). Only for inspection (``predict_video`` of the policy API), never in training."""

from __future__ import annotations

import torch
from einops import rearrange

from dit4dit_npu import device as dev
from dit4dit_npu.models.cosmos import CosmosBackbone, fresh_schedule
from dit4dit_npu.models.pixels import to_uint8


@torch.no_grad()
def imagine(
    backbone: CosmosBackbone,
    cond: torch.Tensor,
    prompt_embeds: torch.Tensor,
    num_latent_frames: int,
    num_steps: int = 2,
    seed: int | None = None,
) -> torch.Tensor:
    """(B, 16, 1, h, w) normalised conditioning latent -> uint8 video (B, 1 + 4 (T_lat - 1), 3, H, W).

    Same step as the pipeline's loop: frame 0 replaced by the condition, its velocity overwritten
    by the ground-truth (noise - cond), scheduler step on the rest. Noise from a CPU generator when
    ``seed`` is given (device-independent, shared by the rows), else from the global RNG.
    """
    b, c, _, h, w = cond.shape
    sched = fresh_schedule(backbone.scheduler, num_steps, cond.device)
    if seed is not None:
        # One CPU draw shared by every row (as action sampling does): a row's video depends on its
        # own observation and the seed only, so batched and single calls agree.
        g = torch.Generator().manual_seed(seed)
        noise = torch.randn(1, c, num_latent_frames, h, w, generator=g).to(cond.device).expand(b, -1, -1, -1, -1)
    else:
        noise = torch.randn(b, c, num_latent_frames, h, w, device=cond.device)
    mask = torch.zeros(1, 1, num_latent_frames, 1, 1, device=cond.device)
    mask[:, :, 0] = 1.0
    gt_velocity = (noise - cond.float()) * mask
    latents = noise
    with dev.attention_context(backbone.cfg.attention_backend):
        for i, t in enumerate(sched.timesteps):
            sigma = sched.sigmas[i].expand(b).to(device=cond.device, dtype=torch.float32)
            inputs = backbone.transformer_inputs(cond, latents, sigma, prompt_embeds)
            v = backbone.transformer(**inputs, return_dict=False)[0].float()
            v = gt_velocity + v * (1 - mask)
            latents = sched.step(v, t, latents, return_dict=False)[0]
    video = backbone.vae.decode(backbone.denormalize(latents).to(backbone.vae_dtype), return_dict=False)[0]
    return rearrange(to_uint8(video), "b c t h w -> b t c h w").contiguous()
