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
actions and left unnormalization to each client). Only a ``ModelSpaceRequest`` does, for the
server's DiT4DiT protocol, whose clients un-normalize themselves.

Two prediction methods: ``predict_action(obs)``, the users' call, is ``predict_batch([parse(obs)])``
(``with_rtc`` between them for real-time chunking); a server calls the parts apart
(``contract.py``: its whole interface, with ``describe``), parsing each request once on arrival.
The research views of the model (imagined video, VAE round trip, features) are functions of
``dit4dit_npu.eval.research`` that take a policy. Nothing non-finite is ever returned
(``NonFiniteActionError``), and no state or ``prev_chunk`` far outside the training range is acted
on (``StateOutOfRangeError`` / ``PrevChunkOutOfRangeError``) unless the caller allows it
(``allow_out_of_range=True``: then a ``StateRangeWarning`` / ``PrevChunkRangeWarning`` says so).

The folder format is defined by ``folder.py`` (files) and ``manifest.py`` (policy.json).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dit4dit_npu import device as dev
from dit4dit_npu.batch import Batch
from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.models.noise import InferenceNoise, noise_from
from dit4dit_npu.policy.contract import (
    RANGE_LIMIT,
    STATE_RANGE_LIMIT,
    ModelSpaceRequest,
    OutOfRangeError,
    OutOfRangeWarning,
    ParsedRequest,
    PolicyDescription,
    PrevChunkOutOfRangeError,
    PrevChunkRangeWarning,
    StateOutOfRangeError,
    StateRangeWarning,
    concat_model_space,
    concat_requests,
    out_of_range_dims,
    split_rows,
)
from dit4dit_npu.policy.folder import load_policy_folder
from dit4dit_npu.policy.instructions import RunTimeInstructions
from dit4dit_npu.policy.manifest import FORMAT_VERSION, PolicyManifest
from dit4dit_npu.policy.requests import RequestChecks
from dit4dit_npu.policy.rtc import DEFAULT_MAX_GUIDANCE, MAX_GUIDANCE_LIMIT, ChunkPrefix, RTCRequest
from dit4dit_npu.transforms.observation import PolicyInputError, parse_seed
from dit4dit_npu.transforms.policy_io import PolicyIO
from dit4dit_npu.weights.compile import check_compile, compile_backbone

__all__ = [
    "MAX_GUIDANCE_LIMIT", "STATE_RANGE_LIMIT", "DiT4DiTPolicy", "NonFiniteActionError", "OutOfRangeError",
    "OutOfRangeWarning", "PolicyInputError", "PrevChunkOutOfRangeError", "PrevChunkRangeWarning",
    "StateOutOfRangeError", "StateRangeWarning",
]


class NonFiniteActionError(DiT4DiTError, RuntimeError):
    """The model computed NaN/inf actions: they are never returned to a robot. Not the caller's
    input error as such: the line says what drove it there (the inputs it names, or damage)."""


def state_out_of_range(stats: Any, state: np.ndarray, limit: float = RANGE_LIMIT) -> list[int]:
    """Dims of ``state`` (..., D) far outside the training range (``contract.out_of_range_dims``)."""
    return out_of_range_dims(stats, state, limit)


class DiT4DiTPolicy:
    """A trained DiT4DiT model with its PolicyIO and prompt cache, ready for inference.

    ``manifest`` is the folder's policy.json in memory (``policy/manifest.py``): the model
    section, the recorded datasets and held-out episodes, joint names; ``io`` every transform
    between robot and model. Its settings are given when it is built (``max_added_instructions``:
    the cap on instructions encoded at run time, ``instructions.py``) and never set from outside.
    Safe to share between threads: one lock serializes the model calls and the prompt cache they
    read, so one thread's new instruction cannot evict another's between encoding and use."""

    def __init__(
        self,
        model: torch.nn.Module,
        manifest: PolicyManifest,
        io: PolicyIO,
        prompt_cache: Any,
        path: Path | None = None,
        *,
        max_added_instructions: int | None = None,
    ) -> None:
        # Read-only once built: its parts (the request checks, the prompt cache) hold the same
        # objects, so a policy with another model, PolicyIO or manifest is a new policy.
        self._model, self._manifest, self._io = model.eval(), manifest, io
        self.path = path  # the policy folder it was loaded from (None when built in memory)
        self._lock = threading.RLock()
        self._instructions = RunTimeInstructions(prompt_cache, manifest, max_added_instructions)
        self._checks = RequestChecks(io, manifest)
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
        max_added_instructions: int | None = None,
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
        ``max_added_instructions``: keep at most this many instructions encoded at run time (least
        recently used dropped; None: no cap); a server passes its ``--max-new-instructions``.
        """
        if compile:  # before the load: a host that cannot compile is told at once
            check_compile("compile / --compile")
        RunTimeInstructions(None, None, max_added_instructions)  # a bad cap and dtype are told before the load too
        if backbone_dtype is not None and backbone_dtype not in (torch.float32, dev.autocast_dtype()):
            raise ValueError(f"backbone_dtype: expected float32 or {dev.autocast_dtype()}, got {backbone_dtype}")
        loaded = load_policy_folder(policy_dir, base_model=base_model, merge_lora=merge_lora, full_check=full_check)
        target = torch.device(device) if device is not None else dev.get_device()
        if backbone_dtype is not None:
            loaded.model.use_backbone_dtype(backbone_dtype)
        model = loaded.model.to(target)
        if compile:
            compile_backbone(model, "compile / --compile")
        return cls(model, loaded.manifest, loaded.io, loaded.prompt_cache, loaded.path,
                   max_added_instructions=max_added_instructions)

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    @property
    def manifest(self) -> PolicyManifest:
        """The folder's policy.json in memory (``policy/manifest.py``)."""
        return self._manifest

    @property
    def io(self) -> PolicyIO:
        """Every transform between robot and model (``transforms/policy_io.py``)."""
        return self._io

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

    @property
    def prompt_cache(self) -> Any:
        """The instructions' embeddings: the exported ones and those added at run time."""
        return self._instructions.cache

    @property
    def max_added_instructions(self) -> int | None:
        """The cap on instructions encoded at run time (None: no cap), set at construction."""
        return self._instructions.max_added

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
        unbatched input. See dit4dit_npu/models/noise.py. A non-finite result with ``noise`` given
        is blamed on it (``NonFiniteActionError`` names ``noise=`` and its largest value).

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
            parsed = self.with_rtc(parsed, RTCRequest(prev_chunk, inference_delay, execution_horizon,
                                                      max_guidance_weight, own_chunk=own_chunk))
        for line, category in zip(parsed.warnings, parsed.categories):
            warnings.warn(line, category, stacklevel=2)
        return self.predict_batch([parsed], seed=seed, noise=noise)[0]

    # ------------------------------------------------------------------ the server's interface
    # (contract.py; the request checks are RequestChecks, requests.py)

    def parse(self, obs: Any, allow_out_of_range: bool = False) -> ParsedRequest:
        """A robot observation (ours or openpi's layout, single or batched; or an ``Observation``
        already parsed by ``io.parse_observation``) -> a checked request: images cropped and
        resized, the state range checked (refused, or with ``allow_out_of_range`` carried as a
        warning line). The one parse of an observation."""
        return self._checks.parse(obs, allow_out_of_range)

    def with_rtc(self, parsed: ParsedRequest, rtc: RTCRequest) -> ParsedRequest:
        """``parsed`` with real-time chunking (``policy/rtc.py``; see ``predict_action``): checked,
        and ``prev_chunk`` range-checked against the training actions like the state, under the
        request's ``allow_out_of_range`` (not when ``rtc.own_chunk``)."""
        return self._checks.with_rtc(parsed, rtc)

    def predict_batch(
        self, requests: Sequence[ParsedRequest] | Sequence[ModelSpaceRequest], seed: int | None = None,
        noise: Any = None,
    ) -> list[np.ndarray]:
        """Checked requests -> one model call for all their rows -> one chunk per request.

        ``ParsedRequest``s (``parse``, ``with_rtc``) get robot-unit chunks ((chunk, action_dim), or
        with the batch axis they were sent with); requests of one call are all RTC or none, with
        one guidance strength (the server groups them so). ``ModelSpaceRequest``s get the model's
        normalized chunks (rows, chunk, action_width). Raises ``NonFiniteActionError`` rather than
        return NaN/inf. ``noise``: see ``predict_action``."""
        seed = parse_seed(seed)
        requests = list(requests)
        if not requests:  # the caller's input (a server counts it so), not a bug of the policy
            raise PolicyInputError("predict_batch: expected one or more requests (ParsedRequests or ModelSpaceRequests), got none")
        kinds = {type(r) for r in requests}
        if len(kinds) != 1 or not kinds <= {ParsedRequest, ModelSpaceRequest}:
            raise TypeError(f"predict_batch: expected ParsedRequests or ModelSpaceRequests, got {sorted(k.__name__ for k in kinds)}")
        if ModelSpaceRequest in kinds:
            return split_rows(self._predict_model_space(concat_model_space(requests), seed, noise), requests)
        merged = concat_requests(requests)
        observation, prefix = merged.observation, merged.prefix
        # Inference mode for plain sampling; RTC differentiates the head (rtc.py), which inference
        # tensors cannot take part in, so it runs under no_grad with autograd re-enabled inside.
        with torch.inference_mode() if prefix is None else torch.no_grad():
            batch = self.io.encode_parsed(observation)
            guidance = prefix.to_guidance(self.io) if prefix is not None else None
            with self.held_model(batch.instruction) as model:
                normalized = model.predict_action(batch, seed=seed, noise=noise, guidance=guidance)
            actions = self._finite(self.io.decode_actions(normalized), "predict_action", prefix, noise)
        return split_rows(actions, requests)

    @torch.inference_mode()
    def _predict_model_space(self, request: ModelSpaceRequest, seed: int | None, noise: Any) -> np.ndarray:
        """DiT4DiT's model-space inputs -> the model's normalized chunk, padded dims included: what
        the original DiT4DiT model returned to its own clients, which un-normalize themselves."""
        batch = Batch(
            frames=torch.from_numpy(np.ascontiguousarray(request.frames)).permute(0, 3, 1, 2)[:, None].contiguous(),
            instruction=list(request.instructions),
            state=None if request.state is None else torch.from_numpy(np.asarray(request.state, dtype=np.float32)),
        )
        with self.held_model(batch.instruction) as model:
            normalized = model.predict_action(batch, seed=seed, noise=noise).float().cpu().numpy()
        return self._finite(normalized, "predict_batch (model space)", noise=noise)

    # ------------------------------------------------------------------ the model and its prompt cache

    @contextmanager
    def held_model(self, instructions: Sequence[str] = ()) -> Iterator[torch.nn.Module]:
        """The model, with ``instructions`` in its prompt cache (encoded on first use), held by
        this thread alone until the block ends: how every model call of the policy runs, and how
        research code (``dit4dit_npu.eval.research``) calls the model's other methods."""
        with self._lock:
            self._instructions.add(list(instructions), self.device)
            yield self.model

    def add_instructions(self, instructions: list[str]) -> int:
        """Encode instructions not in the prompt cache yet (loads the text encoder once, on
        first need), e.g. ahead of the first request. Returns how many were encoded."""
        with self._lock:
            return self._instructions.add(list(instructions), self.device)

    def release_text_encoder(self) -> None:
        """Free the text encoder (it is ~8B parameters on the real model); cached prompts stay."""
        with self._lock:
            self._instructions.release_text_encoder()

    def _finite(self, actions: np.ndarray, call: str, prefix: ChunkPrefix | None = None, noise: Any = None) -> np.ndarray:
        """Nothing non-finite reaches a robot or a client: raise instead of returning NaN/inf.
        The one check, for both outputs (robot units and normalized, whose padded dims follow
        the real ones). With the caller's ``noise=`` or real-time chunking inputs in play, they
        are what it names, not the observation."""
        bad = ~np.isfinite(actions)
        if bad.any():
            joints = np.flatnonzero(bad.reshape(-1, actions.shape[-1]).any(0)).tolist()
            names = list(self.manifest.data.action_names or [f"action[{j}]" for j in range(self.action_dim)])
            names += [f"padding[{j}]" for j in range(len(names), actions.shape[-1])]
            head = (f"{call} produced {int(bad.sum())} NaN/inf value(s) of {bad.size} (joints "
                    f"{[names[j] for j in joints[:6]]}); refusing to return them: ")
            given = "" if noise is None else (
                f"the noise= it was given (values up to {_noise_span(noise):.4g}; the sampler's own draws are "
                "standard normal)")
            if prefix is not None:
                lo, hi = float(prefix.actions.min()), float(prefix.actions.max())
                raise NonFiniteActionError(
                    head + f"the real-time chunking inputs drove it there (prev_chunk spans [{lo:.4g}, {hi:.4g}], "
                    f"max_guidance_weight {prefix.max_guidance_weight:g})" + (f", with {given}" if given else "")
                    + "; send prev_chunk in the robot units the policy was trained on, or call without prev_chunk"
                )
            if given:
                raise NonFiniteActionError(
                    head + f"{given} drove it there; pass noise of the documented shapes drawn from a standard "
                    "normal (dit4dit_npu/models/noise.py), or call without noise="
                )
            raise NonFiniteActionError(
                head + "the observation is far outside the training data, or the policy's weights/normalizer are damaged"
            )
        return actions



def _noise_span(noise: Any) -> float:
    """The largest magnitude in a call's explicit noise (its fields as ``models/noise.py`` reads them)."""
    given = noise_from(noise, InferenceNoise)
    tensors = [t for t in (given.action, given.feature, given.condition) if t is not None]
    return max((float(t.abs().max()) for t in tensors if t.numel()), default=0.0)
