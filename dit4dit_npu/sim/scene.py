"""A gym-aloha scene with the project's observation keys and fast three-camera rendering.

    scene = AlohaScene("transfer_cube", size_hw=(240, 320))
    obs = scene.reset(seed=0)          # {cam keys: uint8 HWC, "state": (14,), "instruction": str}
    step = scene.step(action14)        # StepResult(obs, reward, success)

It is gym-aloha's own task classes (``TransferCubeTask``, ``InsertionTask``: reset, action
mapping, contact reward) under dm_control, like ``gym_aloha.AlohaEnv``, with only their camera
rendering replaced (see ``render.py``). ``reset(seed)`` places the objects exactly as
``AlohaEnv.reset(seed)`` does; ``success`` latches once the reward reaches 4, gym-aloha's
``is_success``. The observation is directly what ``DiT4DiTPolicy.predict_action`` takes.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from dit4dit_npu.sim.backend import import_mujoco
from dit4dit_npu.sim.errors import EpisodeError, SimError
from dit4dit_npu.sim.render import CameraRenderer
from dit4dit_npu.sim.tasks import (
    ACTION_DIM,
    CAMERAS,
    SUCCESS_REWARD,
    StepResult,
    get_task,
    object_pose,
    scene_spec,
)

import_mujoco()  # sets MUJOCO_GL before dm_control imports mujoco

from dm_control import mujoco as dm_mujoco  # noqa: E402
from dm_control.rl import control  # noqa: E402
from gym_aloha.constants import ASSETS_DIR, DT  # noqa: E402
from gym_aloha.tasks import sim as aloha_tasks  # noqa: E402


def _state_only(task: aloha_tasks.BimanualViperXTask, physics: Any) -> dict:
    """gym-aloha's observation without its three 480x640 renders."""
    obs = collections.OrderedDict()
    obs["qpos"] = task.get_qpos(physics)
    obs["env_state"] = task.get_env_state(physics)
    return obs


class _TransferCube(aloha_tasks.TransferCubeTask):
    get_observation = _state_only


class _Insertion(aloha_tasks.InsertionTask):
    get_observation = _state_only


_TASK_CLASSES = {"transfer_cube": _TransferCube, "insertion": _Insertion}


class AlohaScene:
    """One simulated ALOHA episode at a time; ``render=False`` skips the cameras (physics only)."""

    def __init__(
        self,
        task: str,
        size_hw: tuple[int, int] = (240, 320),
        cameras: dict[str, str] | None = None,
        render: bool = True,
    ) -> None:
        self.task = get_task(task)
        self.spec = scene_spec(task)
        physics = dm_mujoco.Physics.from_xml_path(str(ASSETS_DIR / self.task.xml))
        # Same construction as gym_aloha.AlohaEnv._make_env_task (time limit left to the caller).
        self.env = control.Environment(
            physics,
            _TASK_CLASSES[self.task.name](),
            time_limit=float("inf"),
            control_timestep=DT,
            n_sub_steps=None,
            flat_observation=False,
        )
        self.physics = physics
        self.cameras = dict(CAMERAS if cameras is None else cameras)
        self.renderer = CameraRenderer(physics.model.ptr, size_hw, self.cameras) if render else None
        self.size_hw = tuple(size_hw)
        self.max_reward = 0.0
        self.steps = 0
        self._env_state: np.ndarray | None = None

    @property
    def instruction(self) -> str:
        return self.task.instruction

    @property
    def env_state(self) -> np.ndarray:
        """Object poses (7 per object: xyz + quat), privileged: for scripted experts only."""
        return self._env_state.copy()

    def reset(self, seed: int) -> dict[str, Any]:
        # gym-aloha passes the pose through this module-level global (read in initialize_episode);
        # each worker process has its own copy.
        aloha_tasks.BOX_POSE[0] = object_pose(self.task.name, seed)
        ts = self.env.reset()
        self.max_reward, self.steps = 0.0, 0
        return self._observation(ts.observation)

    def step(self, action: np.ndarray) -> StepResult:
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (ACTION_DIM,):
            raise SimError(f"action: expected shape ({ACTION_DIM},), got {action.shape}")
        if not np.isfinite(action).all():  # nothing non-finite reaches the (simulated) robot
            raise EpisodeError(f"non-finite action at step {self.steps}: {action.tolist()}")
        try:
            ts = self.env.step(action)
        except control.PhysicsError as e:  # e.g. wild targets make the solver diverge
            raise EpisodeError(f"physics diverged at step {self.steps}: {e}") from None
        reward = float(ts.reward or 0.0)
        self.max_reward = max(self.max_reward, reward)
        self.steps += 1
        return StepResult(self._observation(ts.observation), reward, self.max_reward >= SUCCESS_REWARD)

    def _observation(self, raw: dict) -> dict[str, Any]:
        self._env_state = np.asarray(raw["env_state"])
        obs: dict[str, Any] = {}
        if self.renderer is not None:
            obs.update(self.renderer.render(self.physics.data.ptr))
        obs["state"] = np.asarray(raw["qpos"], np.float32)
        obs["instruction"] = self.task.instruction
        return obs

    def close(self) -> None:
        if self.renderer is not None:
            self.renderer.close()
            self.renderer = None

    def __enter__(self) -> AlohaScene:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
