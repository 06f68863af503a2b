"""Closed-loop success rate of a policy on an ALOHA scene or a Meta-World task.

    python -m dit4dit_npu.sim.eval (--policy POLICY_DIR | --server ws://HOST:PORT | --scripted expert|expert_chunks|hold) \
        --task transfer_cube --episodes 50 --seed 0 [--replan K] [--size HxW] [--videos N] \
        [--execution sync|async|ensemble|rtc] [--delay-ms D] [--workers W] --out DIR

Episode i uses seed S+i (gym-aloha's object placement for that seed; demos use seeds >= 100000).
Each query returns an action chunk; its first K actions are executed (default: all of it), then
the policy sees the new observation. ``--delay-ms`` simulates inference time: a chunk is usable
d = ceil(D x 50 Hz) steps after its observation, and ``--execution`` says what the robot does
meanwhile (``execution.py``: pause, keep executing the old chunk, temporal ensembling, or
real-time chunking); the boundary jerk of every episode is reported with it. An episode
succeeds when gym-aloha's reward reaches 4 (it
ends there, as gym-aloha's env terminates); success within gym-aloha's 300-step limit is reported
too. Prints one line per episode and ``success k/N = p% (95% Wilson CI lo–hi%)``; writes
``results.json`` and mp4s (cam_high | left wrist | right wrist) of the first N episodes.
W > 1 runs episodes in W processes, each with its own scene and policy; a worker that dies ends the
eval at once (an error naming its exit code), and no result within ``--episode-timeout`` seconds
(default 3600) of the last one ends it with one line.

``--task metaworld/<task>`` (e.g. ``metaworld/reach-v3``) runs the same loop in Meta-World, as
lerobot 0.6.1's env shows it (``metaworld_scene.py``): seed S places the goal and objects as
lerobot-eval's episode of seed S; success is Meta-World's ``info["success"]``; at most 500 steps.
A policy folder's noise is seeded per chunk from the episode's seed; ``--noise-stream S`` draws it
from one stream seeded S instead, as lerobot-eval does (its --seed as S, and it run with
--eval.batch_size=1 on the same device: its Meta-World episodes, exactly).

The command (its flags, the printed lines) is ``eval_main`` in ``sim/cli.py``; this module runs the
episodes and writes ``results.json``.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path
from typing import Any

from dit4dit_npu.files import atomic_write_json
from dit4dit_npu.sim.errors import SimError
from dit4dit_npu.sim.execution import Execution
from dit4dit_npu.sim.policies import BUILTIN, check_stream_seed
from dit4dit_npu.sim.rollout import EvalSetup
from dit4dit_npu.sim.success_rate import wilson_interval
from dit4dit_npu.sim.tasks import check_seed_range, parse_size, scene_spec

# --workers > 1: how long the eval waits for its workers' next message (a result, or a worker's
# start) by default. Generous: an episode of a tiny policy takes seconds here, and a large policy on
# a CPU can take many minutes an episode; a wait that never ends is the failure it guards against.
EPISODE_TIMEOUT_S = 3600.0


def check_episode_timeout(timeout_s: float, workers: int, episodes: int, episodes_given: str = "") -> None:
    """--episode-timeout's values: seconds > 0, and only where the eval waits on workers (one
    worker, or one episode, runs in this process: a deadline there would be a flag that does nothing).
    ``episodes_given``: how the command was told its ``episodes`` (default ``--episodes N``)."""
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise SimError(f"--episode-timeout: expected seconds > 0, got {timeout_s}")
    if min(workers, episodes) == 1:
        why = (f"--workers {workers} with {episodes_given or f'--episodes {episodes}'} runs in this process"
               if workers > 1 else "--workers 1 runs the episodes in this process")
        raise SimError(f"--episode-timeout {timeout_s:g}: {why}, which waits on no worker; it applies "
                       "with --workers > 1 and --episodes > 1")


def make_setup(a: argparse.Namespace) -> EvalSetup:
    """Validate the arguments (one SimError per problem) and describe what every worker runs."""
    spec = scene_spec(a.task)
    for name, value, low in (
        ("--episodes", a.episodes, 1),
        ("--max-steps", a.max_steps, 1),
        ("--workers", a.workers, 1),
        ("--videos", a.videos, 0),
    ):
        if value < low:
            raise SimError(f"{name}: expected >= {low}, got {value}")
    if spec.max_steps is not None and a.max_steps > spec.max_steps:
        raise SimError(f"--max-steps: {spec.simulator} ends an episode at {spec.max_steps} steps; expected 1 to "
                       f"{spec.max_steps}, got {a.max_steps}")
    if spec.simulator != "ALOHA" and a.policy in BUILTIN:
        raise SimError(f"--scripted {a.policy}: the scripted policies drive the ALOHA tasks; --task {a.task} takes "
                       "--policy DIR or --server ws://HOST:PORT")
    if spec.simulator != "ALOHA" and a.delay_ms:
        raise SimError(f"--delay-ms {a.delay_ms:g}: --task {a.task} acts by hand displacements, so there is no pose "
                       "to hold while the first chunk is computed; expected 0")
    check_seed_range(a.seed, a.episodes)
    if a.noise_stream is not None:
        check_noise_stream(a.noise_stream, a.policy, a.workers, a.episodes)
    if a.replan is not None and a.replan < 1:
        raise SimError(f"--replan: expected >= 1, got {a.replan}")
    if not (math.isfinite(a.connect_timeout) and a.connect_timeout > 0):
        raise SimError(f"--connect-timeout: expected seconds > 0, got {a.connect_timeout}")
    if a.episode_timeout is not None:
        check_episode_timeout(a.episode_timeout, a.workers, a.episodes)
    execution = Execution(a.execution, a.delay_ms, spec.fps)
    # --out is made only once the policy and scene are known good: a file in the way is said now
    for folder in (a.out, *a.out.parents):
        if folder.exists():
            if not folder.is_dir():
                raise SimError(f"--out {a.out}: {folder} is a file, not a folder")
            break
    if (a.out / "results.json").exists():
        raise SimError(
            f"--out: {a.out / 'results.json'} exists; choose another folder (results are never overwritten)"
        )
    if (
        a.policy not in BUILTIN
        and not a.policy.startswith(("ws://", "wss://"))
        and not Path(a.policy).is_dir()
    ):
        raise SimError(f"--policy: {a.policy!r} is not a policy folder (a server: --server ws://HOST:PORT; a "
                       f"scripted policy: --scripted {'|'.join(BUILTIN)})")
    if a.policy not in BUILTIN and Path(a.policy).is_dir() and min(a.workers, a.episodes) > 1:
        check_policy_folder(a.policy)
    seeds = list(range(a.seed, a.seed + a.episodes))
    workers = min(a.workers, a.episodes)
    cores = os.cpu_count() or 1
    return EvalSetup(
        task=a.task,
        policy=a.policy,
        max_steps=a.max_steps,
        replan=a.replan,
        size_hw=parse_size(a.size) if a.size else None,
        video_dir=str(a.out / "videos") if a.videos else None,
        video_seeds=tuple(seeds[: a.videos]),
        threads=max(1, cores // workers) if workers > 1 else None,
        connect_timeout_s=a.connect_timeout,
        merge_lora=a.merge_lora,
        compile=a.compile,
        execution=execution,
        noise_stream=a.noise_stream,
    )


def check_policy_folder(path: str) -> None:
    """A policy folder's manifest and the files it names, before W workers each import torch and the
    model library (~10 s) only to refuse it; the workers' own load says it the same way. (One
    process loads it at once anyway: no second read there.)"""
    from dit4dit_npu.policy.folder import PolicyLoadError, find_policy_dir, read_policy_json

    try:
        read_policy_json(find_policy_dir(path))
    except PolicyLoadError as e:
        raise SimError(f"--policy {path}: {e}") from None


def check_noise_stream(seed: int, policy: str, workers: int, episodes: int) -> None:
    """``--noise-stream``: one stream, drawn in episode order by one in-process policy."""
    if policy in BUILTIN or policy.startswith(("ws://", "wss://")):
        raise SimError(f"--noise-stream: applies to a policy folder (--policy DIR), not {policy} (a server draws "
                       "its own noise; a scripted policy draws none)")
    check_stream_seed(seed)
    if min(workers, episodes) > 1:
        raise SimError(f"--noise-stream with --workers {workers}: one stream feeds the episodes in their order, "
                       "so it needs one process; expected --workers 1")


def episode_line(i: int, n: int, r: dict[str, Any]) -> str:
    if r["success"]:
        outcome = f"success at step {r['steps_to_success']}"
    else:
        outcome = f"failure (max reward {r['max_reward']:g} in {r['steps']} steps)"
        if r["error"]:
            outcome += f" [{r['error']}]"
    return (
        f"episode {i + 1}/{n} seed {r['seed']}: {outcome} | env {r['env_ms_per_step']} ms/step, "
        f"policy {r['policy_ms_per_call']} ms/chunk x {r['policy_calls']}"
    )


def run_serial(setup: EvalSetup, seeds: list[int], output: Path, on_result) -> dict[str, Any]:
    from dit4dit_npu.sim.rollout import Worker

    worker = Worker(setup)
    try:
        output.mkdir(parents=True, exist_ok=True)  # only once the policy and scene are known good
        if setup.video_dir:
            Path(setup.video_dir).mkdir(exist_ok=True)
        for seed in seeds:
            on_result(worker.run(seed))
        return worker.info
    finally:
        worker.close()


def run_parallel(
    setup: EvalSetup, seeds: list[int], workers: int, output: Path, on_result,
    timeout_s: float = EPISODE_TIMEOUT_S, worker=None,
) -> dict[str, Any]:
    """W spawned processes (a fork would copy MuJoCo's GL context and torch's thread pool), each
    ``worker(setup, seeds, results)`` (default ``rollout.worker_main``; the tests' stand-ins). Every
    wait on them ends: a worker that dies is an error at once, and so is no message within
    ``timeout_s`` (--episode-timeout) of the last one."""
    import multiprocessing as mp

    from dit4dit_npu.sim.rollout import worker_main
    from dit4dit_npu.sim.workers import receive, stop

    ctx = mp.get_context("spawn")
    seed_q, result_q = ctx.Queue(), ctx.Queue()
    procs = [
        ctx.Process(target=worker or worker_main, args=(setup, seed_q, result_q), daemon=True)
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    try:
        info = None
        for _ in procs:  # every worker has built its scene and policy, or one says why it cannot
            info = receive(result_q, procs, "an eval worker's start", timeout_s, key="--episode-timeout")
        output.mkdir(parents=True, exist_ok=True)
        if setup.video_dir:
            Path(setup.video_dir).mkdir(exist_ok=True)
        for s in seeds:
            seed_q.put(s)
        for _ in procs:
            seed_q.put(None)
        for _ in seeds:
            on_result(receive(result_q, procs, "an eval worker's next episode", timeout_s, key="--episode-timeout"))
        for p in procs:  # each has its None; a worker still alive after this is stopped below
            p.join(timeout=60)
        return info
    finally:
        stop(procs)
        # seeds no worker took (an eval ended by an error) would hold the queue's feeder thread, and
        # with it this process's exit, on a pipe nobody reads
        seed_q.cancel_join_thread()


def summarize(
    a: argparse.Namespace, setup: EvalSetup, info: dict, results: list[dict], wall_s: float
) -> dict:
    n = len(results)
    limit = scene_spec(a.task).time_limit
    k = sum(r["success"] for r in results)
    k_limit = sum(r[f"success_within_{limit}"] for r in results)
    steps = sum(r["steps"] for r in results)

    def mean_of(key: str) -> float | None:
        vals = [r[key] for r in results if r[key] is not None]
        return round(sum(vals) / len(vals), 2) if vals else None

    return {
        "task": a.task,
        "policy": a.policy,
        "episodes": n,
        "seeds": [a.seed, a.seed + n - 1],
        "successes": k,
        "success_rate": k / n,
        "wilson95": list(wilson_interval(k, n)),
        f"successes_within_{limit}": k_limit,
        f"wilson95_within_{limit}": list(wilson_interval(k_limit, n)),
        "mean_steps_to_success": mean_of("steps_to_success"),
        "errors": sum(r["error"] is not None for r in results),
        "env_ms_per_step": mean_of("env_ms_per_step"),
        "policy_ms_per_chunk": mean_of("policy_ms_per_call"),
        "policy_ms_per_step": mean_of("policy_ms_per_step"),
        "execution": setup.execution.mode,
        "delay_ms": setup.execution.delay_ms,
        "delay_steps": setup.execution.delay_steps,
        "execution_horizon": info.get("execution_horizon"),
        "boundary_jerk": mean_of("boundary_jerk"),
        "interior_jerk": mean_of("interior_jerk"),
        "total_steps": steps,
        "wall_s": round(wall_s, 1),
        "episodes_per_min": round(60 * n / wall_s, 2),
        "workers": min(a.workers, n),
        "size_hw": list(info["size_hw"]),
        "replan": a.replan,
        "chunk_length": info["metadata"].get("chunk_length"),
        "max_steps": a.max_steps,
        # None: each chunk's noise seeded from its episode's seed; else the one stream's seed
        "noise_stream": setup.noise_stream,
        "mujoco_gl": os.environ.get("MUJOCO_GL"),
    }


def evaluate(a: argparse.Namespace, setup: EvalSetup, on_result) -> dict:
    """Every episode of seeds S..S+N-1 (in this process, or in W workers), then ``results.json``
    in ``a.out``; ``on_result`` sees each episode's result as it arrives. Returns the summary."""
    seeds = list(range(a.seed, a.seed + a.episodes))
    results: list[dict] = []

    def collect(r: dict) -> None:
        results.append(r)
        on_result(len(results) - 1, len(seeds), r)

    t0 = time.perf_counter()
    workers = min(a.workers, a.episodes)
    if workers == 1:
        info = run_serial(setup, seeds, a.out, collect)
    else:
        timeout_s = EPISODE_TIMEOUT_S if a.episode_timeout is None else a.episode_timeout
        info = run_parallel(setup, seeds, workers, a.out, collect, timeout_s)
    wall = time.perf_counter() - t0
    results.sort(key=lambda r: r["seed"])
    summary = summarize(a, setup, info, results, wall)
    atomic_write_json(a.out / "results.json", {"summary": summary, "episodes": results})
    return summary


if __name__ == "__main__":  # python -m dit4dit_npu.sim.eval: the command is sim/cli.py's
    from dit4dit_npu.sim.cli import eval_main

    raise SystemExit(eval_main())
