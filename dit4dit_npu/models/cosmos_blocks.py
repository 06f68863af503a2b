"""``CosmosTransformer3DModel.forward`` (the same in diffusers 0.37 to 0.42) walked in pieces, with
the model's own submodules: the input embedding (its steps 1-5), any range of blocks (step 7) and
the output head (step 8). Two walks are built from them:

- ``run_blocks``: stop after one block (the feature pass: the later blocks and the head never run);
- ``run_split``: the whole forward, also returning one block's output on the way (the one-pass
  joint step: the video loss and the action head's features from the same pass).

Tests compare both with the model's own forward (a forward hook on the block for the features),
which guards this against drift in diffusers. ControlNet residuals and attention masks, which this
project never passes, are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Embedded:
    """The patch tokens (B, T*H/2*W/2, hidden) and what every block and the output head read."""

    tokens: torch.Tensor
    block_args: tuple
    grid: tuple[int, int, int]  # (frames, height, width) after patching
    embedded_timestep: torch.Tensor
    temb: torch.Tensor


def embed(
    transformer: nn.Module,
    hidden_states: torch.Tensor,
    timestep: torch.Tensor,
    encoder_hidden_states: torch.Tensor,
    condition_mask: torch.Tensor,
    padding_mask: torch.Tensor,
) -> Embedded:
    """Steps 1-5 of the forward: mask channels, positional embeddings, patchify, time embedding,
    text context. ``timestep``: (B, 1, T, 1, 1), one value per latent frame."""
    from torchvision import transforms  # what transformer_cosmos uses for the padding mask

    tr, cfg = transformer, transformer.config
    batch_size, _, num_frames, height, width = hidden_states.shape
    hidden_states = torch.cat([hidden_states, condition_mask], dim=1)
    if cfg.concat_padding_mask:
        pm = transforms.functional.resize(
            padding_mask, [height, width], interpolation=transforms.InterpolationMode.NEAREST
        )
        hidden_states = torch.cat(
            [hidden_states, pm.unsqueeze(2).repeat(batch_size, 1, num_frames, 1, 1)], dim=1
        )
    image_rotary_emb = tr.rope(hidden_states, fps=None)
    extra_pos_emb = tr.learnable_pos_embed(hidden_states) if cfg.extra_pos_embed_type else None
    p_t, p_h, p_w = cfg.patch_size
    grid = (num_frames // p_t, height // p_h, width // p_w)
    tokens = tr.patch_embed(hidden_states).flatten(1, 3)
    if timestep.shape != (batch_size, 1, num_frames, 1, 1):
        raise ValueError(f"timestep: expected (B, 1, T, 1, 1), got {tuple(timestep.shape)}")
    temb, embedded_timestep = tr.time_embed(tokens, timestep.flatten())
    temb, embedded_timestep = (
        x.view(batch_size, grid[0], 1, 1, -1).expand(-1, -1, grid[1], grid[2], -1).flatten(1, 3)
        for x in (temb, embedded_timestep)
    )
    text_context = (
        tr.crossattn_proj(encoder_hidden_states) if cfg.use_crossattn_projection else encoder_hidden_states
    )
    args = (text_context, embedded_timestep, temb, image_rotary_emb, extra_pos_emb, None, None)
    return Embedded(tokens, args, grid, embedded_timestep, temb)


def blocks(transformer: nn.Module, tokens: torch.Tensor, e: Embedded, start: int, stop: int) -> torch.Tensor:
    """Blocks ``start`` .. ``stop - 1`` (step 7), gradient checkpointing as the forward does it."""
    tr = transformer
    for block in tr.transformer_blocks[start:stop]:
        if torch.is_grad_enabled() and tr.gradient_checkpointing:
            tokens = tr._gradient_checkpointing_func(block, tokens, *e.block_args)
        else:
            tokens = block(tokens, *e.block_args)
    return tokens


def output(transformer: nn.Module, tokens: torch.Tensor, e: Embedded) -> torch.Tensor:
    """Step 8: output norm, projection and unpatchify -> (B, C_out, T, H, W)."""
    tr = transformer
    p_t, p_h, p_w = tr.config.patch_size
    x = tr.norm_out(tokens, e.embedded_timestep, e.temb)
    x = tr.proj_out(x)
    x = x.unflatten(2, (p_h, p_w, p_t, -1)).unflatten(1, e.grid)
    # diffusers' own permutation (not the inverse of its patching, and correct: see its comment)
    x = x.permute(0, 7, 1, 6, 2, 4, 3, 5)
    return x.flatten(6, 7).flatten(4, 5).flatten(2, 3)


def run_blocks(transformer: nn.Module, last_block: int, **inputs: torch.Tensor) -> torch.Tensor:
    """The forward stopped after block ``last_block``: that block's output (B, T*H/2*W/2, hidden),
    exactly what a forward hook on ``transformer_blocks[last_block]`` sees."""
    e = embed(transformer, **inputs)
    return blocks(transformer, e.tokens, e, 0, last_block + 1)


def run_split(transformer: nn.Module, split_block: int, **inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole forward -> (block ``split_block``'s output (B, S, hidden), the model's output
    (B, C_out, T, H, W)): one pass gives both what ``run_blocks`` and the forward return."""
    e = embed(transformer, **inputs)
    feats = blocks(transformer, e.tokens, e, 0, split_block + 1)
    rest = blocks(transformer, feats, e, split_block + 1, len(transformer.transformer_blocks))
    return feats, output(transformer, rest, e)
