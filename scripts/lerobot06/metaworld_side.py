"""Meta-World through lerobot 0.6's own ``MetaworldEnv`` (runs in the lerobot 0.6 side venv).

    python metaworld_side.py cost --tasks reach-v3,push-v3 --episodes 3 [--size 480x480,128x128]
    python metaworld_side.py demos --tasks easy --episodes 10 --size 128x128 --out DIR [--stock]
    python metaworld_side.py lean --tasks reach-v3
    python metaworld_side.py score OUT/eval_info.json [...]
    python metaworld_side.py tasks --tasks easy

``--tasks``: comma-separated Meta-World task names (lerobot's, e.g. reach-v3) or lerobot's
difficulty groups (easy, medium, hard, very_hard), as ``lerobot-eval --env.task`` takes them.
``cost``: what an episode costs here: a physics step (with the scripted expert's action), a
render of lerobot's camera at each size (lerobot-eval renders 480x480), the step of the lean env
(``--env.type=metaworld_lean``: lerobot's env rendering 128x128, no shadows, no multisampling),
and the metaworld package's scripted expert's own success on each task (``--episodes`` seeds, at
most 500 steps: the env's limit, which lerobot-eval keeps). ``demos``: the expert's episodes as a
LeRobot v3.0 dataset written by dit4dit-npu's writer, each episode with its task's lerobot
description as instruction, observations exactly as lerobot-eval gives a policy in the lean env at
``--size`` (its camera, flipped as lerobot flips it; ``agent_pos``, the first 4 numbers of the raw
observation); ``--stock``: rendered by lerobot's stock env at 480x480 with shadows and resized
(what ``--env.type=metaworld`` shows a policy, resized). ``lean``: the lean env checked against
the stock one. ``score``: the success per task of lerobot-eval runs, from their eval_info.json,
with 95% Wilson intervals, and the average over the tasks. ``tasks``: each task of ``--tasks``
(groups expanded), one line each: its name and its lerobot description.

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
from lerobot.envs.metaworld import DIFFICULTY_TO_TASKS, TASK_DESCRIPTIONS, MetaworldEnv
from PIL import Image

MAX_STEPS = 500  # MetaworldEnv._max_episode_steps: the metaworld env's own max_path_length


def make(task: str, lean_size: int | None = None) -> MetaworldEnv:
    """lerobot's stock env, or with ``lean_size`` the lean env rendering lean_size x lean_size.

    Close an env *and drop it* (``del``) before making the next one: an env object freed while a
    newer one's GL context is current frees that context's framebuffers (the two contexts number
    their objects alike), and the newer env renders black frames from then on (measured: the second
    task of a ``demos`` run was all zeros)."""
    if lean_size is None:
        env = MetaworldEnv(task=task, obs_type="pixels_agent_pos")
    else:  # imported here, not at the top: `lean` checks that lerobot's plugin discovery imports it
        from lerobot_env_metaworld_lean import LeanMetaworldEnv

        env = LeanMetaworldEnv(task, image_size=lean_size, obs_type="pixels_agent_pos")
    env.reset(seed=0)  # builds the metaworld env lerobot's way (camera position, seeded resets)
    return env


def expand(tasks: str) -> list[str]:
    """Task names, each group name (lerobot's difficulty groups) replaced by its tasks, in order."""
    out = []
    for name in [t.strip() for t in tasks.split(",") if t.strip()]:
        for task in DIFFICULTY_TO_TASKS.get(name, [name]):
            task = task.replace("metaworld-", "")
            if task not in TASK_DESCRIPTIONS:
                sys.exit(f"error: --tasks: unknown Meta-World task or group {name!r} (lerobot knows "
                         f"{', '.join(DIFFICULTY_TO_TASKS)} and {len(TASK_DESCRIPTIONS)} task names, e.g. reach-v3)")
            if task not in out:
                out.append(task)
    return out


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


def render_cost(task: str, size: tuple[int, int], n: int = 20) -> tuple[float, float, float]:
    """Milliseconds per step (a physics step and a render of lerobot's camera setup at ``size``):
    as lerobot's env renders (the scene's three lights with 4096-px shadow maps, 4x MSAA), with
    one ``mujoco.Renderer`` with shadows off, and a step of the lean env at 128x128 (lerobot's env's
    step, its observation included)."""
    import metaworld
    import mujoco

    name = task.replace("metaworld-", "")
    lean_env = make(name, lean_size=128)  # --env.type=metaworld_lean, as lerobot-eval steps it
    lean_env.step(np.zeros(4, np.float32))  # the first render creates the GL context
    out = []
    t0 = time.perf_counter()
    for _ in range(n):
        lean_env.step(np.zeros(4, np.float32))
    out.append((time.perf_counter() - t0) / n * 1e3)
    lean_env.close()
    del lean_env  # before the next GL context (make's docstring)
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

    for render in (env.render, lean):
        render()  # the first render creates the GL context
        t0 = time.perf_counter()
        for _ in range(n):
            env.step(np.zeros(4, np.float32))
            render()
        out.append((time.perf_counter() - t0) / n * 1e3)
    plain.close()
    env.close()
    return out[1], out[2], out[0]


def parse_size(text: str) -> tuple[int, int]:
    h, w = text.lower().split("x")
    return int(h), int(w)


def cost(tasks: list[str], episodes: int, sizes: list[tuple[int, int]]) -> int:
    fails = 0
    for size in sizes:
        ms, lean, lean_env = render_cost(tasks[0], size)
        print(f"PASS Meta-World render + physics step ({tasks[0]}, corner2, {size[0]}x{size[1]}): {ms:.1f} ms as lerobot's "
              f"env renders, {lean:.1f} ms with shadows off; a step of --env.type=metaworld_lean at 128x128 {lean_env:.1f} ms")
    for task in tasks:
        env = make(task)
        results = [expert_episode(env, seed) for seed in range(episodes)]
        env.close()
        del env  # before the next GL context (make's docstring)
        ok = sum(r[0] for r in results)
        steps = [r[1] for r in results]
        ms = 1e3 * sum(r[2] for r in results) / sum(steps)
        line = (f"Meta-World expert {task}: {ok}/{episodes} successes (seeds 0-{episodes - 1}), episode lengths "
                f"{steps}, {ms:.2f} ms per physics step + expert action")
        print(("PASS " if ok else "FAIL ") + line)
        fails += not ok
    return fails


def demos(tasks: list[str], episodes: int, size: tuple[int, int], out: Path, stock: bool) -> int:
    from dit4dit_npu.data.writer import DatasetSpec, Episode, LeRobotWriter

    instructions = [TASK_DESCRIPTIONS[t.replace("metaworld-", "")] for t in tasks]
    spec = DatasetSpec(fps=MetaworldEnv.metadata["render_fps"], tasks=instructions, video_keys=["observation.image"],
                       motors=["hand_x", "hand_y", "hand_z", "gripper"], robot_type="sawyer")
    written, failed = [], 0
    with LeRobotWriter(out, "v3.0", spec) as writer:
        for task_index, task in enumerate(tasks):
            env = make(task, lean_size=None if stock else size[0])
            for seed in range(episodes):
                success, n, _, _, frames, states, actions = expert_episode(env, seed, render_size=size)
                if not success:  # a failed demonstration teaches failing: left out, and said
                    failed += 1
                    continue
                if max(f.max() for f in frames) == 0:  # a lost GL context renders zeros, silently
                    print(f"FAIL Meta-World demos: {task} seed {seed}: every frame is black (the renderer's GL context)")
                    raise SystemExit(1)  # an exception: the writer leaves no finished (readable) dataset behind
                writer.add_episode(Episode(states, actions, task_index), {"observation.image": np.stack(frames)})
                written.append(n)
            env.close()
            del env  # before the next GL context (make's docstring)
    if not written:
        print(f"FAIL Meta-World demos: the expert succeeded in none of {episodes} episode(s) of {tasks}")
        return 1
    how = "lerobot's stock env at 480x480, resized" if stock else "--env.type=metaworld_lean"
    print(f"PASS Meta-World demos: {len(written)} expert episode(s) of {len(tasks)} task(s) ({failed} failed, left out), "
          f"{sum(written)} frames, {size[0]}x{size[1]} ({how}), written by our LeRobot writer to {out}; instructions "
          f"{instructions[:3]}{' ...' if len(instructions) > 3 else ''}")
    return 0


def task_of(group: str, tid: int) -> str:
    """The task lerobot-eval's (task_group, task_id) names: a group's tid-th task, or the task itself."""
    if group in DIFFICULTY_TO_TASKS:
        names = DIFFICULTY_TO_TASKS[group]
        if not isinstance(tid, int) or not 0 <= tid < len(names):
            raise IndexError(f"task_id {tid!r} of group {group!r} (it has {len(names)} tasks)")
        return names[tid].replace("metaworld-", "")
    if group not in TASK_DESCRIPTIONS:
        raise KeyError(f"task_group {group!r} is neither a Meta-World task nor a group")
    return group


def score(infos: list[Path]) -> int:
    """Per-task success of lerobot-eval runs (their eval_info.json), with Wilson intervals, and the
    average over the tasks: lerobot's own record of each episode, nothing re-judged here."""
    import json

    from dit4dit_npu.sim.success_rate import format_rate

    per_task: dict[str, list[bool]] = {}
    for path in infos:
        try:
            entries = json.loads(path.read_text())["per_task"]
            tasks = [task_of(e["task_group"], e["task_id"]) for e in entries]
            successes = [e["metrics"]["successes"] for e in entries]
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            print(f"FAIL score: {path}: expected lerobot-eval's eval_info.json, its per_task list with each task's "
                  f"successes ({type(e).__name__}: {e})")
            return 1
        for task, flags in zip(tasks, successes):
            if not isinstance(flags, list) or not flags or not all(isinstance(x, bool) for x in flags):
                print(f"FAIL score: {path}: {task}'s successes: expected a non-empty list of true/false, got {flags!r:.80}")
                return 1
            if task in per_task:  # two runs of one task: a changed split of the work, not more episodes
                print(f"FAIL score: {task} is in two of the files given ({path} and an earlier one): score each task once")
                return 1
            per_task[task] = flags
    if not per_task:
        print(f"FAIL score: no task in {[str(p) for p in infos]}")
        return 1
    for task, successes in per_task.items():
        print(f"{task}: success {format_rate(sum(successes), len(successes))}")
    rates = [sum(v) / len(v) for v in per_task.values()]
    ok, n = sum(sum(v) for v in per_task.values()), sum(len(v) for v in per_task.values())
    print(f"average over {len(per_task)} task(s): {100 * sum(rates) / len(rates):.1f}% (all episodes: {format_rate(ok, n)})")
    return 0


def same_vector_envs(cls: type, task: str) -> tuple[bool, str]:
    """The lean config's ``create_envs`` against lerobot's Meta-World config's, for a difficulty group
    and a task, sync and async, 1 and 2 envs: the same groups, task indices, vector classes (async:
    lerobot's lazy wrapper, which starts one task's workers at a time and freezes a finished sub-env)
    and sizes. Nothing is stepped: the lazy wrapper makes no worker until its first reset."""
    from lerobot.envs.configs import MetaworldEnv as StockConfig

    def layout(envs: dict) -> dict:
        return {g: {i: (type(v).__name__, v.num_envs) for i, v in d.items()} for g, d in envs.items()}

    spec = f"easy,{task}"
    for n_envs, use_async in ((1, True), (2, False), (2, True)):
        stock = layout(StockConfig(task=spec).create_envs(n_envs, use_async))
        lean = layout(cls(task=spec).create_envs(n_envs, use_async))
        if lean != stock:
            return False, (f"--env.task={spec}, {n_envs} env(s), async={use_async}: the lean config built "
                           f"{lean}, lerobot's Meta-World config {stock}")
    kinds = sorted({k for d in lean.values() for k, _ in d.values()})  # the last layout's: 2 envs, async
    return True, (f"--env.task={spec} through create_envs (1 and 2 envs, sync and async): the groups, task indices and "
                  f"vector classes of lerobot's Meta-World config ({len(lean['easy'])} easy tasks; 2 async envs: "
                  f"{', '.join(kinds)})")


def lean(task: str, seed: int = 3) -> int:
    """The lean env against lerobot's stock one: registered by lerobot's plugin discovery, its vector
    envs built as lerobot's Meta-World config builds them, sized by its config as lerobot-eval builds
    it, and different only in the picture: the same seed and the
    same (expert) actions give the same states, rewards and success in both."""
    from lerobot.envs.configs import EnvConfig
    from lerobot.utils.import_utils import register_third_party_plugins

    fails = 0

    def say(ok: bool, line: str) -> None:
        nonlocal fails
        print(("PASS " if ok else "FAIL ") + line)
        fails += not ok

    before = "lerobot_env_metaworld_lean" in sys.modules  # imported already, the check below would prove nothing
    register_third_party_plugins()
    cls = EnvConfig.get_choice_class("metaworld_lean") if "metaworld_lean" in EnvConfig.get_known_choices() else None
    say(cls is not None and not before, "lerobot's plugin discovery registers --env.type=metaworld_lean"
                                        + (" (FAIL: imported before the discovery ran)" if before else ""))
    if cls is None:
        return fails
    say(*same_vector_envs(cls, task))
    cfg = cls(task=task, image_size=96)
    vec = cfg.create_envs(n_envs=1)[task][0]
    obs, _ = vec.reset(seed=[1000])
    shape = tuple(obs["pixels"].shape)
    say(shape == (1, 96, 96, 3) and cfg.features["pixels/top"].shape == (96, 96, 3),
        f"--env.image_size=96 through lerobot's create_envs: observation {shape}, feature {cfg.features['pixels/top'].shape}")
    vec.close()
    del vec  # before the next GL context (make's docstring)
    try:
        cls(task=task, image_size=8)
        say(False, "--env.image_size=8 was accepted")
    except ValueError as e:
        say(str(e).startswith("--env.image_size: expected 16..480"), f"--env.image_size=8 refused: {e}")
    expert = make(task)
    actions = expert_episode(expert, seed)[6]  # the scripted expert's actions on this seed (it reads the raw state)
    expert.close()
    del expert  # before the next GL context (make's docstring)
    runs = {}
    for name, size in (("stock", None), ("lean", 128)):
        env = make(task, lean_size=size)
        obs, _ = env.reset(seed=seed)  # then lerobot's own step, as lerobot-eval calls it
        states, rewards, images, done_at = [obs["agent_pos"].copy()], [], [obs["pixels"]], None
        for i, action in enumerate(actions):
            obs, reward, terminated, _, info = env.step(action)
            if terminated:  # lerobot's env resets itself after the step that ends an episode
                done_at = (i, info["is_success"])
                break
            states.append(obs["agent_pos"].copy())
            rewards.append(reward)
            images.append(obs["pixels"])
        env.close()
        del env  # before the next GL context (make's docstring)
        runs[name] = (np.stack(states), np.array(rewards), images, done_at)
    (s0, r0, i0, d0), (s1, r1, i1, d1) = runs["stock"], runs["lean"]
    same = s0.shape == s1.shape and np.array_equal(s0, s1) and np.array_equal(r0, r1) and d0 == d1
    say(same, f"{task} seed {seed}, the expert's actions: the same {len(s0)} states, rewards and end ({d0}) in the "
              f"stock env and the lean one" + ("" if same else f" (lean: {len(s1)} states, end {d1})"))
    small = [np.asarray(Image.fromarray(np.ascontiguousarray(im)).resize((128, 128), Image.BILINEAR)) for im in i0]
    diff = float(np.mean([np.abs(a.astype(np.float32) - b.astype(np.float32)).mean() for a, b in zip(small, i1)]))
    lit = min(float(np.mean(i0)), float(np.mean(i1)))
    say(lit > 20 and diff < 40, f"the pictures differ only in shading: mean |stock 480x480 resized to 128 - lean 128| = "
                                f"{diff:.1f} of 255 (shadows, multisampling), mean brightness >= {lit:.0f}")
    return fails


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["cost", "demos", "lean", "score", "tasks"])
    p.add_argument("infos", nargs="*", type=Path, help="score: lerobot-eval's eval_info.json files")
    p.add_argument("--tasks",
                   help="comma-separated Meta-World task names (lerobot's, e.g. reach-v3) or difficulty groups (easy, ...)")
    p.add_argument("--episodes", type=int, default=3, help="episodes (seeds 0..N-1) per task")
    p.add_argument("--size", default="480x480", help="HxW (demos: the frames written; cost: comma-separated render sizes)")
    p.add_argument("--out", type=Path, help="demos: the dataset folder to write (must not exist)")
    p.add_argument("--stock", action="store_true",
                   help="demos: render with lerobot's stock env (480x480, shadows) and resize, not the lean env")
    args = p.parse_args(argv)
    if args.command == "score":
        if args.tasks or not args.infos:
            p.error("score takes eval_info.json files, no --tasks")
        return score(args.infos)
    if args.infos:
        p.error(f"{args.command} takes no files (only score does)")
    if not args.tasks:
        p.error(f"{args.command} needs --tasks")
    tasks = expand(args.tasks)
    if args.command == "tasks":  # for scripts: one line per task, its name and its description
        print("\n".join(f"{t} {TASK_DESCRIPTIONS[t]}" for t in tasks))
        return 0
    if args.command == "lean":
        return lean(tasks[0])
    if args.command == "cost":
        return cost(tasks, args.episodes, [parse_size(s) for s in args.size.split(",")])
    if args.out is None:
        p.error("demos needs --out")
    size = parse_size(args.size)
    if not args.stock and size[0] != size[1]:
        p.error(f"--size {args.size}: the lean env renders square images (lerobot's camera): expected e.g. 128x128")
    return demos(tasks, args.episodes, size, args.out, args.stock)


if __name__ == "__main__":
    sys.exit(main())
