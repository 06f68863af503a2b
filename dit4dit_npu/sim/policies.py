"""What the closed-loop eval can drive, behind one small interface:

    policy.reset(scene, seed)       # a new episode (scene already reset)
    chunk = policy.act(obs, request)  # (k, 14) float32 joint targets, robot units

``request`` (``dit4dit_client.ChunkRequest``) says what the executor knows when it asks: how
much of the current chunk was executed and, for real-time chunking, the rest of it and the
expected delay (``rollout.py``). ``--policy`` names one: ``expert`` (the scripted expert, an upper
bound that checks the harness), ``expert_chunks`` (the same expert planning 16-step open-loop
chunks: a control for chunked and delayed execution), ``hold`` (holds the start pose, a lower
bound), ``ws://host:port`` (a policy served by ``python -m dit4dit_npu.serve``, through the same
client a robot uses, RTC on its connection's session) or a policy folder
(``DiT4DiTPolicy.from_pretrained``, in-process). A policy that cannot drive the scene (other
cameras, action or state size) is refused before any episode runs.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from dit4dit_client import ChunkRequest

from dit4dit_npu.sim.errors import SimError
from dit4dit_npu.sim.tasks import SEED_LIMIT, SceneSpec, scene_spec

BUILTIN = ("expert", "expert_chunks", "hold")
EXPERT_CHUNK_LENGTH = 16  # the ALOHA configs' chunk: 0.32 s at 50 Hz
CONNECT_TIMEOUT_S = 30.0  # a server that is still loading its model gets this long


class SimPolicy(Protocol):
    name: str
    metadata: dict[str, Any]  # camera_keys, chunk_length, ... (empty for built-ins)
    takes_prefix: bool  # can inpaint onto a previous chunk (real-time chunking)

    def reset(self, scene: Any, seed: int) -> None: ...

    def act(self, obs: dict[str, Any], request: ChunkRequest | None = None) -> np.ndarray: ...

    def close(self) -> None: ...


class ExpertPolicy:
    """The scripted expert as a policy: one action per call, privileged object state."""

    name, metadata, takes_prefix = "expert", {}, False

    def reset(self, scene: Any, seed: int) -> None:
        from dit4dit_npu.sim.experts import make_expert

        self._expert = make_expert(scene)

    def act(self, obs: dict[str, Any], request: ChunkRequest | None = None) -> np.ndarray:
        return self._expert(obs)[None]

    def close(self) -> None:
        pass


class ExpertChunkPolicy:
    """The scripted expert answering each observation with a 16-step open-loop chunk of its plan.
    Its schedule advances by the actions executed (the request says how many of the last chunk),
    so pauses and delays change what is executed, not the plan."""

    name, metadata, takes_prefix = "expert_chunks", {"chunk_length": EXPERT_CHUNK_LENGTH}, False

    def reset(self, scene: Any, seed: int) -> None:
        from dit4dit_npu.sim.experts import make_chunk_expert

        self._chunks = make_chunk_expert(scene, EXPERT_CHUNK_LENGTH)
        self._start = 0  # schedule step of the last chunk's first action

    def act(self, obs: dict[str, Any], request: ChunkRequest | None = None) -> np.ndarray:
        if request is not None and request.executed is not None:
            self._start += request.executed
        return self._chunks(self._start)

    def close(self) -> None:
        pass


class HoldPolicy:
    """Commands the episode's start configuration forever: what doing nothing scores."""

    name, metadata, takes_prefix = "hold", {}, False

    def reset(self, scene: Any, seed: int) -> None:
        self._start: np.ndarray | None = None

    def act(self, obs: dict[str, Any], request: ChunkRequest | None = None) -> np.ndarray:
        if self._start is None:
            self._start = np.asarray(obs["state"], np.float32).copy()
        return self._start[None]

    def close(self) -> None:
        pass


def _policy_observation(obs: dict[str, Any], camera_keys: list[str]) -> dict[str, Any]:
    """Exactly the keys the policy declared (it rejects extra ones)."""
    return {**{k: obs[k] for k in camera_keys}, "state": obs["state"], "instruction": obs["instruction"]}


class FolderPolicy:
    """A policy folder loaded in this process (each eval worker loads its own copy: for a large
    model serve it once and point the workers at ``ws://``)."""

    takes_prefix = True

    def __init__(
        self, path: str, threads: int | None = None, merge_lora: bool = False, allow_out_of_range: bool = False,
        compile: bool = False, noise_stream: int | None = None,
    ) -> None:
        """``allow_out_of_range``: act on states far outside the training range (the policy's
        ``StateRangeWarning`` instead of a refusal), e.g. a policy trained on another robot's data
        run in a scene only to exercise the loop. ``noise_stream``: lerobot-eval's noise protocol:
        its ``set_seed(--seed)`` seeds Python's, numpy's and torch's global RNGs once, before the
        policy is built, and every chunk's noise is then an unseeded draw from torch's stream (so an
        episode's noise depends on every draw before it in the process); the same seeding here,
        then chunks asked without a seed. None: each chunk's noise seeded from its episode's seed
        (``reset``), so a run repeats itself whatever ran before it in the process."""
        import torch

        from dit4dit_npu.device import seed_everything
        from dit4dit_npu.policy import DiT4DiTPolicy
        from dit4dit_npu.policy.folder import PolicyLoadError

        if threads:
            torch.set_num_threads(threads)
        if noise_stream is not None:
            check_stream_seed(noise_stream)
            seed_everything(noise_stream)  # what lerobot's set_seed does, before the policy is built
        self._stream = noise_stream is not None
        try:
            self._policy = DiT4DiTPolicy.from_pretrained(path, merge_lora=merge_lora, compile=compile)
        except (PolicyLoadError, FileNotFoundError, NotADirectoryError) as e:
            raise SimError(f"--policy {path}: {e}") from None
        self.name, self.metadata = path, self._policy.metadata
        self._allow = allow_out_of_range
        self._seed = 0

    @property
    def policy(self) -> Any:
        """The loaded ``DiT4DiTPolicy`` (for inspection next to the episode: ``eval.video_picture``)."""
        return self._policy

    def reset(self, scene: Any, seed: int) -> None:
        self._seed = seed * 10_000  # same episode seed -> same flow-matching noise per call

    def act(self, obs: dict[str, Any], request: ChunkRequest | None = None) -> np.ndarray:
        from dit4dit_npu.policy import PolicyInputError

        self._seed += 1
        rtc = request.rtc() if request is not None else None
        try:
            return self._policy.predict_action(
                _policy_observation(obs, self.metadata["camera_keys"]), seed=None if self._stream else self._seed,
                allow_out_of_range=self._allow, **(rtc or {}), own_chunk=True,  # the rest of its own chunk
            )
        except PolicyInputError as e:
            raise SimError(f"policy {self.name} rejected the scene's observation: {e}") from None

    def close(self) -> None:
        pass


def check_stream_seed(seed: int, flag: str = "--noise-stream") -> None:
    """A noise stream's seed is one lerobot's ``set_seed`` takes: numpy's range. The device layer's
    seeding folds any int into that range, which would make another int a stream of a seed lerobot-eval
    never ran; refused before anything is seeded."""
    if not 0 <= seed < SEED_LIMIT:
        raise SimError(f"{flag} {seed}: expected a seed in [0, 2**32) (numpy's seed range, which lerobot's set_seed "
                       "seeds too)")


class RemotePolicy:
    """A policy served by ``python -m dit4dit_npu.serve``, through ``WebsocketClientPolicy``; real-
    time chunking on the connection's session (the server keeps the last chunk it sent)."""

    takes_prefix = True

    def __init__(self, uri: str, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        from dit4dit_client import WebsocketClientPolicy

        try:
            self._client = WebsocketClientPolicy(uri, None, connect_timeout_s=connect_timeout_s)
        except ConnectionError as e:
            raise SimError(
                f"--server {uri}: server unreachable ({e}); start it with "
                "python -m dit4dit_npu.serve --policy POLICY_DIR --port PORT"
            ) from None
        except ValueError as e:  # a malformed address, e.g. a port past 65535
            raise SimError(f"--server {uri}: {e}") from None
        self.name, self.metadata = uri, self._client.get_server_metadata()

    def reset(self, scene: Any, seed: int) -> None:
        self._client.reset()  # the server forgets the last episode's chunk

    def act(self, obs: dict[str, Any], request: ChunkRequest | None = None) -> np.ndarray:
        from dit4dit_client import ServerError

        rtc = request.rtc(session=True) if request is not None else None
        try:
            reply = self._client.infer(_policy_observation(obs, self.metadata["camera_keys"]), rtc=rtc)
        except ServerError as e:
            raise SimError(f"policy server {self.name} rejected the scene's observation: {e}") from None
        except (ConnectionError, OSError) as e:  # the server went away mid-eval
            raise SimError(f"policy server {self.name} connection lost: {e}") from None
        return np.asarray(reply["actions"], np.float32)

    def close(self) -> None:
        self._client.close()


def make_policy(
    spec: str, threads: int | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S, merge_lora: bool = False,
    compile: bool = False, scene: SceneSpec | None = None, noise_stream: int | None = None,
) -> SimPolicy:
    """``expert`` | ``expert_chunks`` | ``hold`` | ``ws://host:port`` | a policy folder -> a policy
    checked against ``scene`` (default: ALOHA's transfer cube)."""
    if merge_lora and (spec in BUILTIN or spec.startswith(("ws://", "wss://"))):
        raise SimError(f"--merge-lora: applies to a policy folder, not {spec} (serve a LoRA policy with --merge-lora)")
    if compile and (spec in BUILTIN or spec.startswith(("ws://", "wss://"))):
        raise SimError(f"--compile: applies to a policy folder, not {spec} (serve the policy with --compile)")
    if spec == "expert":
        return ExpertPolicy()
    if spec == "expert_chunks":
        return ExpertChunkPolicy()
    if spec == "hold":
        return HoldPolicy()
    if spec.startswith(("ws://", "wss://")):
        policy: SimPolicy = RemotePolicy(spec, connect_timeout_s)
    else:
        policy = FolderPolicy(spec, threads, merge_lora, compile=compile, noise_stream=noise_stream)
    check_compatible(policy.name, policy.metadata, scene)
    return policy


def check_compatible(name: str, meta: dict[str, Any], scene: SceneSpec | None = None) -> None:
    """Refuse a policy that expects cameras the scene does not have, or other state/action sizes."""
    scene = scene or scene_spec("transfer_cube")
    cams = list(meta.get("camera_keys") or [])
    unknown = [c for c in cams if c not in scene.cameras]
    if not cams or unknown:
        raise SimError(
            f"policy {name} expects cameras {cams}, but the {scene.simulator} scene provides {list(scene.cameras)}"
        )
    for what, want in (("action_dim", scene.action_dim), ("state_dim", scene.state_dim)):
        if meta.get(what) != want:
            raise SimError(
                f"policy {name} has {what}={meta.get(what)}, but the {scene.simulator} scene needs {want} "
                f"({scene.layout})"
            )
