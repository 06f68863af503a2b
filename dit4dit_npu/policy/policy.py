"""Inference API: an exported policy folder -> robot-unit action chunks.

    from dit4dit_npu import DiT4DiTPolicy

    policy = DiT4DiTPolicy.from_pretrained("runs/x/checkpoints/step_005000/policy")
    actions = policy.predict_action({
        "observation.images.cam_high": img_hwc_uint8, ...,   # one per camera key, any size
        "state": q,                                          # (state_dim,) robot units
        "instruction": "lift the pot",
    })                                                       # -> (chunk_length, action_dim)

Batched input (images (B, H, W, 3), state (B, state_dim), instruction list or one str) returns
(B, chunk_length, action_dim). The checkpoint's own PolicyIO turns the observation into the
model's batch and the predicted chunk back into robot units, exactly as the training data was
transformed: ``predict_action`` never returns normalized actions (the original returned normalized
actions and left unnormalization to each client, SPEC 5.1, A19). Only ``predict_normalized``
does, for the server's DiT4DiT protocol, whose clients un-normalize themselves.
``predict_action(obs)`` is ``predict_batch([parse(obs)])`` (``with_rtc`` between them for
real-time chunking): the server calls the parts apart (``contract.py``: its whole interface, with
``describe``), parsing each request once on arrival. Nothing non-finite is ever returned
(``NonFiniteActionError``), and no state or ``prev_chunk`` far outside the training range is acted
on (``StateOutOfRangeError`` / ``PrevChunkOutOfRangeError``) unless the caller allows it
(``allow_out_of_range=True``: then a ``StateRangeWarning`` / ``PrevChunkRangeWarning`` says so).

The folder format is defined by ``folder.py`` (files) and ``manifest.py`` (policy.json).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dit4dit_npu import device as dev
from dit4dit_npu.batch import Batch
from dit4dit_npu.models.rtc import DEFAULT_MAX_GUIDANCE
from dit4dit_npu.policy.contract import (
    RANGE_LIMIT,
    STATE_RANGE_LIMIT,
    OutOfRangeError,
    OutOfRangeWarning,
    ParsedRequest,
    PolicyDescription,
    PrevChunkOutOfRangeError,
    PrevChunkRangeWarning,
    StateOutOfRangeError,
    StateRangeWarning,
    concat_requests,
    out_of_range_dims,
    split_rows,
)
from dit4dit_npu.policy.folder import load_policy_folder
from dit4dit_npu.policy.instructions import RunTimeInstructions
from dit4dit_npu.policy.manifest import FORMAT_VERSION, PolicyManifest
from dit4dit_npu.policy.requests import MAX_GUIDANCE_LIMIT, RequestChecks  # noqa: F401 (imported from here before)
from dit4dit_npu.policy.rtc import ChunkPrefix
from dit4dit_npu.transforms.observation import Observation, PolicyInputError, parse_seed
from dit4dit_npu.transforms.policy_io import NonFiniteActionError, PolicyIO
from dit4dit_npu.weights.compile import check_compile, compile_backbone

__all__ = [
    "STATE_RANGE_LIMIT", "DiT4DiTPolicy", "NonFiniteActionError", "OutOfRangeError", "OutOfRangeWarning",
    "PolicyInputError", "PrevChunkOutOfRangeError", "PrevChunkRangeWarning", "StateOutOfRangeError",
    "StateRangeWarning",
]

def state_out_of_range(stats: Any, state: np.ndarray, limit: float = RANGE_LIMIT) -> list[int]:
    """Dims of ``state`` (..., D) far outside the training range (``contract.out_of_range_dims``)."""
    return out_of_range_dims(stats, state, limit)


class DiT4DiTPolicy(RequestChecks, RunTimeInstructions):
    """A trained DiT4DiT model with its PolicyIO and prompt cache, ready for inference (the cache's
    run-time additions: ``RunTimeInstructions``, ``instructions.py``).

    ``manifest`` is the folder's policy.json in memory (``policy/manifest.py``): the model
    section, the recorded datasets and held-out episodes, joint names; ``io`` every transform
    between robot and model."""

    def __init__(
        self,
        model: torch.nn.Module,
        manifest: PolicyManifest,
        io: PolicyIO,
        prompt_cache: Any,
        path: Path | None = None,
    ) -> None:
        self.model = model.eval()
        self.path = path  # the policy folder it was loaded from (None when built in memory)
        self.manifest = manifest
        self.io = io
        self._init_instructions(prompt_cache)
        model.set_prompt_cache(prompt_cache)

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(
        cls,
        policy_dir: str | Path,
        device: torch.device | str | None = None,
        base_model: str | None = None,
        backbone_dtype: torch.dtype | None = None,
        merge_lora: bool = False,
        full_check: bool = False,
        compile: bool = False,
    ) -> DiT4DiTPolicy:
        """Load an exported policy folder (or a checkpoint / run folder that holds one).

        ``base_model`` replaces the base-model path recorded at export (the frozen Cosmos weights
        are referred to, never copied). ``backbone_dtype`` (e.g. ``torch.bfloat16`` on an
        accelerator) casts the video backbone for inference: half the memory and no per-op
        weight casts under autocast; the action head stays fp32. The default keeps the training
        precision (fp32 weights + the config's autocast). ``merge_lora`` folds a LoRA policy's
        adapter into the base transformer at load (no adapter cost per step). ``full_check`` hashes
        large files (a full-size model.safetensors) whole, not only their size and edges.
        ``compile`` torch.compiles each transformer block of the video backbone
        (``weights/compile.py``; ``--compile`` of serve, eval and sim.eval): the same actions, the first call
        (and the first at a second batch size) slower while it compiles; refused on Ascend NPU.
        """
        if compile:  # before the load: a host that cannot compile is told at once
            check_compile("compile / --compile")
        loaded = load_policy_folder(policy_dir, base_model=base_model, merge_lora=merge_lora, full_check=full_check)
        target = torch.device(device) if device is not None else dev.get_device()
        if backbone_dtype is not None:
            if backbone_dtype not in (torch.float32, dev.autocast_dtype()):
                raise ValueError(f"backbone_dtype: expected float32 or {dev.autocast_dtype()}, got {backbone_dtype}")
            loaded.model.use_backbone_dtype(backbone_dtype)
        model = loaded.model.to(target)
        if compile:
            compile_backbone(model, "compile / --compile")
        return cls(model, loaded.manifest, loaded.io, loaded.prompt_cache, loaded.path)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # The observation contract, read from the PolicyIO (one owner).
    @property
    def camera_keys(self) -> list[str]:
        return list(self.io.camera_keys)

    @property
    def image_size(self) -> tuple[int, int]:
        return self.io.image_size

    @property
    def state_dim(self) -> int:
        return self.io.state_dim

    @property
    def action_dim(self) -> int:
        return self.io.action_dim

    @property
    def chunk_length(self) -> int:
        return self.io.chunk_length

    def describe(self) -> PolicyDescription:
        """What this policy takes and returns, each fact once (what a server sends on connect)."""
        io, spec = self.io, self.io.spec
        return PolicyDescription(
            format_version=FORMAT_VERSION, step=self.manifest.step, base_model=self.manifest.base_model,
            camera_keys=self.camera_keys, image_size=self.image_size, source_image_sizes=io.source_sizes,
            camera_crops=io.camera_crops, state_dim=self.state_dim, action_dim=self.action_dim,
            chunk_length=self.chunk_length, instructions=sorted(self.prompt_cache.instructions),
            frame_size=spec.frame_size, view_layout=io.view_layout, state_width=spec.state_width,
            action_width=spec.action_width, policy_io=io.to_dict(),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """What a client needs to build observations: ``describe().metadata()``."""
        return self.describe().metadata()

    # ------------------------------------------------------------------ inference

    def predict_action(
        self,
        obs: dict[str, Any],
        seed: int | None = None,
        noise: Any = None,
        allow_out_of_range: bool = False,
        *,
        prev_chunk: Any = None,
        inference_delay: Any = 0,
        execution_horizon: Any = None,
        max_guidance_weight: float = DEFAULT_MAX_GUIDANCE,
        own_chunk: bool = False,
    ) -> np.ndarray:
        """Observation -> action chunk in robot units: (chunk, action_dim), or (B, chunk, action_dim)
        for batched input. Same ``seed`` (an int in [0, 2**63)) and input -> same output.

        A state (or a ``prev_chunk``) more than a whole training range beyond it in some dim
        (``contract.RANGE_LIMIT``) is refused with ``StateOutOfRangeError``
        (``PrevChunkOutOfRangeError``) naming the input, the dims, values and ranges; with
        ``allow_out_of_range=True`` the actions are returned and a ``StateRangeWarning``
        (``PrevChunkRangeWarning``) carries the same line.

        ``noise``: the call's random draws given explicitly, for an exact replay or a comparison
        with another implementation: a dict (or ``InferenceNoise``) with ``action`` (B,
        chunk, action width) the Euler start in the model's normalized, padded action space,
        ``feature`` (B, 16, T_lat, h, w) the feature-pass latents, and ``condition`` (B, 16, 1,
        h, w) the conditioning latent's posterior eps (policies imported from DiT4DiT); B = 1 for
        unbatched input. See dit4dit_npu/models/noise.py.

        Real-time chunking (``policy/rtc.py``): ``prev_chunk`` (L, action_dim) robot units, the
        previous chunk's actions still to execute from this observation on; ``inference_delay`` d
        of them execute before this chunk arrives; ``execution_horizon`` s (default H - L) ends the
        guidance at step H - s. The new chunk is inpainted onto that prefix (its first d actions
        follow ``prev_chunk``, the next ones blend into the new plan); without ``prev_chunk`` the
        call is plain sampling, bit for bit. ``max_guidance_weight``: the paper's beta, in
        [0, ``MAX_GUIDANCE_LIMIT``]. ``own_chunk=True``: ``prev_chunk`` is the rest of a chunk this
        policy returned (a control loop feeding back its own chunks): not range-checked."""
        seed = parse_seed(seed)  # before the (resizing) parse: a bad argument fails at once
        parsed = self.parse(obs, allow_out_of_range=allow_out_of_range)
        if prev_chunk is not None:
            parsed = self.with_rtc(parsed, prev_chunk, inference_delay, execution_horizon, max_guidance_weight,
                                   own_chunk=own_chunk)
        for line, category in zip(parsed.warnings, parsed.categories):
            warnings.warn(line, category, stacklevel=2)
        return self.predict_batch([parsed], seed=seed, noise=noise)[0]

    # ------------------------------------------------------------------ the server's interface
    # (parse and with_rtc, the request checks: RequestChecks, requests.py)

    def predict_batch(
        self, requests: Sequence[ParsedRequest], seed: int | None = None, noise: Any = None
    ) -> list[np.ndarray]:
        """Checked requests (``parse``, ``with_rtc``) -> one model call for all their rows -> one
        robot-unit chunk per request ((chunk, action_dim), or with the batch axis it was sent
        with). Requests of one call are all RTC or none, with one guidance strength (the server
        groups them so). Raises ``NonFiniteActionError`` rather than return NaN/inf."""
        seed = parse_seed(seed)
        merged = concat_requests(list(requests))
        observation, prefix = merged.observation, merged.prefix
        # Inference mode for plain sampling; RTC differentiates the head (rtc.py), which inference
        # tensors cannot take part in, so it runs under no_grad with autograd re-enabled inside.
        with torch.inference_mode() if prefix is None else torch.no_grad():
            batch = self.io.encode_parsed(observation)
            self.add_instructions(batch.instruction)
            guidance = prefix.to_guidance(self.io) if prefix is not None else None
            with self._lock:
                normalized = self.model.predict_action(batch, seed=seed, noise=noise, guidance=guidance)
            actions = self._finite(self.io.decode_actions(normalized), "predict_action", prefix)
        return split_rows(actions, requests)

    def predict_parsed(
        self,
        observation: Observation,
        seed: int | None = None,
        noise: Any = None,
        allow_out_of_range: bool = False,
        prefix: ChunkPrefix | None = None,
    ) -> np.ndarray:
        """``predict_action`` for an observation already parsed by ``io.parse_observation`` and a
        prefix already checked by ``rtc.chunk_prefix`` (offline evaluation feeds the dataset's
        views this way): the state range is checked here, as ``parse`` does."""
        parsed = ParsedRequest(observation, allow_out_of_range=allow_out_of_range)
        problem = self.state_range_problem(observation.state)
        if problem is not None:
            parsed = self._out_of_range(parsed, problem, StateOutOfRangeError, StateRangeWarning)
            warnings.warn(problem, StateRangeWarning, stacklevel=2)
        if prefix is not None and prefix.rows != observation.rows:
            raise PolicyInputError(f"prev_chunk: {prefix.rows} rows for an observation of {observation.rows}")
        return self.predict_batch([replace(parsed, prefix=prefix)], seed=seed, noise=noise)[0]

    def _finite(self, actions: np.ndarray, call: str, prefix: ChunkPrefix | None = None) -> np.ndarray:
        """Nothing non-finite reaches a robot or a client: raise instead of returning NaN/inf.
        The one check, for both outputs (robot units and normalized, whose padded dims follow
        the real ones). With real-time chunking inputs in play, they are what it names."""
        bad = ~np.isfinite(actions)
        if bad.any():
            joints = np.flatnonzero(bad.reshape(-1, actions.shape[-1]).any(0)).tolist()
            names = list(self.manifest.data.action_names or [f"action[{j}]" for j in range(self.action_dim)])
            names += [f"padding[{j}]" for j in range(len(names), actions.shape[-1])]
            head = (f"{call} produced {int(bad.sum())} NaN/inf value(s) of {bad.size} (joints "
                    f"{[names[j] for j in joints[:6]]}); refusing to return them: ")
            if prefix is not None:
                lo, hi = float(prefix.actions.min()), float(prefix.actions.max())
                raise NonFiniteActionError(
                    head + f"the real-time chunking inputs drove it there (prev_chunk spans [{lo:.4g}, {hi:.4g}], "
                    f"max_guidance_weight {prefix.max_guidance_weight:g}); send prev_chunk in the robot units the "
                    "policy was trained on, or call without prev_chunk"
                )
            raise NonFiniteActionError(
                head + "the observation is far outside the training data, or the policy's weights/normalizer are damaged"
            )
        return actions

    @torch.inference_mode()
    def predict_video(self, obs: dict[str, Any] | Observation, steps: int = 2, seed: int | None = None) -> np.ndarray:
        """The backbone's imagined future from the current frames: uint8 (T, H, W_tiled, 3), or
        (B, T, H, W_tiled, 3) for batched input; views tiled as the model sees them, frame 0 is
        the reconstruction of the observation. ``obs``: a robot observation, or one already parsed."""
        if steps < 1:
            raise PolicyInputError(f"steps: expected >= 1, got {steps}")
        seed = parse_seed(seed)
        parsed = obs if isinstance(obs, Observation) else self.io.parse_observation(obs)
        batch, batched = self.io.encode_parsed(parsed), parsed.batched
        self.add_instructions(batch.instruction)
        with self._lock:
            video = self.model.imagine_video(batch, num_steps=steps, seed=seed)
        out = video.permute(0, 1, 3, 4, 2).cpu().numpy()  # (B, T, H, W, 3)
        return out if batched else out[0]

    @torch.inference_mode()
    def reconstruct_video(self, views: np.ndarray) -> np.ndarray:
        """The VAE's round trip (encode -> decode) of a clip, for inspection next to
        ``predict_video``: views uint8 (T, V, H, W, 3) at ``io.image_size``, cameras in model order
        (``io.view`` of each camera image), or (B, T, V, H, W, 3) -> uint8 (T, H, W_tiled, 3) (or
        batched), tiled as the model sees them: what the video loss's targets look like decoded."""
        views = np.asarray(views)
        batched = views.ndim == 6
        if views.ndim not in (5, 6) or views.dtype != np.uint8:
            raise PolicyInputError(f"views: expected uint8 (T, V, H, W, 3) or (B, T, V, H, W, 3), got {views.dtype} {views.shape}")
        try:
            frames = self.io.frames(views if batched else views[None])
        except ValueError as e:
            raise PolicyInputError(str(e)) from None
        with self._lock:
            video = self.model.reconstruct_video(frames)
        out = video.permute(0, 1, 3, 4, 2).cpu().numpy()  # (B, T, H, W, 3)
        return out if batched else out[0]

    @torch.inference_mode()
    def observation_features(self, obs: dict[str, Any] | Observation, seed: int | None = None) -> dict[str, np.ndarray]:
        """What the action head reads for a robot observation, for analysis (``dit4dit_npu.eval.
        feature_probe``): {"latent": the conditioning VAE latent (B, 16, 1, h, w), normalised;
        "features": block ``extract_layer``'s output (B, tokens, hidden)}, float32, as
        ``predict_action`` computes them under the same seed."""
        seed = parse_seed(seed)
        parsed = obs if isinstance(obs, Observation) else self.io.parse_observation(obs)
        batch = self.io.encode_parsed(parsed)
        self.add_instructions(batch.instruction)
        with self._lock:
            latent, feats = self.model.observation_features(batch, seed=seed)
        return {"latent": latent.float().cpu().numpy(), "features": feats.float().cpu().numpy()}

    @torch.inference_mode()
    def predict_normalized(
        self, frames: np.ndarray, state: np.ndarray | None, instructions: list[str], seed: int | None = None
    ) -> np.ndarray:
        """Model-space inputs -> the model's normalized chunk (B, chunk, action_width) float32,
        padded dims included: what the original DiT4DiT model returned to its own clients, which
        un-normalize themselves. ``frames``: uint8 (B, H, W_tiled, 3), the views already resized and
        tiled as ``io.frame_size``; ``state``: (B, state_width), already encoded and padded (None
        when the policy takes no state). The server's DiT4DiT protocol; robots should use
        ``predict_action``. Raises ``NonFiniteActionError`` rather than return NaN/inf."""
        seed = parse_seed(seed)
        batch = Batch(
            frames=torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)[:, None].contiguous(),
            instruction=list(instructions),
            state=None if state is None else torch.from_numpy(np.asarray(state, dtype=np.float32)),
        )
        self.add_instructions(batch.instruction)
        with self._lock:
            normalized = self.model.predict_action(batch, seed=seed).float().cpu().numpy()
        return self._finite(normalized, "predict_normalized")
