"""Flow-matching action head on video features (SPEC §2: "DiT-B", GR00T-N1 style).

Tokens: [state token] + H_a action tokens (action MLP with the sinusoidal integer timestep, plus a
learned position embedding on action tokens only) -> cross-attention DiT -> decoder MLP on the last
H_a tokens. Training: t = Beta(1.5, 1) / 0.999, x_t = (1 - t) a + t eps, target eps - a,
t_int = floor(1000 t), MSE over real action dims; R repeated noise draws per feature share one K/V
(``dit.py``). Inference: Euler from t = 1 in ``num_inference_timesteps`` steps.

Precision: the head runs with autocast disabled and its inputs cast explicitly to its parameter
dtype (fp32 unless a wrapper cast the whole model), and targets are built in fp32 — never
``autocast(dtype=float32)``, which is a silent no-op on CPU (SPEC C3, A8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dit4dit_npu import device as dev
from dit4dit_npu.config import ActionModelConfig, ConfigError
from dit4dit_npu.models.dit import KV, CrossAttentionDiT

# input_embedding_dim, num_attention_heads, attention_head_dim
PRESETS: dict[str, tuple[int, int, int]] = {
    "DiT-tiny": (64, 4, 16),
    "DiT-S": (384, 6, 64),
    "DiT-B": (768, 12, 64),
    "DiT-L": (1536, 32, 48),
}


class ActionInputError(ValueError):
    """Action/state tensors the head cannot take."""


@dataclass(frozen=True)
class HeadDims:
    dim: int
    heads: int
    head_dim: int


def resolve_dims(cfg: ActionModelConfig) -> HeadDims:
    """``action_model_type`` preset, then explicit overrides from the config."""
    dim, heads, head_dim = PRESETS[cfg.action_model_type]
    d = cfg.diffusion_model_cfg
    return HeadDims(
        dim=cfg.input_embedding_dim or dim,
        heads=d.num_attention_heads or heads,
        head_dim=d.attention_head_dim or head_dim,
    )


def sinusoidal(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[sin | cos] of t (..., ) at frequencies exp(-i ln(1e4) / (dim/2)) -> (..., dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    ang = t.float().unsqueeze(-1) * freqs
    return torch.cat([torch.sin(ang), torch.cos(ang)], dim=-1)


class ActionEncoder(nn.Module):
    """a -> W3(swish(W2([W1 a, sinusoidal(t_int)])))."""

    def __init__(self, action_dim: int, dim: int) -> None:
        super().__init__()
        self.W1 = nn.Linear(action_dim, dim)
        self.W2 = nn.Linear(2 * dim, dim)
        self.W3 = nn.Linear(dim, dim)

    def forward(self, actions: torch.Tensor, t_int: torch.Tensor) -> torch.Tensor:
        a = self.W1(actions)
        tau = sinusoidal(t_int, a.shape[-1]).to(a.dtype)[:, None].expand(-1, a.shape[1], -1)
        return self.W3(F.silu(self.W2(torch.cat([a, tau], dim=-1))))


def mlp(d_in: int, hidden: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


class FlowMatchingActionHead(nn.Module):
    def __init__(
        self, cfg: ActionModelConfig, cross_attention_dim: int, reference_copied_repeats: bool = False
    ):
        super().__init__()
        dims = resolve_dims(cfg)
        d = cfg.diffusion_model_cfg
        if cfg.chunk_length > cfg.max_seq_len and cfg.add_pos_embed:
            raise ConfigError(
                f"framework.action_model: chunk length {cfg.chunk_length} exceeds max_seq_len {cfg.max_seq_len}"
            )
        self.action_dim, self.state_dim = cfg.action_dim, cfg.state_dim
        self.chunk_length = cfg.chunk_length
        self.repeats = cfg.repeated_diffusion_steps
        self.num_inference_timesteps = cfg.num_inference_timesteps
        self.num_buckets = cfg.num_timestep_buckets
        self.beta = (cfg.noise_beta_alpha, cfg.noise_beta_beta)
        self.noise_s = cfg.noise_s
        # Reproduces the original's materialised (R*B, S, D) feature copy, for bench/ only.
        self.reference_copied_repeats = reference_copied_repeats

        self.state_encoder = mlp(cfg.state_dim, cfg.hidden_size, dims.dim) if cfg.state_dim else None
        self.action_encoder = ActionEncoder(cfg.action_dim, dims.dim)
        self.position_embedding = None
        if cfg.add_pos_embed:
            self.position_embedding = nn.Embedding(cfg.max_seq_len, dims.dim)
            nn.init.normal_(self.position_embedding.weight, mean=0.0, std=0.02)
        self.model = CrossAttentionDiT(
            dims.dim,
            dims.heads,
            dims.head_dim,
            d.num_layers,
            cross_attention_dim,
            d.output_dim,
            dropout=d.dropout,
            final_dropout=d.final_dropout,
            interleave_self_attention=d.interleave_self_attention,
        )
        self.action_decoder = mlp(d.output_dim, cfg.hidden_size, cfg.action_dim)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    # ---------------------------------------------------------------- inputs

    def _fit(self, x: torch.Tensor, dim: int, name: str, key: str) -> torch.Tensor:
        """Zero-pad narrower inputs to the head's width; wider ones are an error, not a truncation."""
        if x.shape[-1] > dim:
            raise ActionInputError(
                f"{name} has {x.shape[-1]} dims but the action head takes {dim} "
                f"(framework.action_model.{key}); set it to the data's padded width"
            )
        return F.pad(x, (0, dim - x.shape[-1])) if x.shape[-1] < dim else x

    def _state_token(self, state: torch.Tensor | None, batch: int) -> torch.Tensor | None:
        if self.state_encoder is None:
            return None
        if state is None:
            raise ActionInputError("batch['state'] is required: framework.action_model.state_dim > 0")
        state = self._fit(state.float().reshape(batch, -1), self.state_dim, "state", "state_dim")
        return self.state_encoder(state.to(self.dtype))[:, None]

    def _velocity(
        self,
        x_t: torch.Tensor,
        t_int: torch.Tensor,
        state_tok: torch.Tensor | None,
        kv: list[KV],
        repeats: int,
    ) -> torch.Tensor:
        tokens = self.action_encoder(x_t.to(self.dtype), t_int)
        if self.position_embedding is not None:
            # called as a module (not .weight[:n]) so ZeRO-3 gathers the partitioned table
            tokens = tokens + self.position_embedding(torch.arange(tokens.shape[1], device=tokens.device))
        if state_tok is not None:
            tokens = torch.cat([state_tok, tokens], dim=1)
        out = self.model(tokens, t_int, kv, repeats)
        return self.action_decoder(out[:, -x_t.shape[1] :]).float()

    def sample_time(self, n: int, device: torch.device) -> torch.Tensor:
        a, b = self.beta
        if b == 1.0:  # Beta(a, 1) by inverse CDF: u = U^(1/a); runs on any device
            u = torch.rand(n, device=device) ** (1.0 / a)
        else:
            u = torch.distributions.Beta(a, b).sample((n,)).to(device)
        return u / self.noise_s

    # ---------------------------------------------------------------- training

    def loss(
        self,
        features: torch.Tensor,
        state: torch.Tensor | None,
        actions: torch.Tensor,
        action_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Masked flow-matching MSE averaged over R noise draws per sample (float32 scalar)."""
        b, r = features.shape[0], self.repeats
        if actions.shape[1] != self.chunk_length:
            raise ActionInputError(
                f"action chunk has {actions.shape[1]} steps, the head predicts {self.chunk_length} "
                "(framework.action_model.future_action_window_size + 1)"
            )
        actions = self._fit(actions.float(), self.action_dim, "action", "action_dim")
        mask = None
        if action_mask is not None:
            mask = self._fit(action_mask.float(), self.action_dim, "action_mask", "action_dim")
        with torch.autocast(dev.device_type(), enabled=False):
            feats = features.to(self.dtype)
            if self.reference_copied_repeats:
                kv, repeats = self.model.context_kv(feats.repeat_interleave(r, dim=0)), 1
            else:
                kv, repeats = self.model.context_kv(feats), r
            state_tok = self._state_token(state, b)
            if state_tok is not None:
                state_tok = state_tok.repeat_interleave(r, dim=0)
            a = actions.repeat_interleave(r, dim=0)
            noise = torch.randn_like(a)
            t = self.sample_time(b * r, a.device)
            tv = t.view(-1, 1, 1)
            x_t = (1 - tv) * a + tv * noise
            t_int = (t * self.num_buckets).floor().long()
            err = (self._velocity(x_t, t_int, state_tok, kv, repeats) - (noise - a)) ** 2
            if mask is None:
                return err.mean()
            m = mask.repeat_interleave(r, dim=0)
            return (err * m).sum() / m.sum().clamp_min(1.0)

    # ---------------------------------------------------------------- inference

    @torch.no_grad()
    def sample(
        self, features: torch.Tensor, state: torch.Tensor | None, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Euler from t = 1 to 0 -> normalised chunk (B, H_a, action_dim), float32.

        With a generator (a seeded call): one (CPU) draw of (1, H_a, A) shared by every row, so a
        row's chunk depends on its own observation and the seed only — not on the device, nor on
        the batch it came in (row i of a batch == the same observation alone). Without one:
        independent global-RNG noise per row."""
        b, n = features.shape[0], self.num_inference_timesteps
        with torch.autocast(dev.device_type(), enabled=False):
            kv = self.model.context_kv(features.to(self.dtype))  # once for all Euler steps
            state_tok = self._state_token(state, b)
            if generator is not None:
                x = torch.randn(1, self.chunk_length, self.action_dim, generator=generator)
                x = x.to(features.device).expand(b, -1, -1)
            else:
                x = torch.randn(b, self.chunk_length, self.action_dim, device=features.device)
            for i in range(n):
                t_int = torch.full(
                    (b,), int(self.num_buckets * (1.0 - i / n)), device=x.device, dtype=torch.long
                )
                x = x - self._velocity(x, t_int, state_tok, kv, 1) / n
        return x
