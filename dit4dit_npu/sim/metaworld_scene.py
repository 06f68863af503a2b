"""A Meta-World task (the ``metaworld`` package's own env) showing a policy what lerobot shows it.

    scene = MetaworldScene("metaworld/reach-v3", size_hw=(128, 128))
    obs = scene.reset(seed=1000)     # {"observation.image": uint8 HWC, "state": (4,), "instruction": str}
    step = scene.step(action4)       # StepResult(obs, reward, success)

Built as lerobot 0.6.1's ``MetaworldEnv`` builds it (``lerobot/envs/metaworld.py``), step for step,
so a seed gives the same scene and a policy the same observation in both harnesses:

- ``metaworld.MT1(task, seed=42)``, the env made with ``camera_name="corner2"``, its first train
  task set, the corner2 camera moved to (0.75, 0.075, 0.7), one reset, then seeded resets on
  (``_freeze_rand_vec = False``, ``seeded_rand_vec = True``): ``reset(seed)`` is lerobot's
  ``env.seed(seed)`` then ``env.reset(seed=seed)``, which place the goal and objects from the seed;
- the picture is corner2's render flipped in both axes (that camera's images come upside down and
  mirrored), rendered as the lean env (``lerobot_plugin/env``) renders it: the renderer sized to the
  asked size before its first frame, without shadows and without multisampling (what lerobot-eval
  scored and the demos recorded); the state is the first 4 numbers of Meta-World's observation,
  which lerobot hands the policy as float32;
- success is Meta-World's ``info["success"]``; the episode ends there, as lerobot's env ends it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dit4dit_npu.sim import metaworld_tasks as mw
from dit4dit_npu.sim.backend import import_metaworld
from dit4dit_npu.sim.errors import EpisodeError, SimError
from dit4dit_npu.sim.tasks import StepResult, parse_size, scene_spec

TASK_SEED = 42  # lerobot's metaworld.MT1(task, seed=42): the benchmark's task list (its first is set)
# lerobot moves camera 2 (corner2 in Meta-World's scenes) here before the first frame; by index, as
# lerobot does, so both move the same camera whatever a scene's camera list
CAMERA_INDEX, CAMERA_POS = 2, (0.75, 0.075, 0.7)


def flip(image: np.ndarray) -> np.ndarray:
    """corner2's render as lerobot hands it on: flipped in both axes, a contiguous copy."""
    return np.ascontiguousarray(np.flip(image, (0, 1)))


class MetaworldScene:
    """One Meta-World episode at a time; ``render=False`` skips the camera (physics only)."""

    def __init__(self, task: str, size_hw: tuple[int, int] = mw.DEFAULT_SIZE, render: bool = True) -> None:
        self.spec = scene_spec(task)
        self.name = mw.env_name(task)
        h, w = parse_size(f"{size_hw[0]}x{size_hw[1]}")
        metaworld = import_metaworld()  # here, not at the top: this module loads without it
        mt1 = metaworld.MT1(self.name, seed=TASK_SEED)
        env = mt1.train_classes[self.name](render_mode="rgb_array", camera_name=mw.CAMERA)
        env.set_task(mt1.train_tasks[0])
        env.model.cam_pos[CAMERA_INDEX] = CAMERA_POS
        env.reset()
        env._freeze_rand_vec = False  # lerobot's: else every reset is the task's one frozen layout
        env.seeded_rand_vec = True  # and the layout comes from the seed's RNG
        # The lean env's render (lerobot_plugin/env): gymnasium's renderer reads its size when its
        # first frame makes the GL context; the offscreen buffer (480x480) only has to hold it.
        # Shadows and multisampling are rendering only (the physics never reads them).
        env.mujoco_renderer.width, env.mujoco_renderer.height = w, h
        env.model.vis.global_.offwidth = max(env.model.vis.global_.offwidth, w)
        env.model.vis.global_.offheight = max(env.model.vis.global_.offheight, h)
        env.model.light_castshadow[:] = 0
        env.model.vis.quality.offsamples = 0
        self.env = env
        self.cameras = {mw.CAMERA_KEY: mw.CAMERA} if render else {}
        self.size_hw = (h, w)
        self.max_reward = 0.0
        self.steps = 0
        self._success = False

    @property
    def instruction(self) -> str:
        return self.spec.instruction

    def reset(self, seed: int) -> dict[str, Any]:
        self.env.seed(seed)  # lerobot's MetaworldEnv.reset(seed): both calls, in this order
        raw, _ = self.env.reset(seed=seed)
        self.max_reward, self.steps, self._success = 0.0, 0, False
        return self._observation(raw)

    def step(self, action: np.ndarray) -> StepResult:
        action = np.asarray(action, dtype=np.float32)
        if action.shape != (mw.ACTION_DIM,):
            raise SimError(f"action: expected shape ({mw.ACTION_DIM},), got {action.shape}")
        if not np.isfinite(action).all():  # nothing non-finite reaches the (simulated) robot
            raise EpisodeError(f"non-finite action at step {self.steps}: {action.tolist()}")
        if self.steps >= mw.MAX_STEPS:
            raise SimError(f"Meta-World ends an episode at {mw.MAX_STEPS} steps (its max_path_length)")
        raw, reward, _, _, info = self.env.step(action)
        self.steps += 1
        self.max_reward = max(self.max_reward, float(reward))
        self._success = self._success or bool(info.get("success", 0))
        return StepResult(self._observation(raw), float(reward), self._success)

    def _observation(self, raw: np.ndarray) -> dict[str, Any]:
        obs: dict[str, Any] = {}
        if self.cameras:
            obs[mw.CAMERA_KEY] = flip(self.env.render())
        obs["state"] = np.asarray(raw[:4], np.float32)  # lerobot's agent_pos, as its batch carries it
        obs["instruction"] = self.spec.instruction
        return obs

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None

    def __enter__(self) -> MetaworldScene:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

