"""lerobot's Meta-World env with a render a CPU affords (``--env.type=metaworld_lean``).

lerobot 0.6 renders Meta-World's camera at 480x480 with the scene's shadows (three lights with
4096-px shadow maps) whatever a policy reads, and has no setting for either: on a CPU host with
software GL that is 0.5-0.8 s a step, ~10 minutes for a failing 500-step episode. This env is
lerobot's own ``MetaworldEnv``, built by lerobot's own code (task, description, camera placement
and flip, seeded resets, success signal, episode limit: nothing of the task is ours), with the
camera's renderer made smaller, shadowless and without multisampling before its first frame. ``lerobot-eval`` scores it
with its own loop. lerobot imports this package (an installed ``lerobot_env_*`` distribution)
before it parses a command line; the import registers the type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym

# lerobot's private helpers (_make_vec_env_cls, _LazyAsyncVectorEnv): the vector envs lerobot's own
# Meta-World config builds, so this one builds the same (the dependency pins lerobot 0.6)
from lerobot.envs.configs import EnvConfig, _make_vec_env_cls
from lerobot.envs.configs import MetaworldEnv as StockConfig
from lerobot.envs.metaworld import DIFFICULTY_TO_TASKS
from lerobot.envs.metaworld import MetaworldEnv as StockEnv
from lerobot.envs.utils import _LazyAsyncVectorEnv


class LeanMetaworldEnv(StockEnv):
    """lerobot's MetaworldEnv whose camera renders ``image_size`` x ``image_size`` pixels, with
    shadows only if ``shadows`` and 4x multisampling (lerobot's) only if ``antialias``."""

    def __init__(self, task: str, image_size: int = 128, shadows: bool = False, antialias: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(task, observation_width=image_size, observation_height=image_size, **kwargs)
        self.image_size, self.shadows, self.antialias = image_size, shadows, antialias

    def _ensure_env(self) -> None:
        if self._env is not None:
            return
        super()._ensure_env()  # lerobot's build, which renders nothing yet: the renderer is made at the first frame
        env = self._env
        # gymnasium's MujocoRenderer reads its width and height when it makes its viewer (the first
        # render); the offscreen buffer (the model's offwidth x offheight, 480x480) only has to hold them.
        env.mujoco_renderer.width = env.mujoco_renderer.height = self.image_size
        env.model.vis.global_.offwidth = max(env.model.vis.global_.offwidth, self.image_size)
        env.model.vis.global_.offheight = max(env.model.vis.global_.offheight, self.image_size)
        # Both rendering only (the physics never reads them), both read when the first frame makes
        # the GL context: measured at 128x128 under load, shadows off 800 -> ~200 ms a step,
        # multisampling off too -> ~75 ms (docs/lerobot.md).
        if not self.shadows:
            env.model.light_castshadow[:] = 0
        if not self.antialias:
            env.model.vis.quality.offsamples = 0


@EnvConfig.register_subclass("metaworld_lean")
@dataclass
class MetaworldLeanConfig(StockConfig):
    """lerobot's Meta-World config (``--env.task``: a task, a difficulty group, or a comma-separated
    list of either) plus the render's ``image_size``, ``shadows`` and ``antialias``."""

    image_size: int = 128
    shadows: bool = False
    antialias: bool = False

    def __post_init__(self) -> None:
        if not 16 <= self.image_size <= 480:
            raise ValueError(f"--env.image_size: expected 16..480 pixels (480: lerobot's own), got {self.image_size}")
        super().__post_init__()
        for key in ("top", "pixels/top"):
            if key in self.features:
                self.features[key].shape = (self.image_size, self.image_size, 3)

    @property
    def gym_kwargs(self) -> dict:
        return {**super().gym_kwargs, "image_size": self.image_size, "shadows": self.shadows, "antialias": self.antialias}

    def create_envs(self, n_envs: int, use_async_envs: bool = False) -> dict[str, dict[int, Any]]:
        """{group: {task index: a vector env of ``n_envs`` copies}}, built as lerobot's own
        ``create_metaworld_envs`` builds them, of this env. That function names lerobot's env class
        inside it (no way to hand it another), so its loop is repeated here, vector classes included:
        lerobot-eval's default is async (``--eval.use_async_envs=true``, ``batch_size`` > 1), and
        there lerobot's lazy wrapper starts one task's worker processes at a time (forkserver, not
        all the groups' tasks x n_envs at once) and freezes a sub-env whose episode ended, so it is
        not stepped and rendered again while the rest of its batch finishes."""
        groups = [t.strip() for t in (self.task or "").split(",") if t.strip()]
        if not groups:
            raise ValueError(f"--env.task: expected a Meta-World task, difficulty group, or comma-separated list, "
                             f"got {self.task!r}")
        env_cls = _make_vec_env_cls(use_async_envs, n_envs)
        kwargs = self.gym_kwargs  # a dict, not the config, goes into each factory (pickled to async workers)
        spaces = None  # (observation space, action space, metadata) of the first env, as lerobot caches them
        out: dict[str, dict[int, Any]] = {}
        for group in groups:
            out[group] = {}
            for i, name in enumerate(DIFFICULTY_TO_TASKS.get(group, [group])):
                fns = [lambda name=name: LeanMetaworldEnv(name, **kwargs) for _ in range(n_envs)]
                if env_cls is gym.vector.AsyncVectorEnv:
                    lazy = _LazyAsyncVectorEnv(fns, *(spaces or (None, None, None)))
                    spaces = spaces or (lazy.observation_space, lazy.action_space, lazy.metadata)
                    out[group][i] = lazy
                else:
                    out[group][i] = env_cls(fns)
        return out


__all__ = ["LeanMetaworldEnv", "MetaworldLeanConfig"]
