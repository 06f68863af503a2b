"""Pixel-range conversion (the model's only frame transform: views arrive tiled)."""

import pytest
import torch

from dit4dit_npu.models.pixels import FrameInputError, to_uint8, to_vae_range


def test_pixel_ranges():
    u8 = torch.tensor([0, 255, 128], dtype=torch.uint8)
    assert torch.allclose(to_vae_range(u8), torch.tensor([-1.0, 1.0, 128 / 255 * 2 - 1]), atol=1e-6)
    assert torch.allclose(to_vae_range(torch.tensor([0.0, 1.0])), torch.tensor([-1.0, 1.0]))
    assert torch.equal(
        to_uint8(torch.tensor([-1.0, 1.0, 0.0, 3.0])), torch.tensor([0, 255, 128, 255], dtype=torch.uint8)
    )


def test_uint8_round_trip_is_exact():
    x = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(to_uint8(to_vae_range(x)), x)


def test_bad_dtype_is_a_clear_error():
    with pytest.raises(FrameInputError, match="int64"):
        to_vae_range(torch.zeros(2, dtype=torch.long))
