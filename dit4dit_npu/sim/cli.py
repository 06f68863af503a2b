"""The simulation commands: each parses and checks its flags, then calls its library module.

    python -m dit4dit_npu.sim.demos --out DIR ...        demos_main  (dit4dit-sim-demos)
    python -m dit4dit_npu.sim.eval --out DIR ...         eval_main   (dit4dit-sim-eval)

Each library module keeps a two-line ``__main__`` block that calls its command here, so the
``python -m`` spellings keep working; ``train.success_curve`` calls ``eval_main`` in its process, once per checkpoint.
MuJoCo loads only when a command runs (``backend.require_simulator``), after its flags are checked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dit4dit_client import MODES

from dit4dit_npu.console import add_compile_flag, entry_point, former_names, require
from dit4dit_npu.sim import demos
from dit4dit_npu.sim import eval as sim_eval
from dit4dit_npu.sim.backend import require_simulator
from dit4dit_npu.sim.errors import SimError
from dit4dit_npu.sim.policies import BUILTIN
from dit4dit_npu.sim.success_rate import format_rate
from dit4dit_npu.sim.tasks import EPISODE_STEPS, TRAIN_SEED0, get_task, parse_size, scene_spec


@entry_point
def demos_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dit4dit_npu.sim.demos", description=demos.__doc__.splitlines()[0])
    p.add_argument("--task", default="transfer_cube", help="the scene and its scripted expert (default: %(default)s)")
    p.add_argument("--episodes", type=int, default=50, help="how many successful episodes to keep (default: %(default)s)")
    p.add_argument("--size", default="240x320", help="HxW of every camera (RoboTwin: 240x320)")
    p.add_argument("--out", required=True, type=Path, help="new (or empty) folder to write the dataset into")
    p.add_argument("--seed", type=int, default=TRAIN_SEED0, help=f"first training seed (>= {TRAIN_SEED0})")
    p.add_argument(
        "--horizon",
        type=int,
        default=None,
        help="steps per episode (default: the expert's: transfer_cube 320, insertion 300)",
    )
    p.add_argument(
        "--version", default="v3.0", choices=["v2.1", "v3.0"], help="LeRobot format version (default: %(default)s)"
    )
    p.add_argument("--workers", type=int, default=1,
                   help="parallel worker processes (each: a scene), written in seed order: the same dataset")
    a = p.parse_args(argv)
    get_task(a.task)
    size_hw = parse_size(a.size)
    require_simulator()
    s = demos.write_demos(a.out, a.task, a.episodes, size_hw, a.seed, a.horizon, a.version, workers=a.workers)
    print(
        f"wrote {s['episodes']} {a.task} demos ({s['frames_per_episode']} frames, 3 cameras {a.size}, seeds "
        f"{s['seeds'][0]}..{s['seeds'][-1]}, {len(s['failed_seeds'])} failed seed(s) skipped) in "
        f"{s['sim_and_write_s']} s by {s['workers']} worker(s) -> {a.out}"
    )
    return 0


def parse_eval_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dit4dit_npu.sim.eval", description=sim_eval.__doc__.splitlines()[0])
    # what acts: exactly one of a policy folder, a policy server, a scripted policy (console.py: --policy
    # names a policy folder in every command)
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--policy", metavar="DIR", help="a policy folder")
    who.add_argument("--server", metavar="ws://HOST:PORT", help="a policy server (python -m dit4dit_npu.serve)")
    who.add_argument("--scripted", choices=BUILTIN, help="a scripted policy: the demo expert (whole or in chunks), "
                                                          "or hold the start pose")
    p.add_argument(
        "--task", default="transfer_cube",
        help="the scene and its success check: transfer_cube | insertion (ALOHA) | metaworld/<task>, e.g. "
        "metaworld/reach-v3 (Meta-World, as lerobot's env shows it) (default: %(default)s)",
    )
    p.add_argument("--episodes", type=int, default=50, help="how many episodes (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    p.add_argument(
        "--replan", type=int, default=None,
        help="actions executed per query, the execution horizon (default: whole chunk; half of it for the async modes)",
    )
    p.add_argument(
        "--execution", default="sync", choices=MODES,
        help="how chunks are merged while the next is computed: sync (pause), async (switch), ensemble (ACT's "
        "temporal ensembling), rtc (real-time chunking)",
    )
    p.add_argument("--delay-ms", type=float, default=0.0, help="simulated inference delay (default 0)")
    p.add_argument(
        "--size", default=None, help="HxW per camera (default: the policy's training size, else 240x320)"
    )
    p.add_argument(
        "--max-steps", type=int, default=None,
        help=f"episode length (default: ALOHA {EPISODE_STEPS}, ACT's; Meta-World 500, its own limit)",
    )
    p.add_argument("--videos", type=int, default=2, help="mp4s of the first N episodes")
    p.add_argument("--workers", type=int, default=1, help="parallel worker processes (each: scene + policy)")
    p.add_argument(
        "--episode-timeout", type=float, default=None, metavar="S",
        help=f"with --workers > 1: seconds the eval waits for the next episode's result (or for the workers to "
        f"build their scenes and policies) before it stops with one line (default {sim_eval.EPISODE_TIMEOUT_S:.0f})",
    )
    p.add_argument(
        "--noise-stream", type=int, default=None, metavar="SEED",
        help="a policy folder draws every chunk's flow-matching noise from one RNG stream, seeded SEED once before "
        "the policy is built: lerobot-eval's protocol (Meta-World: SEED and --seed = its --seed reproduce its "
        "episodes when it ran with --eval.batch_size=1 on the same device); default: each chunk's noise seeded "
        "from its episode's seed",
    )
    p.add_argument("--connect-timeout", type=float, default=30.0, help="seconds to wait for a ws:// server")
    p.add_argument(
        "--merge-lora", action="store_true", help="fold a LoRA policy folder's adapter into the base transformer at load"
    )
    add_compile_flag(p)
    out = p.add_argument("--out", type=Path, help="folder for results.json and the videos (required)")
    former_names(p, out, "--output")
    args = p.parse_args(argv)
    require(p, args, out)
    if args.max_steps is None:  # the task's own default (an unknown task is one line here)
        args.max_steps = scene_spec(args.task).episode_steps
    args.policy = acting_policy(args)
    return args


def acting_policy(a: argparse.Namespace) -> str:
    """The one spec string the rollout workers build their policy from (``policies.make_policy``):
    a folder, a ws:// address or a scripted name. ``--policy ws://...`` and ``--policy expert`` (the
    spelling before --server and --scripted) keep working, with one notice line."""
    if a.server is not None:
        if not a.server.startswith(("ws://", "wss://")):
            raise SimError(f"--server: expected ws://HOST:PORT, got {a.server!r}")
        return a.server
    if a.scripted is not None:
        return a.scripted
    if a.policy.startswith(("ws://", "wss://")):
        print(f"notice: --policy {a.policy} is deprecated, use --server {a.policy}", file=sys.stderr)
    elif a.policy in BUILTIN:
        print(f"notice: --policy {a.policy} is deprecated, use --scripted {a.policy}", file=sys.stderr)
    return a.policy


def acting_flags(spec: str) -> list[str]:
    """The flags that say ``spec`` (a policy folder, a ws:// address or a scripted name) to this
    command, for callers that take any of the three (bench/sim_eval.py, bench/rtc_sim.py)."""
    if spec.startswith(("ws://", "wss://")):
        return ["--server", spec]
    return ["--scripted", spec] if spec in BUILTIN else ["--policy", spec]


@entry_point
def eval_main(argv: list[str] | None = None) -> int:
    a = parse_eval_args(argv)
    setup = sim_eval.make_setup(a)  # every flag checked (the seed range too) before MuJoCo loads
    spec = scene_spec(a.task)
    require_simulator(spec.simulator)
    if spec.simulator == "ALOHA" and a.seed + a.episodes - 1 >= TRAIN_SEED0:
        print(f"warning: seeds >= {TRAIN_SEED0} are the demo (training) seeds", file=sys.stderr)

    def on_result(i: int, n: int, r: dict) -> None:
        print(sim_eval.episode_line(i, n, r), flush=True)

    summary = sim_eval.evaluate(a, setup, on_result)
    n = summary["episodes"]
    print(f"success {format_rate(summary['successes'], n)}")
    if spec.simulator == "ALOHA":  # a Meta-World episode ends at its env's limit: nothing more to say
        print(
            f"success within {spec.time_limit} steps (gym-aloha's limit): "
            f"{format_rate(summary[f'successes_within_{spec.time_limit}'], n)}"
        )
    if a.execution != "sync" or a.delay_ms:
        print(
            f"{a.execution} execution, {summary['delay_steps']} steps ({a.delay_ms:g} ms) delay: jerk at chunk "
            f"boundaries {summary['boundary_jerk']} rad/s^3, elsewhere {summary['interior_jerk']}"
        )
    print(
        f"env {summary['env_ms_per_step']} ms/step, policy {summary['policy_ms_per_chunk']} ms/chunk, "
        f"{summary['episodes_per_min']} episodes/min with {summary['workers']} worker(s) -> {a.out / 'results.json'}"
    )
    return 0
