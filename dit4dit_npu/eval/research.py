"""What the model sees and imagines, for inspection and analysis: functions of a loaded policy.

- ``predict_video``: the backbone's imagined future from the current frames;
- ``reconstruct_video``: the VAE's round trip (encode -> decode) of a clip, next to it;
- ``observation_features``: what the action head reads (the conditioning latent and the features).

Not the policy's own methods: a robot or a server never needs them, and the policy's interface
stays its two predictions (``predict_action``, ``predict_batch``). Each runs the model through
``DiT4DiTPolicy.held_model``, so it shares the policy's lock and prompt cache with its other calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dit4dit_npu.policy import DiT4DiTPolicy, PolicyInputError
from dit4dit_npu.transforms.observation import Observation, parse_seed


@torch.inference_mode()
def predict_video(
    policy: DiT4DiTPolicy, obs: dict[str, Any] | Observation, steps: int = 2, seed: int | None = None
) -> np.ndarray:
    """The backbone's imagined future from the current frames: uint8 (T, H, W_tiled, 3), or
    (B, T, H, W_tiled, 3) for batched input; views tiled as the model sees them, frame 0 is
    the reconstruction of the observation. ``obs``: a robot observation, or one already parsed."""
    if steps < 1:
        raise PolicyInputError(f"steps: expected >= 1, got {steps}")
    seed = parse_seed(seed)
    parsed = obs if isinstance(obs, Observation) else policy.io.parse_observation(obs)
    batch = policy.io.encode_parsed(parsed)
    with policy.held_model(batch.instruction) as model:
        video = model.imagine_video(batch, num_steps=steps, seed=seed)
    out = video.permute(0, 1, 3, 4, 2).cpu().numpy()  # (B, T, H, W, 3)
    return out if parsed.batched else out[0]


@torch.inference_mode()
def reconstruct_video(policy: DiT4DiTPolicy, views: np.ndarray) -> np.ndarray:
    """The VAE's round trip (encode -> decode) of a clip, for inspection next to
    ``predict_video``: views uint8 (T, V, H, W, 3) at ``io.image_size``, cameras in model order
    (``io.view`` of each camera image), or (B, T, V, H, W, 3) -> uint8 (T, H, W_tiled, 3) (or
    batched), tiled as the model sees them: what the video loss's targets look like decoded."""
    views = np.asarray(views)
    batched = views.ndim == 6
    if views.ndim not in (5, 6) or views.dtype != np.uint8:
        raise PolicyInputError(f"views: expected uint8 (T, V, H, W, 3) or (B, T, V, H, W, 3), got {views.dtype} {views.shape}")
    try:
        frames = policy.io.frames(views if batched else views[None])
    except ValueError as e:
        raise PolicyInputError(str(e)) from None
    with policy.held_model() as model:
        video = model.reconstruct_video(frames)
    out = video.permute(0, 1, 3, 4, 2).cpu().numpy()  # (B, T, H, W, 3)
    return out if batched else out[0]


@torch.inference_mode()
def observation_features(
    policy: DiT4DiTPolicy, obs: dict[str, Any] | Observation, seed: int | None = None
) -> dict[str, np.ndarray]:
    """What the action head reads for a robot observation, for analysis (``feature_probe``):
    {"latent": the conditioning VAE latent (B, 16, 1, h, w), normalised; "features": block
    ``extract_layer``'s output (B, tokens, hidden)}, float32, as ``predict_action`` computes them
    under the same seed."""
    seed = parse_seed(seed)
    parsed = obs if isinstance(obs, Observation) else policy.io.parse_observation(obs)
    batch = policy.io.encode_parsed(parsed)
    with policy.held_model(batch.instruction) as model:
        latent, feats = model.observation_features(batch, seed=seed)
    return {"latent": latent.float().cpu().numpy(), "features": feats.float().cpu().numpy()}
