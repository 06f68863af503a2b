"""Closed-loop episodes: a policy's action chunks drive the scene, K actions per query, merged
by the execution mode under an artificial inference delay (``execution.py``).

``Worker`` owns one scene and one policy (one process each when the eval runs in parallel);
``worker_main`` is the body of a worker process: it reports ready (or why it cannot start),
waits for the go, then runs the seeds it takes from a shared queue.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from dit4dit_client import ChunkExecutor

from dit4dit_npu.sim.errors import EpisodeError, SimError
from dit4dit_npu.sim.execution import Execution, boundary_jerk
from dit4dit_npu.sim.tasks import DEFAULT_SIZE, scene_spec


@dataclass
class EvalSetup:
    task: str
    policy: str
    max_steps: int
    replan: int | None  # actions executed per query; None = the whole chunk
    size_hw: tuple[int, int] | None  # None = the policy's training video size, else DEFAULT_SIZE
    video_dir: str | None = None
    video_seeds: tuple[int, ...] = ()
    threads: int | None = None  # torch threads per worker (parallel workers share the cores)
    connect_timeout_s: float = 30.0
    merge_lora: bool = False  # a LoRA policy folder: fold its adapter into the base at load
    compile: bool = False  # a policy folder: torch.compile its backbone blocks (--compile)
    execution: Execution = Execution()  # merging mode and artificial inference delay
    noise_stream: int | None = None  # a policy folder's noise from one stream of this seed (--noise-stream)


def default_size(metadata: dict[str, Any], fallback: tuple[int, int] = DEFAULT_SIZE) -> tuple[int, int]:
    """Render at the size the policy's training videos had (no resize, same pixels as its data);
    ``fallback`` (the scene's usual size) when the policy does not say."""
    sizes = (metadata.get("source_image_sizes") or {}).get((metadata.get("camera_keys") or [None])[0])
    if sizes and len(sizes) == 1:
        return int(sizes[0][0]), int(sizes[0][1])
    return fallback


def make_scene(task: str, size_hw: tuple[int, int]) -> Any:
    """The scene of ``--task``: an ALOHA scene, or a Meta-World one (``metaworld/<task>``); each
    simulator's modules load only when its scene is made."""
    if scene_spec(task).simulator == "Meta-World":
        from dit4dit_npu.sim.metaworld_scene import MetaworldScene

        return MetaworldScene(task, size_hw)
    from dit4dit_npu.sim.scene import AlohaScene

    return AlohaScene(task, size_hw)


class Worker:
    def __init__(self, setup: EvalSetup) -> None:
        from dit4dit_npu.sim.policies import make_policy

        self.setup = setup
        spec = scene_spec(setup.task)
        self.policy = make_policy(
            setup.policy, setup.threads, setup.connect_timeout_s, setup.merge_lora, setup.compile, scene=spec,
            noise_stream=setup.noise_stream,
        )
        chunk = self.policy.metadata.get("chunk_length")
        if setup.replan is not None and chunk and setup.replan > chunk:
            raise SimError(f"--replan {setup.replan} exceeds the policy's chunk length {chunk}")
        if setup.execution.mode == "rtc" and not self.policy.takes_prefix:
            raise SimError(
                f"--execution rtc: policy {self.policy.name} cannot inpaint onto a previous chunk "
                "(a DiT4DiT policy folder or ws:// server can)"
            )
        self.horizon = setup.replan
        if setup.execution.mode != "sync":
            self.horizon = _async_horizon(setup.replan, chunk, setup.execution.delay_steps)
        self.size_hw = tuple(setup.size_hw or default_size(self.policy.metadata, spec.default_size))
        self.scene = make_scene(setup.task, self.size_hw)

    @property
    def info(self) -> dict[str, Any]:
        """What the summary reports about this worker's set-up."""
        return {"size_hw": self.size_hw, "metadata": self.policy.metadata, "execution_horizon": self.horizon}

    def run(self, seed: int) -> dict[str, Any]:
        video = None
        if self.setup.video_dir and seed in self.setup.video_seeds:
            from dit4dit_npu.data.video import Mp4Writer

            h, w = self.size_hw
            path = Path(self.setup.video_dir) / f"{self.setup.task.replace('/', '_')}_seed{seed:06d}.mp4"
            video = Mp4Writer(path, (h, w * len(self.scene.cameras)), self.scene.spec.fps)
        try:
            result = run_episode(
                self.scene, self.policy, seed, self.setup.max_steps, self.horizon, video, self.setup.execution
            )
        finally:
            if video is not None:
                video.close()
        result["video"] = str(path) if video is not None else None
        return result

    def close(self) -> None:
        self.policy.close()
        self.scene.close()


def _async_horizon(replan: int | None, chunk: int | None, delay: int) -> int:
    """The execution horizon s of an async mode: half the chunk by default. One request is in flight
    at a time, so requests are max(s, d) steps apart and a chunk must last max(s, d) + d steps: else
    the robot runs out of actions before every new chunk arrives."""
    if not chunk:
        raise SimError("--execution: the async modes need a chunk policy (a policy folder, ws:// or expert_chunks)")
    horizon = replan if replan is not None else max(1, chunk // 2)
    if max(horizon, delay) + delay > chunk:
        raise SimError(
            f"--replan {horizon} and the delay's {delay} steps need chunks of max(replan, delay) + delay = "
            f"{max(horizon, delay) + delay} steps, the policy's have {chunk}: the robot would run out of actions "
            "before every new chunk (lower --replan or --delay-ms)"
        )
    return horizon


@dataclass
class Timer:
    total_s: float = 0.0
    count: int = 0

    def ms(self) -> float | None:
        return round(1000 * self.total_s / self.count, 2) if self.count else None


def run_episode(
    scene, policy, seed: int, max_steps: int, replan: int | None, video=None, execution: Execution | None = None
) -> dict[str, Any]:
    """Reset to ``seed``; query a chunk, execute its first ``replan`` actions, repeat until reward 4
    (gym-aloha terminates there) or ``max_steps``. With a delay, the chunk for the observation of
    step k arrives at step k + d and the mode decides what runs meanwhile (a robot with nothing
    to execute holds its last command, at first its start pose). Timings exclude video encoding."""
    spec = scene.spec
    execution = execution or Execution(fps=spec.fps)
    obs = scene.reset(seed)
    policy.reset(scene, seed)
    executor = ChunkExecutor(execution.mode, replan)
    delay = execution.delay_steps
    env_t, policy_t = Timer(), Timer()
    first_success, error, arriving = None, None, None
    executed: list[np.ndarray] = []
    last = np.asarray(obs["state"], np.float32)
    while scene.steps < max_steps and first_success is None and error is None:
        k = scene.steps
        if arriving is not None and k >= arriving[0]:
            error = _receive(executor, arriving[1], k)
            arriving = None
        if error is None and executor.wants_request(k):
            request = executor.request(k)
            t0 = time.perf_counter()
            chunk = np.asarray(policy.act(obs, request), np.float32)
            policy_t.total_s += time.perf_counter() - t0
            policy_t.count += 1
            if chunk.ndim != 2 or chunk.shape[1] != spec.action_dim or len(chunk) == 0:
                raise SimError(
                    f"policy {policy.name} returned actions of shape {chunk.shape}, expected (k, {spec.action_dim})"
                )
            if delay == 0:
                error = _receive(executor, chunk, k)
            else:
                arriving = (k + delay, chunk)
        if error is not None:
            break
        action = executor.action(k)
        last = last if action is None else action
        if video is not None:
            video.write(np.concatenate([obs[c] for c in scene.cameras], axis=1))
        t0 = time.perf_counter()
        try:
            step = scene.step(last)
        except EpisodeError as e:
            error = str(e)
            break
        env_t.total_s += time.perf_counter() - t0
        env_t.count += 1
        executed.append(last)
        obs = step.obs
        if step.success:
            first_success = scene.steps
    if video is not None and error is None:
        video.write(np.concatenate([obs[k] for k in scene.cameras], axis=1))  # the final state
    # the first chunk's arrival starts the robot from rest: not a hand-over between chunks
    smooth = boundary_jerk(
        np.asarray(executed).reshape(-1, spec.action_dim), executor.boundaries[1:], spec.jerk_dims, spec.fps
    )
    return {
        "seed": seed,
        "success": first_success is not None,
        # the registered env's time limit: what a stock gymnasium rollout would have scored
        f"success_within_{spec.time_limit}": first_success is not None and first_success <= spec.time_limit,
        "steps_to_success": first_success,
        "steps": scene.steps,
        "max_reward": scene.max_reward,
        "policy_calls": policy_t.count,
        "policy_ms_per_call": policy_t.ms(),
        "policy_ms_per_step": round(1000 * policy_t.total_s / scene.steps, 2) if scene.steps else None,
        "env_ms_per_step": env_t.ms(),
        **smooth,
        "error": error,
    }


def _receive(executor: ChunkExecutor, chunk: np.ndarray, step: int) -> str | None:
    """Hand an arrived chunk to the executor; a chunk with NaN/inf ends the episode (none of it runs)."""
    try:
        executor.receive(chunk, step)
    except ValueError as e:
        return f"non-finite actions from the policy at step {step}: {e}"
    return None


def worker_main(setup: EvalSetup, seeds, results) -> None:
    """Process body (``sim.workers.work``): its own scene and policy, then a result dict per seed."""
    from dit4dit_npu.sim.workers import work

    def start():
        worker = Worker(setup)
        return worker.info, worker.run, worker.close

    work(start, seeds, results)
