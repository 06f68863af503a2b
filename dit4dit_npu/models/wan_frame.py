"""The Wan VAE's encode of one frame, as the 2-D network it is.

Inference encodes only frame 0 (the conditioning latent; the causal VAE gives latent 0 the same
value whatever follows it). For that first frame every causal 3-D convolution sees its frame
behind kt - 1 zero frames of causal padding, so only the kernel's last temporal tap touches data:
the convolution is a 2-D one with that tap (a third of the multiply-adds of the 3x3x3 kernels, and
on CPU a 2-D convolution takes oneDNN's fast path where a batch-1 3-D one falls back to the slow
reference kernel). ``first_frame_moments`` runs the encoder that way: the same weights, and the
VAE's own modules for everything else (RMS norms, SiLU, spatial down-sampling, attention),
in ``WanEncoder3d.forward``'s order for its first chunk (diffusers 0.37 to 0.42; the mid block's
attention works frame by frame; the temporal
down-sampling convolutions are skipped there, as on the first chunk). Tests compare it with
``vae.encode`` of the frame, which guards it against drift in diffusers.

A VAE of another layout (Wan 2.2's residual down blocks or patchified input, tiled encoding) is
not mirrored: ``first_frame_moments`` returns None and the caller uses ``vae.encode``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _causal_conv(conv: nn.Conv3d, x: torch.Tensor) -> torch.Tensor:
    """A ``WanCausalConv3d`` on (B, C, 1, H, W) with no cache (zero causal padding): its last temporal tap."""
    kt = conv.kernel_size[0]
    pad_w, _, pad_h, _, pad_t, _ = conv._padding
    if pad_t != kt - 1 or conv.stride[0] != 1:
        raise ValueError(f"not a full causal convolution: kernel {conv.kernel_size}, padding {conv._padding}")
    out = F.conv2d(
        x[:, :, 0], conv.weight[:, :, -1], conv.bias, stride=conv.stride[1:], padding=(pad_h, pad_w),
        dilation=conv.dilation[1:], groups=conv.groups,
    )
    return out[:, :, None]


def _residual(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``WanResidualBlock.forward`` without a cache."""
    shortcut = block.conv_shortcut
    h = x if isinstance(shortcut, nn.Identity) else _causal_conv(shortcut, x)
    x = _causal_conv(block.conv1, block.nonlinearity(block.norm1(x)))
    x = block.dropout(block.nonlinearity(block.norm2(x)))
    return _causal_conv(block.conv2, x) + h


def supported(vae: nn.Module, height: int, width: int) -> bool:
    """Whether ``first_frame_moments`` mirrors this VAE's encode for frames of this size."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanResample, WanResidualBlock

    if getattr(vae.config, "patch_size", None) is not None:
        return False
    if vae.use_tiling and (width > vae.tile_sample_min_width or height > vae.tile_sample_min_height):
        return False
    layers = list(vae.encoder.down_blocks)
    # (attention in the down blocks, attn_scales, does not encode in diffusers itself: not mirrored)
    return all(isinstance(m, WanResidualBlock | WanResample) for m in layers)


def first_frame_moments(vae: nn.Module, frame: torch.Tensor) -> torch.Tensor | None:
    """(B, 3, 1, H, W) in the VAE's dtype -> the posterior's moments (B, 2 z, 1, H/8, W/8), what
    ``vae.encode(frame).latent_dist.parameters`` holds; None for a VAE this does not mirror."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanResidualBlock

    if frame.shape[2] != 1 or not supported(vae, frame.shape[-2], frame.shape[-1]):
        return None
    enc = vae.encoder
    x = _causal_conv(enc.conv_in, frame)
    for layer in enc.down_blocks:
        if isinstance(layer, WanResidualBlock):
            x = _residual(layer, x)
        else:  # WanResample without a cache: the spatial down-sampling only, as on the first chunk
            x = layer(x)
    mid = enc.mid_block
    x = _residual(mid.resnets[0], x)
    for attn, resnet in zip(mid.attentions, mid.resnets[1:]):
        if attn is not None:
            x = attn(x)
        x = _residual(resnet, x)
    x = _causal_conv(enc.conv_out, enc.nonlinearity(enc.norm_out(x)))
    return _causal_conv(vae.quant_conv, x)
