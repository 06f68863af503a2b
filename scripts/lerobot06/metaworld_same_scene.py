"""Our sim eval's Meta-World scene against lerobot's env, seed by seed (run in the lerobot 0.6 side venv).

    .lerobot06/venv/bin/python scripts/lerobot06/metaworld_same_scene.py --tasks reach-v3,push-v3 \
        --seeds 1000-1019 --size 128 [--steps 50]

For each task and seed, ``dit4dit_npu.sim.metaworld_scene.MetaworldScene`` (what ``python -m
dit4dit_npu.sim.eval --task metaworld/<task>`` runs) and lerobot's lean env (``--env.type=
metaworld_lean``, what lerobot-eval scored) are reset to the seed and compared: the goal and object
positions the seed drew (Meta-World's rand_vec), the first picture (lerobot's ``pixels``, flipped),
the state (``agent_pos``); then both take the same ``--steps`` seeded random actions and their
pictures, states, rewards and success must stay equal. One PASS/FAIL line per task; the last line
counts the seeds whose scenes were the same. Exit code 1 on any difference.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from lerobot_env_metaworld_lean import LeanMetaworldEnv

from dit4dit_npu.sim.metaworld_scene import MetaworldScene


def seeds_of(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def same_episode(ours: MetaworldScene, theirs: LeanMetaworldEnv, seed: int, steps: int) -> str | None:
    """None when both gave the same scene and episode; else what differed first."""
    mine = ours.reset(seed)
    obs, _ = theirs.reset(seed=seed)
    if not np.array_equal(ours.env._last_rand_vec, theirs._env._last_rand_vec):
        return f"goal/object positions {ours.env._last_rand_vec} vs {theirs._env._last_rand_vec}"
    actions = np.random.default_rng(seed).uniform(-1, 1, (steps, 4)).astype(np.float32)
    for t in range(steps + 1):
        if not np.array_equal(mine["observation.image"], obs["pixels"]):
            diff = np.abs(mine["observation.image"].astype(int) - obs["pixels"].astype(int)).mean()
            return f"step {t}: the picture (mean |difference| {diff:.2f} of 255)"
        if not np.array_equal(mine["state"], obs["agent_pos"].astype(np.float32)):
            return f"step {t}: the state {mine['state']} vs {obs['agent_pos']}"
        if t == steps:
            return None
        step = ours.step(actions[t])
        obs, reward, terminated, _, info = theirs.step(actions[t])
        mine = step.obs
        if step.reward != reward or step.success != info["is_success"]:
            return f"step {t + 1}: reward/success {step.reward}/{step.success} vs {reward}/{info['is_success']}"
        if terminated:  # lerobot's env resets itself after an episode's last step: stop comparing there
            return None
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", required=True, help="comma-separated Meta-World tasks, e.g. reach-v3,push-v3")
    p.add_argument("--seeds", default="1000-1019", help="a seed or a range LO-HI (default: lerobot-eval's 1000-1019)")
    p.add_argument("--size", type=int, default=128, help="image size (default 128)")
    p.add_argument("--steps", type=int, default=50, help="random actions compared after each reset (default 50)")
    a = p.parse_args(argv)
    seeds = seeds_of(a.seeds)
    same = total = 0
    for task in [t.strip() for t in a.tasks.split(",") if t.strip()]:
        ours = MetaworldScene(f"metaworld/{task}", (a.size, a.size))
        theirs = LeanMetaworldEnv(task, image_size=a.size, obs_type="pixels_agent_pos")
        theirs.reset(seed=seeds[0])  # lerobot builds its env at its first reset
        differ = {s: d for s in seeds if (d := same_episode(ours, theirs, s, a.steps)) is not None}
        lit = float(ours.reset(seeds[0])["observation.image"].mean())
        # drop each env before the next GL context is made (metaworld_side.py's make: black frames)
        ours.close()
        theirs.close()
        del ours, theirs
        total += len(seeds)
        same += len(seeds) - len(differ)
        ok = not differ and lit > 20
        first = next(iter(differ.items()), None)
        print(f"{'PASS' if ok else 'FAIL'} {task}: {len(seeds) - len(differ)}/{len(seeds)} seeds the same scene, "
              f"picture, state and {a.steps} random steps (mean brightness {lit:.0f})"
              + (f"; seed {first[0]}: {first[1]}" if first else ""))
    print(f"same scenes: {same}/{total} (task, seed) pairs")
    return 0 if same == total else 1


if __name__ == "__main__":
    sys.exit(main())
