"""Cost of closed-loop simulation: env ms/step, policy ms/chunk, eval episodes/min (1 vs all workers).

    python bench/sim_eval.py [--policy expert|POLICY_DIR|ws://...] [--episodes 8] [--size 240x320]
    python bench/sim_eval.py --smoke   # seconds: 2 episodes of 10 steps at 32x40, 2 workers

1. Env step at 240x320 with three cameras (physics + our renderer: one context, no shadows, no
   MSAA), physics alone, and - for comparison - the stock ``gym_aloha`` env step, which renders
   three 480x640 views with shadow maps and 4x MSAA whatever observation size is asked for.
2. Policy ms per chunk on scene observations (a policy folder: its predict_action; the expert: one
   IK action).
3. ``python -m dit4dit_npu.sim.eval`` on the same seeds with 1 worker and with one worker per core,
   wall clock including worker start-up; episodes/min of each.

The last line is ``speedup: X.XX`` = episodes/min with all workers / with 1 worker.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from dit4dit_npu.console import run
from dit4dit_npu.sim.cli import acting_flags, eval_main
from dit4dit_npu.sim.scene import AlohaScene
from dit4dit_npu.sim.tasks import get_task, parse_size


def ms_per_step(scene: AlohaScene, steps: int, seed: int = 0) -> float:
    """Median ms of one step, holding the start pose (the cost does not depend on the action)."""
    obs = scene.reset(seed)
    hold = obs["state"].copy()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        scene.step(hold)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def stock_gym_ms_per_step(task: str, steps: int) -> float:
    import gym_aloha  # noqa: F401  (registers the envs)
    import gymnasium as gym

    env = gym.make(get_task(task).gym_id, obs_type="pixels_agent_pos")
    obs, _ = env.reset(seed=0)
    hold = obs["agent_pos"].astype(np.float32)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        env.step(hold)
        times.append(time.perf_counter() - t0)
    env.close()
    return 1000 * statistics.median(times)


def policy_ms_per_chunk(spec: str, size_hw: tuple[int, int], calls: int) -> tuple[float, int | None]:
    from dit4dit_npu.sim.policies import make_policy

    policy = make_policy(spec)
    with AlohaScene("transfer_cube", size_hw) as scene:
        obs = scene.reset(0)
        policy.reset(scene, 0)
        policy.act(obs)  # warm-up (lazy init, first-call allocations)
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            chunk = policy.act(obs)
            times.append(time.perf_counter() - t0)
    policy.close()
    return 1000 * statistics.median(times), len(chunk)


def eval_rate(spec: str, episodes: int, workers: int, size: str, root: Path, max_steps: int | None = None) -> dict:
    out = root / f"w{workers}"
    args = [
        *acting_flags(spec),
        "--episodes",
        str(episodes),
        "--workers",
        str(workers),
        "--size",
        size,
        "--videos",
        "0",
        "--out",
        str(out),
        *(["--max-steps", str(max_steps)] if max_steps else []),
    ]
    if eval_main(args) != 0:
        raise SystemExit(f"eval failed: {args}")
    return json.loads((out / "results.json").read_text())["summary"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", default="expert")
    p.add_argument("--episodes", type=int, default=8, help="episodes per eval run")
    p.add_argument("--size", default="240x320")
    p.add_argument("--steps", type=int, default=100, help="timed env steps")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="'all workers' count")
    p.add_argument("--smoke", action="store_true", help="a seconds-long run at tiny sizes (overrides the size options): checks that the bench works; its numbers mean nothing")
    a = p.parse_args()
    calls, max_steps = 20, None  # policy calls timed; eval episode length (None: the task's)
    if a.smoke:
        a.episodes, a.size, a.steps, a.workers, calls, max_steps = 2, "32x40", 5, 2, 2, 10
    size_hw = parse_size(a.size)

    with AlohaScene("transfer_cube", size_hw) as scene:
        env_ms = ms_per_step(scene, a.steps)
    with AlohaScene("transfer_cube", render=False) as scene:
        physics_ms = ms_per_step(scene, a.steps)
    stock_ms = stock_gym_ms_per_step("transfer_cube", max(5, a.steps // 10))
    print(
        f"env step, physics + 3 cameras at {a.size}: {env_ms:.2f} ms  (physics alone {physics_ms:.2f} ms; "
        f"stock gym-aloha step {stock_ms:.1f} ms = {stock_ms / env_ms:.1f}x)"
    )

    pol_ms, chunk = policy_ms_per_chunk(a.policy, size_hw, calls)
    print(f"policy {a.policy}: {pol_ms:.2f} ms per chunk of {chunk} action(s)")

    with tempfile.TemporaryDirectory(prefix="sim_eval_bench_") as tmp:
        one = eval_rate(a.policy, a.episodes, 1, a.size, Path(tmp), max_steps)
        many = eval_rate(a.policy, a.episodes, a.workers, a.size, Path(tmp), max_steps)
    for s in (one, many):
        print(
            f"eval with {s['workers']} worker(s): {s['episodes_per_min']:.2f} episodes/min "
            f"({s['episodes']} episodes, {s['total_steps']} steps, {s['wall_s']} s wall, "
            f"success {s['successes']}/{s['episodes']})"
        )
    print(f"speedup: {many['episodes_per_min'] / one['episodes_per_min']:.2f}")


if __name__ == "__main__":
    raise SystemExit(run(main))  # user errors: one line, exit code 2 (dit4dit_npu.console)
