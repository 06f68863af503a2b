"""Cross-attention DiT body of the action head (GR00T-N1 style "DiT-B", as in the original).

Blocks alternate cross-attention to the video features (even i) and self-attention (odd i);
AdaLayerNorm on the timestep embedding modulates the attention branch only (no gate); the FF
branch is not modulated. No attention masks, no positional encoding inside the blocks.

Repeated diffusion samples (R noisy copies per backbone feature) share their features:
the cross-attention K/V are computed once per unique feature tensor (``context_kv``) and the R
samples' queries are laid side by side on the sequence axis against them. Attention without a
mask is per-query, so this equals attending R materialised copies (the original built a
(R*B, S, 2048) copy and projected it R times, B5 in bench/reference.py). Batch order is sample-major: row
b * R + r is repeat r of sample b.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.attention import FeedForward
from diffusers.models.embeddings import TimestepEmbedding, Timesteps
from einops import rearrange
from torch import nn

KV = tuple[torch.Tensor, torch.Tensor]


class AdaLayerNorm(nn.Module):
    """LN without affine, then x * (1 + scale) + shift from Linear(SiLU(temb))."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim)
        self.norm = nn.LayerNorm(dim, eps=eps, elementwise_affine=False)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        scale, shift = self.linear(F.silu(temb)).chunk(2, dim=-1)
        return self.norm(x) * (1 + scale[:, None]) + shift[:, None]


class Attention(nn.Module):
    """Multi-head attention with biased q/k/v/out projections and dropout after the output."""

    def __init__(
        self, dim: int, heads: int, head_dim: int, dropout: float, kv_dim: int | None = None
    ) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(kv_dim or dim, inner)
        self.to_v = nn.Linear(kv_dim or dim, inner)
        self.to_out = nn.Sequential(nn.Linear(inner, dim), nn.Dropout(dropout))

    def context_kv(self, context: torch.Tensor) -> KV:
        k, v = self.to_k(context), self.to_v(context)
        return tuple(rearrange(x, "b s (h d) -> b h s d", h=self.heads) for x in (k, v))

    def forward(self, x: torch.Tensor, kv: KV | None = None, repeats: int = 1) -> torch.Tensor:
        """x (B*R, N, dim); kv from ``context_kv`` of (B, S, kv_dim) features, or None = self-attn."""
        if kv is None:
            q = rearrange(self.to_q(x), "b n (h d) -> b h n d", h=self.heads)
            k, v = self.context_kv(x)
            out = F.scaled_dot_product_attention(q, k, v)
            return self.to_out(rearrange(out, "b h n d -> b n (h d)"))
        # the R repeats of a sample become R*N queries against that sample's K/V: a view, no copy
        q = rearrange(self.to_q(x), "(b r) n (h d) -> b h (r n) d", r=repeats, h=self.heads)
        out = F.scaled_dot_product_attention(q, *kv)
        return self.to_out(rearrange(out, "b h (r n) d -> (b r) n (h d)", r=repeats))


class DiTBlock(nn.Module):
    def __init__(
        self, dim: int, heads: int, head_dim: int, dropout: float, final_dropout: bool, cross_dim: int | None
    ) -> None:
        super().__init__()
        self.is_cross = cross_dim is not None
        self.norm1 = AdaLayerNorm(dim)
        self.attn1 = Attention(dim, heads, head_dim, dropout, kv_dim=cross_dim)
        self.final_dropout = nn.Dropout(dropout) if final_dropout else nn.Identity()
        self.norm3 = nn.LayerNorm(dim, eps=1e-5, elementwise_affine=False)
        self.ff = FeedForward(
            dim, dropout=dropout, activation_fn="gelu-approximate", final_dropout=final_dropout, bias=True
        )

    def forward(self, x: torch.Tensor, temb: torch.Tensor, kv: KV | None, repeats: int) -> torch.Tensor:
        h = self.attn1(self.norm1(x, temb), kv if self.is_cross else None, repeats)
        x = x + self.final_dropout(h)
        return x + self.ff(self.norm3(x))


class CrossAttentionDiT(nn.Module):
    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        num_layers: int,
        cross_attention_dim: int,
        output_dim: int,
        dropout: float = 0.2,
        final_dropout: bool = True,
        interleave_self_attention: bool = True,
    ) -> None:
        super().__init__()
        self.timestep_proj = Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=1)
        self.timestep_embedder = TimestepEmbedding(256, dim)
        self.blocks = nn.ModuleList(
            DiTBlock(
                dim,
                heads,
                head_dim,
                dropout,
                final_dropout,
                cross_dim=None if (interleave_self_attention and i % 2 == 1) else cross_attention_dim,
            )
            for i in range(num_layers)
        )
        self.norm_out = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.proj_out_1 = nn.Linear(dim, 2 * dim)
        self.proj_out_2 = nn.Linear(dim, output_dim)

    def context_kv(self, features: torch.Tensor) -> list[KV]:
        """K/V of every cross-attention block for (B, S, cross_dim) features: computed once per
        call (training) or once per ``predict_action`` for all Euler steps (inference)."""
        return [blk.attn1.context_kv(features) for blk in self.blocks if blk.is_cross]

    def forward(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor,
        kv: list[KV],
        repeats: int = 1,
        extra_temb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (B*R, N, dim), integer timestep (B*R,), kv from ``context_kv`` -> (B*R, N, output_dim).
        ``extra_temb`` (B*R, dim): another condition's embedding, added to the timestep's (it then
        modulates every block as the timestep does)."""
        temb = self.timestep_embedder(self.timestep_proj(timestep).to(x.dtype))
        if extra_temb is not None:
            temb = temb + extra_temb
        cross = iter(kv)
        for blk in self.blocks:
            x = blk(x, temb, next(cross) if blk.is_cross else None, repeats)
        shift, scale = self.proj_out_1(F.silu(temb)).chunk(2, dim=-1)
        x = self.norm_out(x) * (1 + scale[:, None]) + shift[:, None]
        return self.proj_out_2(x)
