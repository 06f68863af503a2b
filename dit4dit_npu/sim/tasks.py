"""The ALOHA tasks this package knows: gym-aloha's scene, instruction and seeded object poses.

Light on purpose (numpy only): the CLIs validate ``--task`` before starting MuJoCo.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dit4dit_npu.console import size_hw
from dit4dit_npu.sim import metaworld_tasks as mw
from dit4dit_npu.sim.errors import SimError

FPS = 50  # gym-aloha's control rate (DT = 0.02 s)
SUCCESS_REWARD = 4  # gym-aloha: terminated = is_success = (reward == 4)
GYM_MAX_STEPS = 300  # gym-aloha registers both tasks with max_episode_steps=300
EPISODE_STEPS = 400  # ACT's episode length (the scripted expert succeeds by step ~250)
TRAIN_SEED0 = 100_000  # demo (training) seeds start here; evaluation seeds are 0, 1, ...: disjoint
# gym-aloha places the objects with np.random.RandomState(seed), which takes seeds in [0, 2**32)
SEED_LIMIT = 2**32

# Scene camera -> dataset/policy key: the project's (RoboTwin's) three-camera layout.
CAMERAS = {
    "observation.images.cam_high": "top",
    "observation.images.cam_left_wrist": "left_wrist",
    "observation.images.cam_right_wrist": "right_wrist",
}
STATE_DIM = ACTION_DIM = 14  # [left 6 joints, left gripper, right 6 joints, right gripper]
ARM_JOINTS = ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate")
MOTORS = [f"{side}_{j}" for side in ("left", "right") for j in (*ARM_JOINTS, "gripper")]
ARM_DIMS = (*range(0, 6), *range(7, 13))  # the 12 arm joints of an action (the grippers are open/close commands)
DEFAULT_SIZE = (240, 320)  # RoboTwin's camera size, when the policy does not say its own


@dataclass(frozen=True)
class Task:
    name: str
    xml: str  # joint-position-control scene in gym_aloha/assets
    instruction: str
    gym_id: str  # the equivalent gymnasium id (same scene, reward and seeding)


TASKS = {
    t.name: t
    for t in (
        Task(
            "transfer_cube",
            "bimanual_viperx_transfer_cube.xml",
            "pick up the red cube with the right arm and hand it over to the left arm",
            "gym_aloha/AlohaTransferCube-v0",
        ),
        Task(
            "insertion",
            "bimanual_viperx_insertion.xml",
            "pick up the peg and the socket and insert the peg into the socket",
            "gym_aloha/AlohaInsertion-v0",
        ),
    )
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise SimError(f"unknown task {name!r}; expected one of {sorted(TASKS)}")
    return TASKS[name]


@dataclass(frozen=True)
class SceneSpec:
    """What the closed-loop eval needs to know of a ``--task`` before its simulator loads: the
    scene's cameras (policy key -> scene camera), state and action sizes, control rate, the
    registered env's episode limit (success within it is reported) and the eval's defaults."""

    task: str  # the --task spelling
    simulator: str  # "ALOHA" | "Meta-World": in messages
    instruction: str
    cameras: dict[str, str] = field(hash=False)
    state_dim: int
    action_dim: int
    layout: str  # what the state/action numbers are, for refusals
    fps: int
    time_limit: int  # the registered env's max_episode_steps
    episode_steps: int  # the eval's default --max-steps
    max_steps: int | None  # a hard limit of the simulator itself (None: none)
    default_size: tuple[int, int]  # camera size when the policy does not say its own
    jerk_dims: tuple[int, ...]  # the joint-target dims whose jerk is reported (none: not joint targets)


@dataclass
class StepResult:
    """What a scene's ``step(action)`` returns (every simulator's scene)."""

    obs: dict[str, Any]
    reward: float
    success: bool  # the task's success reached at this step or any earlier one of the episode


def scene_spec(task: str) -> SceneSpec:
    """The ``--task`` of the closed-loop eval: an ALOHA task (``transfer_cube``, ``insertion``) or
    ``metaworld/<task>``; anything else is one line."""
    if mw.is_metaworld(task):
        name = mw.env_name(task)
        return SceneSpec(
            task, "Meta-World", mw.DESCRIPTIONS[name], {mw.CAMERA_KEY: mw.CAMERA}, mw.STATE_DIM, mw.ACTION_DIM,
            "[hand x, y, z, gripper]", mw.FPS, mw.MAX_STEPS, mw.MAX_STEPS, mw.MAX_STEPS, mw.DEFAULT_SIZE, (),
        )
    if task not in TASKS:
        raise SimError(f"unknown task {task!r}; expected one of {sorted(TASKS)} or {mw.PREFIX}<task> (e.g. "
                       f"{mw.PREFIX}reach-v3)")
    return SceneSpec(
        task, "ALOHA", TASKS[task].instruction, dict(CAMERAS), STATE_DIM, ACTION_DIM,
        "[left 6 joints, left gripper, right 6 joints, right gripper]", FPS, GYM_MAX_STEPS, EPISODE_STEPS, None,
        DEFAULT_SIZE, ARM_DIMS,
    )


def object_pose(task: str, seed: int) -> np.ndarray:
    """Object start pose(s) (7 numbers per object), exactly as gym-aloha's ``reset(seed)``."""
    from gym_aloha.utils import sample_box_pose, sample_insertion_pose

    if get_task(task).name == "transfer_cube":
        return sample_box_pose(seed)
    return np.concatenate(sample_insertion_pose(seed))


def check_seed_range(first: int, episodes: int, low: int = 0, count_flag: str | None = "--episodes") -> None:
    """Episodes use scene seeds first .. first + episodes - 1: every one of them in [low, 2**32),
    said in one line before any episode runs (numpy's traceback at the first bad one, after the
    good ones ran, otherwise). ``low``: the range's own floor (demos: TRAIN_SEED0); ``count_flag``:
    the command's flag for ``episodes`` (None: a command of one episode)."""
    last = first + episodes - 1
    if first < low or last >= SEED_LIMIT:
        floor = "0" if low == 0 else f"{low} (demo seeds start at {low}; 0..{low - 1} are evaluation seeds)"
        given = f"--seed {first}" + (f" with {count_flag} {episodes}" if count_flag else "")
        raise SimError(
            f"{given}: the episodes' seeds are {first}..{last}, expected each >= {floor} and < 2**32 = "
            f"{SEED_LIMIT} (the simulator's seed range)"
        )


def parse_size(text: str) -> tuple[int, int]:
    """'240x320' -> (240, 320); even sizes (the mp4s are yuv420p)."""
    h, w = size_hw(text)
    if h < 16 or w < 16 or h % 2 or w % 2:
        raise SimError(f"--size: height and width must be even and >= 16, got {text!r}")
    return h, w
