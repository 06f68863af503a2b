"""Replay lerobot-eval's Meta-World episodes in this project's own scene, bit for bit.

    python scripts/metaworld_replay_lerobot.py --policy POLICY_DIR --lerobot LEROBOT_EVAL_DIR \
        --tasks reach-v3,push-v3 [--episodes 5] [--seed 1000]

Our sim eval seeds each chunk's flow-matching noise from the episode's seed by default (a run
repeats itself); lerobot-eval seeds torch's global RNG once (``set_seed(--seed)``, before the
policy is built) and the plugin draws every chunk's noise from that one stream. This script runs
the sim eval's own pieces under lerobot-eval's protocol: ``FolderPolicy`` with ``noise_stream``
(what ``python -m dit4dit_npu.sim.eval --noise-stream SEED`` does: the stream seeded, the policy
built, the episodes of seeds ``--seed`` + i in order), ``MetaworldScene`` and
``rollout.run_episode``, and it sums each episode's rewards, which the eval does not report. Where
everything else is the same, each episode's sum of rewards and success equal lerobot-eval's (its
``eval_info.json``). Each task runs in a fresh process (as each lerobot-eval did): the stream
depends on everything drawn before it. ``--rng-seed S`` seeds the stream with S instead of
``--seed``: the same scenes under another draw of the policy's noise (its episodes are then not
expected to equal lerobot-eval's; the successes are counted).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from dit4dit_npu.console import entry_point
from dit4dit_npu.sim.errors import SimError
from dit4dit_npu.sim.policies import check_stream_seed
from dit4dit_npu.sim.tasks import check_seed_range


class RewardSum:
    """The scene, counting the episode's rewards (lerobot-eval's ``sum_rewards``)."""

    def __init__(self, scene: Any) -> None:
        self.scene, self.total = scene, 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scene, name)

    def reset(self, seed: int) -> dict[str, Any]:
        self.total = 0.0
        return self.scene.reset(seed)

    def step(self, action: Any) -> Any:
        step = self.scene.step(action)
        self.total += step.reward
        return step


def lerobot_metrics(info: Path, episodes: int) -> dict[str, Any]:
    """The metrics of lerobot-eval's ``eval_info.json`` of one task, with at least ``episodes``
    episodes' successes and sums of rewards; else one line naming the file."""
    try:
        metrics = json.loads(info.read_text())["per_task"][0]["metrics"]
        counts = {len(metrics["successes"]), len(metrics["sum_rewards"])}
    except (OSError, ValueError, LookupError, TypeError) as e:
        raise SimError(f"--lerobot: {info}: expected lerobot-eval's eval_info.json of one task "
                       f"({type(e).__name__}: {e})") from None
    if min(counts) < episodes:
        raise SimError(f"--episodes {episodes}: {info} holds {min(counts)} episode(s)")
    return metrics


def one_task(policy_dir: str, info: Path, task: str, episodes: int, seed0: int, rng_seed: int) -> int:
    from dit4dit_npu.sim.metaworld_scene import MetaworldScene
    from dit4dit_npu.sim.policies import FolderPolicy
    from dit4dit_npu.sim.rollout import run_episode

    policy = FolderPolicy(policy_dir, noise_stream=rng_seed)  # the sim eval's --noise-stream
    theirs = lerobot_metrics(info, episodes)
    size = tuple(policy.metadata["source_image_sizes"][policy.metadata["camera_keys"][0]][0])
    same = wins = 0
    with MetaworldScene(f"metaworld/{task}", size) as scene:
        counted = RewardSum(scene)
        for i in range(episodes):
            r = run_episode(counted, policy, seed0 + i, 500, None)
            eq = r["success"] == theirs["successes"][i] and abs(counted.total - theirs["sum_rewards"][i]) < 1e-6
            same += eq
            wins += r["success"]
            print(f"{task} seed {seed0 + i}: here {'success' if r['success'] else 'failure'}, sum of rewards "
                  f"{counted.total:.6f}; lerobot-eval {'success' if theirs['successes'][i] else 'failure'}, "
                  f"{theirs['sum_rewards'][i]:.6f}{'' if eq else '  DIFFERENT'}", flush=True)
    print(f"{task}: {same}/{episodes} episodes the same as lerobot-eval's; success {wins}/{episodes} here, "
          f"{sum(theirs['successes'][:episodes])}/{episodes} there (stream seeded {rng_seed})")
    return 0 if same == episodes or rng_seed != seed0 else 1


@entry_point
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", required=True, help="the policy folder lerobot-eval scored")
    p.add_argument("--lerobot", type=Path, required=True, help="folder of lerobot-eval's <task>/eval_info.json")
    p.add_argument("--tasks", required=True, help="comma-separated Meta-World tasks")
    p.add_argument("--episodes", type=int, default=5, help="the first N episodes of each (default 5)")
    p.add_argument("--seed", type=int, default=1000, help="lerobot-eval's --seed (default 1000)")
    p.add_argument("--rng-seed", type=int, default=None, help="seed of the noise stream (default: --seed, lerobot-eval's)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # the child process of one task
    a = p.parse_args(argv)
    rng_seed = a.seed if a.rng_seed is None else a.rng_seed
    if a.one:
        return one_task(a.policy, a.lerobot / a.one / "eval_info.json", a.one, a.episodes, a.seed, rng_seed)
    # every argument checked here, in one line each, before a child loads the policy
    if a.episodes < 1:
        raise SimError(f"--episodes: expected >= 1, got {a.episodes}")
    check_seed_range(a.seed, a.episodes)
    check_stream_seed(rng_seed, "--rng-seed")
    if not Path(a.policy).is_dir():
        raise SimError(f"--policy: {a.policy!r} is not a policy folder")
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    if not tasks:
        raise SimError(f"--tasks {a.tasks!r}: expected comma-separated Meta-World tasks, e.g. reach-v3,push-v3")
    for task in tasks:
        lerobot_metrics(a.lerobot / task / "eval_info.json", a.episodes)
    fails = 0
    for task in tasks:
        args = ["--policy", a.policy, "--lerobot", str(a.lerobot), "--tasks", task, "--episodes", str(a.episodes),
                "--seed", str(a.seed), "--rng-seed", str(rng_seed), "--one", task]
        fails += subprocess.run([sys.executable, os.path.abspath(__file__), *args]).returncode != 0
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
