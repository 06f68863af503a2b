"""Meta-World through lerobot 0.6's own ``MetaworldEnv`` (runs in the lerobot 0.6 side venv).

    python metaworld_side.py cost --tasks reach-v3,push-v3 --episodes 3 [--size 480x480,128x128]
    python metaworld_side.py demos --tasks reach-v3 --episodes 1 --size 128x128 --out DIR

``cost``: what an episode costs here: a physics step (with the scripted expert's action), a
render of lerobot's camera at each size (lerobot-eval renders 480x480), and the metaworld
package's scripted expert's own success on each task (``--episodes`` seeds, at most 500 steps: the
env's limit, which lerobot-eval keeps). ``demos``: the expert's episodes as a LeRobot v3.0
dataset written by dit4dit-npu's writer, each episode with its task's lerobot description as
instruction, observations exactly as lerobot-eval gives a policy (its camera, flipped as it flips
it; ``agent_pos``, the first 4 numbers of the raw observation) and resized to ``--size``.

The expert reads the raw 39-d observation, which lerobot's env does not return: the episode steps
lerobot's underlying metaworld env (``env._env``, built and seeded by lerobot's own code) and
renders through lerobot's ``render()``. Every line printed is ``PASS ...`` or ``FAIL ...`` (plus
notes); the exit code is the number of FAILs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from lerobot.envs.metaworld import TASK_DESCRIPTIONS, MetaworldEnv
from PIL import Image

MAX_STEPS = 500  # MetaworldEnv._max_episode_steps: the metaworld env's own max_path_length


def make(task: str) -> MetaworldEnv:
    env = MetaworldEnv(task=task, obs_type="pixels_agent_pos")
    env.reset(seed=0)  # builds the metaworld env lerobot's way (camera position, seeded resets)
    return env


def expert_episode(env: MetaworldEnv, seed: int, render_size: tuple[int, int] | None = None):
    """One expert episode: (success, steps, seconds stepping, seconds rendering, frames, states, actions)."""
    raw_env = env._env
    raw_env.seed(seed)
    raw, _ = raw_env.reset(seed=seed)
    frames, states, actions = [], [], []
    t_step = t_render = 0.0
    success = False
    for _ in range(MAX_STEPS):
        if render_size is not None:
            t0 = time.perf_counter()
            image = env.render()  # lerobot's observation image (flipped for corner2)
            t_render += time.perf_counter() - t0
            if image.shape[:2] != render_size:
                image = np.asarray(Image.fromarray(np.ascontiguousarray(image)).resize(render_size[::-1], Image.BILINEAR))
            frames.append(image)
        t0 = time.perf_counter()
        action = np.clip(env.expert_policy.get_action(raw), -1.0, 1.0).astype(np.float32)
        states.append(raw[:4].astype(np.float32))  # lerobot's agent_pos
        actions.append(action)
        raw, _, _, truncated, info = raw_env.step(action)
        t_step += time.perf_counter() - t0
        if info.get("success", 0):
            success = True
            break
        if truncated:
            break
    return success, len(actions), t_step, t_render, frames, np.stack(states), np.stack(actions)


def render_cost(task: str, size: tuple[int, int], n: int = 20) -> tuple[float, float]:
    """Milliseconds per step (a physics step and a render of lerobot's camera setup at ``size``):
    as lerobot's env renders (the scene's three lights with 4096-px shadow maps, 4x MSAA), and with
    one ``mujoco.Renderer`` with shadows off (what a policy needs; lerobot's env has no such option)."""
    import metaworld
    import mujoco

    name = task.replace("metaworld-", "")
    mt1 = metaworld.MT1(name, seed=42)
    env = mt1.train_classes[name](render_mode="rgb_array", camera_name="corner2", width=size[1], height=size[0])
    env.set_task(mt1.train_tasks[0])
    env.model.cam_pos[2] = [0.75, 0.075, 0.7]  # lerobot's corner2 position
    env.reset()
    plain = mujoco.Renderer(env.model, size[0], size[1])

    def lean() -> None:
        plain.update_scene(env.data, camera="corner2")
        plain.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False
        plain.render()

    out = []
    for render in (env.render, lean):
        render()  # the first render creates the GL context
        t0 = time.perf_counter()
        for _ in range(n):
            env.step(np.zeros(4, np.float32))
            render()
        out.append((time.perf_counter() - t0) / n * 1e3)
    plain.close()
    env.close()
    return out[0], out[1]


def parse_size(text: str) -> tuple[int, int]:
    h, w = text.lower().split("x")
    return int(h), int(w)


def cost(tasks: list[str], episodes: int, sizes: list[tuple[int, int]]) -> int:
    fails = 0
    for size in sizes:
        ms, lean = render_cost(tasks[0], size)
        print(f"PASS Meta-World render + physics step ({tasks[0]}, corner2, {size[0]}x{size[1]}): {ms:.1f} ms as lerobot's "
              f"env renders, {lean:.1f} ms with shadows off")
    for task in tasks:
        env = make(task)
        results = [expert_episode(env, seed) for seed in range(episodes)]
        env.close()
        ok = sum(r[0] for r in results)
        steps = [r[1] for r in results]
        ms = 1e3 * sum(r[2] for r in results) / sum(steps)
        line = (f"Meta-World expert {task}: {ok}/{episodes} successes (seeds 0-{episodes - 1}), episode lengths "
                f"{steps}, {ms:.2f} ms per physics step + expert action")
        print(("PASS " if ok else "FAIL ") + line)
        fails += not ok
    return fails


def demos(tasks: list[str], episodes: int, size: tuple[int, int], out: Path) -> int:
    from dit4dit_npu.data.writer import DatasetSpec, Episode, LeRobotWriter

    instructions = [TASK_DESCRIPTIONS[t.replace("metaworld-", "")] for t in tasks]
    spec = DatasetSpec(fps=MetaworldEnv.metadata["render_fps"], tasks=instructions, video_keys=["observation.image"],
                       motors=["hand_x", "hand_y", "hand_z", "gripper"], robot_type="sawyer")
    written, failed = [], 0
    with LeRobotWriter(out, "v3.0", spec) as writer:
        for task_index, task in enumerate(tasks):
            env = make(task)
            for seed in range(episodes):
                success, n, _, _, frames, states, actions = expert_episode(env, seed, render_size=size)
                if not success:  # a failed demonstration teaches failing: left out, and said
                    failed += 1
                    continue
                writer.add_episode(Episode(states, actions, task_index), {"observation.image": np.stack(frames)})
                written.append(n)
            env.close()
    if not written:
        print(f"FAIL Meta-World demos: the expert succeeded in none of {episodes} episode(s) of {tasks}")
        return 1
    print(f"PASS Meta-World demos: {len(written)} expert episode(s) of {tasks} ({failed} failed, left out), lengths "
          f"{written}, {size[0]}x{size[1]}, written by our LeRobot writer to {out} with instructions {instructions}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["cost", "demos"])
    p.add_argument("--tasks", required=True, help="comma-separated Meta-World task names (lerobot's, e.g. reach-v3)")
    p.add_argument("--episodes", type=int, default=3, help="episodes (seeds 0..N-1) per task")
    p.add_argument("--size", default="480x480", help="HxW (demos: the frames written; cost: comma-separated render sizes)")
    p.add_argument("--out", type=Path, help="demos: the dataset folder to write (must not exist)")
    args = p.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.command == "cost":
        return cost(tasks, args.episodes, [parse_size(s) for s in args.size.split(",")])
    if args.out is None:
        p.error("demos needs --out")
    return demos(tasks, args.episodes, parse_size(args.size), args.out)


if __name__ == "__main__":
    sys.exit(main())
