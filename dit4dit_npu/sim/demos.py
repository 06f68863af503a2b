"""Scripted-expert demonstrations in simulation, written as a LeRobot dataset one episode at a time.

    python -m dit4dit_npu.sim.demos --task transfer_cube --episodes 50 --size 240x320 --out DIR

Each episode: reset the scene with the next training seed, run the task's scripted expert for
``--horizon`` steps, record (three camera images, 14-d state, the expert's 14-d action) at every step, and keep
the episode only if it succeeded (reward 4) - the seeds used are listed in ``meta/sim_demos.json``.
``--workers W`` simulates W seeds at a time in W processes, each with its own scene; this process
writes their episodes in seed order, so the data and videos are those ``--workers 1`` writes, byte
for byte. Memory holds at most W + 2 episodes (276 MB each at 240x320; 50 episodes held together
would need 13.8 GB). Training seeds start at 100000, disjoint from the evaluation
seeds (0, 1, ... by default in ``dit4dit_npu.sim.eval``). The command's flags are ``demos_main`` in
``sim/cli.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from dit4dit_npu.files import atomic_folder
from dit4dit_npu.sim.errors import SimError
from dit4dit_npu.sim.tasks import (
    CAMERAS,
    FPS,
    MOTORS,
    SEED_LIMIT,
    TRAIN_SEED0,
    check_seed_range,
    get_task,
)

# A failing seed is skipped; this many failures in a row means the expert is broken, not unlucky.
MAX_CONSECUTIVE_FAILURES = 10
# A worker's episode (about 15 s at 240x320 here) is late past this: a hung scene, not a slow one.
EPISODE_DEADLINE_S = 900.0


def record_expert_episode(scene, seed: int, horizon: int) -> tuple[dict, int | None]:
    """One expert episode: ({"states", "actions", "frames": {key: (T, H, W, 3)}}, first success step);
    no frames from a scene without rendering."""
    from dit4dit_npu.sim.experts import make_expert

    obs = scene.reset(seed)
    expert = make_expert(scene)
    states, actions = [], []
    frames: dict[str, list] = {k: [] for k in scene.cameras} if scene.renderer is not None else {}
    first_success = None
    for t in range(horizon):
        action = expert(obs)
        states.append(obs["state"])
        actions.append(action)
        for k in frames:
            frames[k].append(obs[k])
        step = scene.step(action)
        if step.success and first_success is None:
            first_success = t + 1  # steps executed when reward 4 was first reached
        obs = step.obs
    episode = {
        "states": np.stack(states).astype(np.float32),
        "actions": np.stack(actions).astype(np.float32),
        "frames": {k: np.stack(v) for k, v in frames.items()},
    }
    return episode, first_success


def _worker_main(task: str, size_hw: tuple[int, int], horizon: int, seeds, results) -> None:
    """Process body (``sim.workers.work``): its own scene, then (seed, episode, first) per seed."""
    from dit4dit_npu.sim.scene import AlohaScene
    from dit4dit_npu.sim.workers import work

    def start():
        scene = AlohaScene(task, size_hw)
        return None, lambda seed: (seed, *record_expert_episode(scene, seed, horizon)), scene.close

    work(start, seeds, results)


@contextmanager
def expert_episodes(
    task: str, size_hw: tuple[int, int], horizon: int, seed0: int, workers: int, worker=_worker_main
) -> Iterator[Iterator[tuple[int, dict, int | None]]]:
    """(seed, episode, first success step) for seed0, seed0 + 1, ... (below SEED_LIMIT), in seed order:
    from this process's scene, or from ``workers`` spawned processes running ``worker`` (a fork would
    copy MuJoCo's GL context), each simulating one seed at a time. At most ``workers`` + 1 seeds are
    out at once, so at most that many episodes are held here; a seed whose episode has not come
    back EPISODE_DEADLINE_S after it became the next one due, or a worker that died, is an error.
    Leaving the block stops the workers."""
    from dit4dit_npu.sim.scene import AlohaScene

    if workers == 1:
        with AlohaScene(task, size_hw) as scene:
            yield ((s, *record_expert_episode(scene, s, horizon)) for s in range(seed0, SEED_LIMIT))
        return

    import multiprocessing as mp

    from dit4dit_npu.sim.workers import receive, stop

    ctx = mp.get_context("spawn")
    seed_q, result_q = ctx.Queue(), ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(task, size_hw, horizon, seed_q, result_q), daemon=True) for _ in range(workers)
    ]
    for p in procs:
        p.start()

    def in_order() -> Iterator[tuple[int, dict, int | None]]:
        start = time.monotonic()
        for _ in procs:  # every worker has built its scene, or one says why it cannot
            receive(result_q, procs, "a demo worker's start", EPISODE_DEADLINE_S, start)
        sent = seed0
        done: dict[int, tuple] = {}  # episodes that came back before the seed due next
        for want in range(seed0, SEED_LIMIT):
            while sent < min(want + workers + 1, SEED_LIMIT):  # a worker never waits for a seed
                seed_q.put(sent)
                sent += 1
            due = time.monotonic()
            while want not in done:
                seed, episode, first = receive(result_q, procs, f"simulating seed {want}", EPISODE_DEADLINE_S, due)
                done[seed] = (episode, first)
            yield (want, *done.pop(want))

    try:
        yield in_order()
    finally:  # the seeds still out are not needed: their episodes are dropped with the workers
        stop(procs)


def write_demos(
    out: Path,
    task: str,
    episodes: int,
    size_hw: tuple[int, int],
    seed0: int = TRAIN_SEED0,
    horizon: int | None = None,
    version: str = "v3.0",
    progress: bool = True,
    workers: int = 1,
) -> dict:
    """Write ``episodes`` successful expert episodes to ``out`` (atomically); returns a summary."""
    from tqdm import tqdm

    from dit4dit_npu.data.writer import DatasetSpec, Episode, LeRobotWriter, aloha_modality
    from dit4dit_npu.sim.experts import EXPERTS

    spec_task = get_task(task)
    if episodes < 1:
        raise SimError(f"--episodes: expected >= 1, got {episodes}")
    if workers < 1:
        raise SimError(f"--workers: expected >= 1, got {workers}")
    check_seed_range(seed0, episodes, low=TRAIN_SEED0)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SimError(f"--out: {out} exists and is not empty; refusing to overwrite a dataset")
    if task not in EXPERTS:
        raise SimError(f"no scripted expert for task {task!r} (available: {sorted(EXPERTS)})")
    horizon = horizon or EXPERTS[task].horizon()  # the expert's schedule ends here
    spec = DatasetSpec(
        fps=FPS,
        tasks=[spec_task.instruction],
        video_keys=list(CAMERAS),
        motors=MOTORS,
        robot_type="aloha",
        extra_meta={"modality.json": aloha_modality(CAMERAS)},
    )
    kept, failed, first_steps = [], [], []
    t0 = time.perf_counter()
    # a reader never sees a half-written dataset
    with atomic_folder(out, replace=False) as tmp:
        with (
            LeRobotWriter(tmp, version, spec) as writer,
            expert_episodes(task, size_hw, horizon, seed0, min(workers, episodes)) as stream,
        ):
            bar = tqdm(total=episodes, desc=f"{task} demos", unit="ep", disable=not progress)
            streak = 0
            for seed, ep, first in stream:
                if first is None:
                    failed.append(seed)
                    streak += 1
                    if streak >= MAX_CONSECUTIVE_FAILURES:
                        raise SimError(
                            f"the {task} expert failed {streak} seeds in a row (last {seed}); not writing"
                        )
                else:
                    streak = 0
                    writer.add_episode(Episode(ep["states"], ep["actions"], task_index=0), ep["frames"])
                    kept.append(seed)
                    first_steps.append(first)
                    bar.update(1)
                    if len(kept) == episodes:
                        break
            else:  # failed seeds pushed the range past the simulator's (nothing is written)
                raise SimError(f"--seed {seed0}: {len(failed)} failed seed(s) took the demos' seeds to 2**32, "
                               "the simulator's limit, before --episodes were kept; start lower")
            bar.close()
            summary = {
                "task": task,
                "instruction": spec_task.instruction,
                "episodes": len(kept),
                "frames_per_episode": horizon,
                "size_hw": list(size_hw),
                "fps": FPS,
                "cameras": CAMERAS,
                "seeds": kept,
                "failed_seeds": failed,
                "first_success_step": {"min": min(first_steps), "max": max(first_steps)},
                "sim_and_write_s": round(time.perf_counter() - t0, 1),
                "workers": min(workers, episodes),
            }
        # Provenance next to lerobot's metadata: which seeds, which expert outcome.
        (tmp / "meta" / "sim_demos.json").write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":  # python -m dit4dit_npu.sim.demos: the command is sim/cli.py's
    from dit4dit_npu.sim.cli import demos_main

    raise SystemExit(demos_main())
