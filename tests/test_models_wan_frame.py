"""The Wan VAE's single-frame encode as a 2-D network (models/wan_frame.py) equals diffusers' own
``vae.encode`` of that frame, for the tiny layout, Wan 2.1's layout (channel changes: shortcut
convolutions) and through ``CosmosBackbone.encode_clip``; layouts it does not mirror fall back to
``vae.encode``."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKLWan

from dit4dit_npu.config import TinyCosmosConfig
from dit4dit_npu.models.tiny import vae_kwargs
from dit4dit_npu.models.wan_frame import first_frame_moments
from dit4dit_npu.weights import build_backbone
from dit4dit_npu.weights.model_config import tiny_sizes
from dit4dit_npu.weights.testing import small_config


def _frames(b: int = 2, h: int = 32, w: int = 48, seed: int = 0) -> torch.Tensor:
    return torch.rand(b, 3, 1, h, w, generator=torch.Generator().manual_seed(seed)) * 2 - 1


@pytest.mark.parametrize(
    "kwargs",
    [
        vae_kwargs(tiny_sizes(TinyCosmosConfig())),
        # Wan 2.1's layout (the class defaults) at a small width
        dict(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
             temperal_downsample=[False, True, True]),
    ],
)
def test_first_frame_moments_equal_the_vaes_encode(kwargs):
    torch.manual_seed(0)
    vae = AutoencoderKLWan(**kwargs).eval()
    x = _frames()
    with torch.no_grad():
        want = vae.encode(x).latent_dist.parameters
        got = first_frame_moments(vae, x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_layouts_it_does_not_mirror_fall_back():
    torch.manual_seed(0)
    wan22 = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                             temperal_downsample=[False, True, True], is_residual=True, patch_size=2).eval()
    assert first_frame_moments(wan22, _frames()) is None
    assert first_frame_moments(AutoencoderKLWan(**vae_kwargs(tiny_sizes(TinyCosmosConfig()))), torch.zeros(1, 3, 5, 32, 48)) is None


def test_the_backbone_encodes_an_observation_through_it():
    bb = build_backbone(small_config())
    x = _frames()
    with torch.no_grad():
        latents, cond = bb.encode_clip(x)
        want = bb.normalize(bb.vae.encode(x).latent_dist.mode())
        whole, whole_cond = bb.encode_clip(torch.cat([x, _frames(seed=1).expand(-1, -1, 4, -1, -1)], dim=2))
    torch.testing.assert_close(cond, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(latents, want, rtol=1e-5, atol=1e-6)
    # the causal VAE's latent 0 of the whole clip is the frame's, whichever path encoded it
    torch.testing.assert_close(whole_cond, cond, rtol=1e-5, atol=1e-5)
