"""Camera-view tiling and pixel-range conversion."""

import pytest
import torch

from dit4dit_npu.models.views import FrameInputError, grid_shape, tile_views, to_uint8, to_vae_range


def _views(v: int, h: int = 2, w: int = 3) -> torch.Tensor:
    # view i is filled with the value i + 1, so its position in the tiled frame is readable
    x = torch.arange(1, v + 1, dtype=torch.uint8).view(1, 1, v, 1, 1, 1)
    return x.expand(2, 4, v, 3, h, w).clone()


def test_width_layout_places_views_side_by_side():
    out = tile_views(_views(3), "width")
    assert out.shape == (2, 4, 3, 2, 9)
    for i in range(3):
        assert (out[..., :, 3 * i : 3 * (i + 1)] == i + 1).all()


def test_height_layout_stacks_views():
    out = tile_views(_views(3), "height")
    assert out.shape == (2, 4, 3, 6, 3)
    for i in range(3):
        assert (out[..., 2 * i : 2 * (i + 1), :] == i + 1).all()


def test_grid_layout_is_near_square_and_blank_fills():
    assert grid_shape(3, "grid") == (2, 2)
    assert grid_shape(4, "grid") == (2, 2)
    assert grid_shape(5, "grid") == (2, 3)
    out = tile_views(_views(3), "grid")
    assert out.shape == (2, 4, 3, 4, 6)
    assert (out[..., :2, :3] == 1).all() and (out[..., :2, 3:] == 2).all()
    assert (out[..., 2:, :3] == 3).all() and (out[..., 2:, 3:] == 0).all()


def test_single_view_is_identity():
    x = torch.randint(0, 255, (1, 2, 1, 3, 4, 5), dtype=torch.uint8)
    assert torch.equal(tile_views(x, "grid"), x[:, :, 0])


def test_tiling_keeps_channels_separate():
    x = torch.rand(1, 1, 2, 3, 4, 4)
    out = tile_views(x, "width")
    assert torch.equal(out[0, 0, :, :, :4], x[0, 0, 0]) and torch.equal(out[0, 0, :, :, 4:], x[0, 0, 1])


def test_pixel_ranges():
    u8 = torch.tensor([0, 255, 128], dtype=torch.uint8)
    assert torch.allclose(to_vae_range(u8), torch.tensor([-1.0, 1.0, 128 / 255 * 2 - 1]), atol=1e-6)
    assert torch.allclose(to_vae_range(torch.tensor([0.0, 1.0])), torch.tensor([-1.0, 1.0]))
    assert torch.equal(
        to_uint8(torch.tensor([-1.0, 1.0, 0.0, 3.0])), torch.tensor([0, 255, 128, 255], dtype=torch.uint8)
    )


def test_bad_frames_are_clear_errors():
    with pytest.raises(FrameInputError, match="view axis"):
        tile_views(torch.zeros(1, 2, 3, 4, 4), "width")
    with pytest.raises(FrameInputError, match="int64"):
        to_vae_range(torch.zeros(2, dtype=torch.long))
