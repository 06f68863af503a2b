"""Flow-matching action head on video features ("DiT-B", GR00T-N1 style, as in the original).

Tokens: [state token] + H_a action tokens (action MLP with the sinusoidal integer timestep, plus a
learned position embedding on action tokens only) -> cross-attention DiT -> decoder MLP on the last
H_a tokens. Training: t = Beta(1.5, 1) / 0.999, x_t = (1 - t) a + t eps, target eps - a,
t_int = floor(1000 t), MSE over real action dims; R repeated noise draws per feature share one K/V
(``dit.py``). Inference: Euler from t = 1 in ``num_inference_timesteps`` steps.

Config: ``HeadConfig`` (``configs.py``; derived from ``framework.action_model`` with the DiT sizes
resolved from its ``action_model_type`` preset, and the training-only ``trainer.state_noise_std``). Widths are the batch's (``state_width``/``action_width``
from the BatchSpec, constructor arguments): the head never pads or trims; PolicyIO did, and the
batch is validated at the model boundary.

Precision: the head runs with autocast disabled and its inputs cast explicitly to its parameter
dtype (fp32 unless a wrapper cast the whole model), and targets are built in fp32 — never
``autocast(dtype=float32)``, which is a silent no-op on CPU (the original's idiom for fp32).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from diffusers.models.embeddings import TimestepEmbedding
from torch import nn

from dit4dit_npu import device as dev
from dit4dit_npu.errors import ConfigError
from dit4dit_npu.models.configs import HeadConfig
from dit4dit_npu.models.dit import KV, CrossAttentionDiT
from dit4dit_npu.models.noise import checked
from dit4dit_npu.models.rtc import PrefixGuidance, guided_velocity


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
    def __init__(self, cfg: HeadConfig, cross_attention_dim: int, state_width: int, action_width: int) -> None:
        """``state_width``: encoded, padded state dims (0 = no state token); ``action_width``:
        padded action dims; both the BatchSpec's. The chunk is ``cfg.chunk_length`` steps."""
        super().__init__()
        if action_width < 1:
            raise ConfigError(f"datasets.vla_data.max_action_dim: got {action_width}, expected >= 1")
        self.cfg = cfg
        self.state_width, self.action_width = state_width, action_width
        body = cfg.diffusion_model_cfg
        self.state_encoder = mlp(state_width, cfg.hidden_size, cfg.dim) if state_width else None
        noise = cfg.state_noise_std
        if isinstance(noise, list) and len(noise) != state_width:
            raise ConfigError(
                f"trainer.state_noise_std: {len(noise)} values, but the encoded state has "
                f"{state_width} dims (datasets.vla_data.state_norm / max_state_dim): give one per dim, or one number"
            )
        # Decided once here, not per step (a device tensor's .any() would sync every step); a list
        # is a non-persistent buffer: it follows the model's device and is no weight of the checkpoint.
        self._state_noise_on = any(v > 0 for v in (noise if isinstance(noise, list) else [noise]))
        if isinstance(noise, list):
            self.register_buffer("_state_noise", torch.tensor(noise, dtype=torch.float32), persistent=False)
        else:
            self._state_noise = float(noise)
        self.action_encoder = ActionEncoder(action_width, cfg.dim)
        self.position_embedding = None
        if cfg.add_pos_embed:
            self.position_embedding = nn.Embedding(cfg.max_seq_len, cfg.dim)
            nn.init.normal_(self.position_embedding.weight, mean=0.0, std=0.02)
        self.model = CrossAttentionDiT(
            cfg.dim,
            cfg.num_heads,
            cfg.head_dim,
            body.num_layers,
            cross_attention_dim,
            body.output_dim,
            dropout=body.dropout,
            final_dropout=body.final_dropout,
            interleave_self_attention=body.interleave_self_attention,
        )
        self.action_decoder = mlp(body.output_dim, cfg.hidden_size, action_width)
        # Built last, so every other weight draws the same init as in a head without it; zero output
        # at initialization (as adaLN-zero), so the conditioned head starts as the plain one.
        self.noise_level_embedder = None
        if cfg.condition_on_noise_level:
            self.noise_level_embedder = TimestepEmbedding(256, cfg.dim)
            nn.init.zeros_(self.noise_level_embedder.linear_2.weight)
            nn.init.zeros_(self.noise_level_embedder.linear_2.bias)

    @property
    def chunk_length(self) -> int:
        return self.cfg.chunk_length

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def repeats(self) -> int:
        return self.cfg.repeated_diffusion_steps

    # ---------------------------------------------------------------- pieces

    def _state_token(self, state: torch.Tensor | None) -> torch.Tensor | None:
        if self.state_encoder is None:
            return None
        return self.state_encoder(state.to(self.dtype))[:, None]

    def _training_state_token(self, state: torch.Tensor | None, r: int) -> torch.Tensor | None:
        """The state token of each of the R noisy samples (row b * R + r), in training with
        ``state_noise_std`` noise on the state: each repeat sees its own draw."""
        if state is None or self.state_encoder is None or not (self.training and self._state_noise_on):
            tok = self._state_token(state)
            return None if tok is None else tok.repeat_interleave(r, dim=0)
        noisy = state.float().repeat_interleave(r, dim=0)
        return self._state_token(noisy + self._state_noise * torch.randn_like(noisy))

    def _velocity(
        self,
        x_t: torch.Tensor,
        t_int: torch.Tensor,
        state_tok: torch.Tensor | None,
        kv: list[KV],
        repeats: int,
        level: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``level``: the noise-level embedding of each row (``noise_level_embedding``), or None."""
        tokens = self.action_encoder(x_t.to(self.dtype), t_int)
        if self.position_embedding is not None:
            # called as a module (not .weight[:n]) so ZeRO-3 gathers the partitioned table
            tokens = tokens + self.position_embedding(torch.arange(tokens.shape[1], device=tokens.device))
        if state_tok is not None:
            tokens = torch.cat([state_tok, tokens], dim=1)
        out = self.model(tokens, t_int, kv, repeats, level)
        return self.action_decoder(out[:, -x_t.shape[1] :]).float()

    def sample_time(self, n: int, device: torch.device) -> torch.Tensor:
        a, b = self.cfg.noise_beta_alpha, self.cfg.noise_beta_beta
        if b == 1.0:  # Beta(a, 1) by inverse CDF: u = U^(1/a); runs on any device
            u = torch.rand(n, device=device) ** (1.0 / a)
        else:
            u = torch.distributions.Beta(a, b).sample((n,)).to(device)
        return u / self.cfg.noise_s

    def noise_level_embedding(self, sigma: torch.Tensor | None, rows_per_sample: int) -> torch.Tensor | None:
        """The embedding of each sample's feature noise level sigma (B,) in [0, 1], on the same
        sinusoid scale as the action time (sigma * num_timestep_buckets), one row per noisy sample;
        None for a head not conditioned on it."""
        if self.noise_level_embedder is None:
            return None
        if sigma is None:
            raise ValueError("this action head is conditioned on its features' noise level: pass feature_sigma")
        proj = self.model.timestep_proj(sigma.float() * self.cfg.num_timestep_buckets)
        return self.noise_level_embedder(proj.to(self.dtype)).repeat_interleave(rows_per_sample, dim=0)

    def context_kv(self, features: torch.Tensor) -> list[KV]:
        """Cross-attention K/V of (B, S, cross_dim) features, in the head's dtype."""
        with torch.autocast(dev.device_type(), enabled=False):
            return self.model.context_kv(features.to(self.dtype))

    # ---------------------------------------------------------------- training

    def loss(
        self,
        features: torch.Tensor,
        state: torch.Tensor | None,
        actions: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        noise: torch.Tensor | None = None,
        t: torch.Tensor | None = None,
        feature_sigma: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Masked flow-matching MSE averaged over R noise draws per sample (float32 scalar).

        features (B, S, cross_dim); state (B, state_width) or None; actions and the bool mask
        (B, chunk_length, action_width), as the batch brings them (PolicyIO padded them).
        Explicit draws (noise.py): ``noise`` (B, R, chunk_length, action_width), ``t`` (B, R).
        ``feature_sigma`` (B,): the noise level the features were computed at (read only by a
        head conditioned on it)."""
        kv = self.context_kv(features)
        return self.loss_with_context(kv, self.repeats, state, actions, action_mask, noise, t, feature_sigma)

    def loss_with_context(
        self,
        kv: list[KV],
        kv_repeats: int,
        state: torch.Tensor | None,
        actions: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        noise: torch.Tensor | None = None,
        t: torch.Tensor | None = None,
        feature_sigma: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``loss`` from precomputed K/V: ``kv`` rows serve ``kv_repeats`` consecutive noisy
        samples each (R for per-sample K/V; 1 for K/V of R materialised feature copies, what the
        original computed, B5 in bench/reference.py)."""
        r = self.repeats
        b, n, c = actions.shape
        noise = checked(noise, "action", (b, r, n, c), actions.device)
        t = checked(t, "action_time", (b, r), actions.device)
        with torch.autocast(dev.device_type(), enabled=False):
            state_tok = self._training_state_token(state, r)
            a = actions.float().repeat_interleave(r, dim=0)  # row b * R + r: repeat r of sample b
            noise = torch.randn_like(a) if noise is None else noise.reshape(b * r, n, c)
            t = self.sample_time(a.shape[0], a.device) if t is None else t.reshape(b * r)
            tv = t.view(-1, 1, 1)
            x_t = (1 - tv) * a + tv * noise
            t_int = (t * self.cfg.num_timestep_buckets).floor().long()
            level = self.noise_level_embedding(feature_sigma, r)
            err = (self._velocity(x_t, t_int, state_tok, kv, kv_repeats, level) - (noise - a)) ** 2
            if action_mask is None:
                return err.mean()
            m = action_mask.float().repeat_interleave(r, dim=0)
            return (err * m).sum() / m.sum().clamp_min(1.0)

    # ---------------------------------------------------------------- inference

    @torch.no_grad()
    def sample(
        self,
        features: torch.Tensor,
        state: torch.Tensor | None,
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
        guidance: PrefixGuidance | None = None,
        feature_sigma: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Euler from t = 1 to 0 -> normalised chunk (B, chunk_length, action_width), float32.

        With a generator (a seeded call): one (CPU) draw of (1, H_a, A) shared by every row, so a
        row's chunk depends on its own observation and the seed only — not on the device, nor on
        the batch it came in (row i of a batch == the same observation alone). Without one:
        independent global-RNG noise per row. ``noise`` (B, H_a, A): the start x_1, given.
        ``guidance``: real-time chunking (``rtc.py``): each step's velocity is steered toward the
        previous chunk's prefix; without it (or with all-zero weights) the steps are exactly the
        plain ones. ``feature_sigma`` (B,): as in ``loss``."""
        b, n, chunk = features.shape[0], self.cfg.num_inference_timesteps, (self.chunk_length, self.action_width)
        x = checked(noise, "action", (b, *chunk), features.device)
        if guidance is not None:
            guidance = guidance.checked((b, *chunk), features.device)
        kv = self.context_kv(features)  # once for all Euler steps
        with torch.autocast(dev.device_type(), enabled=False):
            state_tok = self._state_token(state)
            level = self.noise_level_embedding(feature_sigma, 1)
            if x is None and generator is not None:
                x = torch.randn(1, *chunk, generator=generator)
                x = x.to(features.device).expand(b, -1, -1)
            elif x is None:
                x = torch.randn(b, *chunk, device=features.device)
            for i in range(n):
                t_int = torch.full(
                    (b,), int(self.cfg.num_timestep_buckets * (1.0 - i / n)), device=x.device, dtype=torch.long
                )
                if guidance is None:
                    v = self._velocity(x, t_int, state_tok, kv, 1, level)
                else:  # autograd through the head alone, for the guidance's vector-Jacobian product
                    step = functools.partial(
                        self._velocity, t_int=t_int, state_tok=state_tok, kv=kv, repeats=1, level=level
                    )
                    v = guided_velocity(step, x, 1.0 - i / n, guidance)
                x = x - v / n
        return x
