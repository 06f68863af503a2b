"""Replay check: a policy trained on a handful of expert demos must redo them in closed loop.

    python bench/sim_replay.py [--episodes 5] [--steps 15000] [--size 240x320] [--out runs/sim_replay]
    python bench/sim_replay.py --ground-truth-only      # steps 1-2 only (a minute): data and timing
    python bench/sim_replay.py --smoke                  # the whole path, tiny: 1 demo at 32x48, 2 training
                                                        # steps, one 16-step episode (7.5 min at load 11)

A deterministic scene, its own training seeds and a policy that fits its demos: anything short of
success is a mismatch between training and execution (camera order, image size or resize path,
state/action units, which action of a chunk runs at which step, normalization), not a lack of data.

1. demos: N scripted-expert demos (seeds 100000, ...) -> OUT/data (kept when already there);
2. ground truth: the recorded actions, cut into chunks of the policy's length, go through the
   eval's own execution path (``rollout.run_episode``) from the same seeds, while every live
   observation is compared with the recorded one (state exactly; images after the mp4 round
   trip): proves seeds, frame/action alignment and chunk timing before any training;
3. latent cache of the demos (``dit4dit_npu.data.encode_latents``), 4. train the tiny ALOHA config
   on all N demos (no held-out split), then its camera reliance (``camera_reliance``: how much the
   images alone change its chunks), 5. ``dit4dit_npu.sim.eval`` on exactly the demo seeds.
Every step is the real command (its console script's function, in this process); a rerun
resumes what is done. The last line
is ``success k/n`` (not the ``speedup: X.XX`` of the other benches: this one measures success), and
the exit code is 0 whatever k is (1 only for ``--ground-truth-only`` short of n/n). ``--smoke``
checks that the commands run together, not that anything is learned (its episode is too short
to succeed).

Measured (docs/sim_recipe_log.md): ground truth 5/5; the ALOHA tiny config on the 5 demos after
15000 steps (the default: 34 min of training on one core, ~40 min in all) 4/5, after 3000 steps 0/5
(the learning rate's cosine decay is where the hand-over is learned, as in the 50-demo recipe).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

import numpy as np

CONFIG = "configs/aloha/dit4dit_aloha_transfer_cube_tiny.yaml"


# Each stage's command, by module: its console script's function, called in this process (the
# command's own code path, without a fresh interpreter's ~10 s of imports per stage).
STAGES = {
    "dit4dit_npu.sim.demos": "dit4dit_npu.sim.cli:demos_main",
    "dit4dit_npu.data.encode_latents": "dit4dit_npu.data.cli:encode_latents_main",
    "dit4dit_npu.train": "dit4dit_npu.train.cli:main",
    "dit4dit_npu.sim.eval": "dit4dit_npu.sim.cli:eval_main",
}


def run(*args: str) -> None:
    """``python -m MODULE ARGS`` (printed as such, to redo by hand), run in this process; a
    failure stops here with its exit code."""
    module, func = STAGES[args[1]].split(":")
    print("+", sys.executable, " ".join(args), flush=True)
    code = getattr(importlib.import_module(module), func)(list(args[2:]))
    if code:
        raise SystemExit(f"{args[1]} exited with {code}")


class RecordedChunks:
    """A sim policy that returns the demo's own actions a[t : t + chunk] at scene step t."""

    name, metadata = "recorded", {}

    def __init__(self, actions: np.ndarray, chunk: int) -> None:
        self.actions, self.chunk = actions, chunk

    def reset(self, scene, seed: int) -> None:
        self.scene = scene

    def act(self, obs, request=None) -> np.ndarray:  # request: chunked execution's (unused)
        t = min(self.scene.steps, len(self.actions) - 1)  # past the demo: hold its last target
        return self.actions[t : t + self.chunk]

    def close(self) -> None:
        pass


def ground_truth(data: Path, chunk: int, max_steps: int) -> tuple[int, int]:
    """Replay every demo's chunks through ``run_episode``; compare live and recorded observations."""
    from dit4dit_npu.data.lerobot import LeRobotDataset
    from dit4dit_npu.sim.rollout import run_episode
    from dit4dit_npu.sim.scene import AlohaScene

    meta = json.loads((data / "meta" / "sim_demos.json").read_text())
    ds = LeRobotDataset(data)
    ok = 0
    with AlohaScene(meta["task"], tuple(meta["size_hw"])) as scene:
        for ep, seed in zip(ds.selected_episodes, meta["seeds"]):
            start, end = ds.episode_bounds(ep)
            actions = ds.column("action")[start:end]
            states = ds.column("observation.state")[start:end]
            # Same seed, same actions: the live observation at step t must be the recorded row t.
            obs, live_states, live_frames = scene.reset(seed), [], {k: [] for k in scene.cameras}
            probe = range(0, end - start, 40)
            for t in range(end - start):
                live_states.append(obs["state"])
                if t in probe:
                    for k in scene.cameras:
                        live_frames[k].append(obs[k])
                obs = scene.step(actions[t]).obs
            state_diff = float(np.abs(np.stack(live_states) - states).max())
            img_diff = {
                k.rsplit(".", 1)[-1]: float(
                    np.abs(ds.frames_at(start + np.array(probe), k).astype(np.int16) - np.stack(v)).mean()
                )
                for k, v in live_frames.items()
            }
            r = run_episode(scene, RecordedChunks(actions, chunk), seed, max_steps, None)
            ok += r["success"]
            outcome = f"success at step {r['steps_to_success']}" if r["success"] else f"FAILURE (max reward {r['max_reward']})"
            print(
                f"ground truth seed {seed}: recorded chunks of {chunk} -> {outcome}; live vs recorded state "
                f"max |diff| {state_diff:.1e}, image mean |diff| (0-255) "
                + ", ".join(f"{k} {v:.2f}" for k, v in img_diff.items()),
                flush=True,
            )
    return ok, len(meta["seeds"])


def camera_reliance(policy_dir: Path, data: Path, times: tuple[int, ...] = (0, 16, 32, 64)) -> None:
    """Does the policy look at its cameras? At step t of every demo, predict a chunk from that
    demo's frames but the FIRST demo's state: the spread of those chunks across demos (mean |x -
    mean|, robot units) is what the images alone change, next to the spread of the demos' own
    chunks at t. A policy that tells its demos apart by the state alone shows ~0 (it replays an
    average reach in closed loop, whatever it sees)."""
    from dit4dit_npu.data.lerobot import LeRobotDataset
    from dit4dit_npu.policy import DiT4DiTPolicy
    from dit4dit_npu.sim.tasks import get_task

    policy, ds = DiT4DiTPolicy.from_pretrained(policy_dir), LeRobotDataset(data)
    task = get_task(json.loads((data / "meta" / "sim_demos.json").read_text())["task"])
    bounds = [ds.episode_bounds(e) for e in ds.selected_episodes]
    spread = lambda x: float(np.abs(x - x.mean(0)).mean())  # noqa: E731
    for t in times:
        rows = [start + t for start, end in bounds if start + t + policy.chunk_length <= end]
        state = ds.column("observation.state")[rows[0]]
        seen = np.stack([
            policy.predict_action({**{k: ds.frames_at(np.array([r]), k)[0] for k in policy.camera_keys},
                                   "state": state, "instruction": task.instruction}, seed=0)
            for r in rows
        ])
        real = np.stack([ds.column("action")[r : r + policy.chunk_length] for r in rows])
        print(f"camera reliance at step {t}: chunks from each demo's frames with one state differ by "
              f"{spread(seen):.4f}, the demos' own chunks by {spread(real):.4f} (robot units)", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=5, help="demos to train on and replay")
    p.add_argument("--steps", type=int, default=15000, help="training steps (the ALOHA config's own)")
    p.add_argument("--size", default="240x320", help="camera HxW of the demos (the config's views are cut and "
                   "resized from them)")
    p.add_argument("--replan", type=int, default=None, help="actions executed per query (default: whole chunk)")
    p.add_argument("--out", type=Path, default=Path("runs/sim_replay"))
    p.add_argument("--max-steps", type=int, default=400, help="closed-loop episode length (ACT: 400)")
    p.add_argument("--ground-truth-only", action="store_true", help="demos and the ground-truth replay only")
    p.add_argument("--smoke", action="store_true", help="1 demo at 32x48, 2 steps, one 16-step episode")
    p.add_argument("overrides", nargs="*", help="extra training config overrides a.b=c")
    a = p.parse_args()
    if a.smoke:  # 32x48: the smallest views the backbone takes for three cameras side by side
        a.episodes, a.steps, a.size, a.max_steps = 1, 2, "32x48", 16
        a.out = a.out.with_name(a.out.name + "_smoke")
        a.overrides = ["datasets.vla_data.per_device_batch_size=2", "trainer.num_warmup_steps=0",
                       "datasets.vla_data.image_size=[32, 48]", *a.overrides]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = a.out.resolve()
    data, cache, run_id = out / "data" / f"demos_{a.size}", out / "latents", f"replay{a.episodes}"

    if not data.exists():
        run("-m", "dit4dit_npu.sim.demos", "--episodes", str(a.episodes), "--size", a.size, "--out", str(data))
    from dit4dit_npu.config import load_config

    chunk = load_config(CONFIG).framework.action_model.chunk_length
    gt_ok, n = ground_truth(data, chunk, 400)
    print(f"ground truth: {gt_ok}/{n} demos redone by their recorded chunks through the eval's execution path")
    if a.ground_truth_only:
        print(f"success {gt_ok}/{n}")
        return 0 if gt_ok == n else 1

    overrides = [
        f"datasets.vla_data.data_root_dir={data.parent}",
        f"datasets.vla_data.data_mix=[{{path: {data.name}, weight: 1.0}}]",
        "datasets.vla_data.val_fraction=0.0",  # replay: every demo is a training demo
        f"run_root_dir={out}",
        f"run_id={run_id}",
        *a.overrides,
    ]
    run("-m", "dit4dit_npu.data.encode_latents", "--config", CONFIG, "--out", str(cache), *overrides)
    run(
        "-m", "dit4dit_npu.train", "--config", CONFIG, *overrides, f"datasets.vla_data.latent_cache={cache}",
        # smoke: a checkpoint every step, so that python -m dit4dit_npu.train.success_curve --smoke has two to plot
        f"trainer.max_train_steps={a.steps}", f"trainer.save_interval={1 if a.smoke else a.steps}",
        "trainer.eval_samples=0",
        "trainer.resume=auto",
    )
    policy = out / run_id / "checkpoints" / f"step_{a.steps:06d}" / "policy"
    camera_reliance(policy, data, (0,) if a.smoke else (0, 16, 32, 64))
    seeds = json.loads((data / "meta" / "sim_demos.json").read_text())["seeds"]
    if seeds != list(range(seeds[0], seeds[0] + len(seeds))):
        raise SystemExit(f"demo seeds are not consecutive ({seeds}); the eval runs a range of seeds")
    episodes = 1 if a.smoke else len(seeds)
    results = out / run_id / (f"sim_eval_step_{a.steps:06d}" + ("" if a.replan is None else f"_replan{a.replan}"))
    if not (results / "results.json").exists():
        replan = [] if a.replan is None else ["--replan", str(a.replan)]
        run("-m", "dit4dit_npu.sim.eval", "--policy", str(policy), "--episodes", str(episodes), "--seed",
            str(seeds[0]), "--max-steps", str(a.max_steps), "--videos", "0" if a.smoke else "1",
            "--out", str(results), *replan)
    s = json.loads((results / "results.json").read_text())["summary"]
    print(f"success {s['successes']}/{s['episodes']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
