"""A small, learnable, RoboTwin-shaped LeRobot dataset (v2.1 or v3.0) with real mp4s (h264).

    python -m dit4dit_npu.data.demo --out DIR [--version v2.1|v3.0] [--episodes 64] [--length 48]

Why it is learnable, and only with the cameras: each episode's goal is one of NUM_TARGETS places
(two 14-d joint goals: reach, then carry with the task's grippers closed), drawn per episode
independently of its task; the instruction names the task (which grippers close), never the
place, and the start state does not depend on it. The expert's absolute joint action moves a
capped fraction of the way from the current state to the current goal, and the state follows the
action (the phase is visible in the state's grippers). The frames are *caused* by the state and
the goal: each arm is a blob whose position is a function of its joints (gripper opening sets
blob size), the current goal is drawn over them as one large bright marker per arm (cam_high:
each place puts the two markers in its own pair of quadrants), and the wrist views show the
arm-to-goal offset. So (frames, instruction, state) -> action chunk is a deterministic-plus-small-
noise function, while without the frames the place is a guess among NUM_TARGETS.

Why it is testable: the bottom quarter of every frame encodes the dataset-global frame ``index``
as 16 black/white blocks (``read_frame_code``), so a decoder returning a neighbouring frame is
detected; parquet values are ``demo_episode(...)`` of (seed, episode), recomputable by tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from dit4dit_npu.data.errors import DatasetError
from dit4dit_npu.data.writer import DatasetSpec, Episode, LeRobotWriter, aloha_modality
from dit4dit_npu.files import atomic_folder, is_out_of_space

ARM_JOINTS = ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate")
MOTORS = (
    [f"left_{j}" for j in ARM_JOINTS]
    + ["left_gripper"]
    + [f"right_{j}" for j in ARM_JOINTS]
    + ["right_gripper"]
)
CAMERAS = ("cam_high", "cam_left_wrist", "cam_right_wrist")
TASKS = (
    "lift the red block with the left arm",
    "push the blue box to the right with the right arm",
    "hand the bottle over from the left arm to the right arm",
    "stack the green cube on the yellow cube",
    "open the drawer with both arms",
    "place the cup on the coaster",
)
# Which grippers (left, right) each task closes.
TASK_GRIPPERS = ((1, 0), (0, 1), (1, 1), (0, 1), (1, 1), (1, 0))
TASK_COLORS = ((200, 40, 40), (40, 80, 220), (40, 180, 60), (210, 190, 30), (170, 60, 200), (30, 190, 190))
L_JOINTS, R_JOINTS, L_GRIP, R_GRIP = slice(0, 6), slice(7, 13), 6, 13
CODE_BITS = 16
# The generator's version, in meta/demo.json: a dataset at the demo location written by another
# version (or before meta/demo.json existed, version 1) is regenerated, not silently reused.
# 2: the goal place is per episode and shown only in the frames (1: implied by the instruction).
DEMO_VERSION = 2
DEMO_META = "demo.json"

# Where an episode's goal is: one of NUM_TARGETS places, drawn per episode independently of its
# task (the instruction names the task = which grippers close, never where), and the start state
# does not depend on it either, so only the frames' goal markers tell the policy where to go.
# Each place puts the two arms' goal markers in different quadrants of cam_high (phase 0: reach,
# phase 1: carry), so every place looks different there.
NUM_TARGETS = 4
QUADRANTS = ((0.25, 0.25), (0.75, 0.25), (0.75, 0.75), (0.25, 0.75))  # (x, y) of the scene


def episode_target(episode_index: int, num_tasks: int, seed: int = 0) -> int:
    """The goal place of an episode: each task (``episode_index % num_tasks``) visits every place
    once per block of ``num_tasks * NUM_TARGETS`` episodes, in an order drawn per block and task."""
    block, k = divmod(episode_index, num_tasks * NUM_TARGETS)
    order = np.random.default_rng([seed, 3000 + block, k % num_tasks]).permutation(NUM_TARGETS)
    return int(order[k // num_tasks])


def _joints_at(x: float, y: float, rng: np.random.Generator) -> np.ndarray:
    """6 arm joints that ``_arm_xy`` draws at (x, y): 4 free joints drawn by ``rng``, 2 solved for."""
    j = rng.uniform(-0.5, 0.5, 6)
    j[0] = np.arctanh((x - 0.5) / 0.4) - 0.5 * j[1] + 0.3 * j[2]
    j[3] = np.arctanh((y - 0.5) / 0.4) + 0.5 * j[4] - 0.3 * j[5]
    return j


def task_goal(task_index: int, seed: int = 0, phase: int = 0, target: int = 0) -> np.ndarray:
    """The 14-d joint goal of a task phase at goal place ``target``: grippers 1 (closed) or 0 by the task.

    Phase 0 reaches for the object (grippers open), phase 1 carries it to a second pose with the
    task's grippers closed, so the arms keep moving for most of an episode. The joints depend on
    (seed, target, phase) only: the task sets the grippers.
    """
    rng = np.random.default_rng([seed, 2000 + target, phase])
    goal = np.zeros(14)
    # left and right arm markers in different quadrants; phase 1 moves both to two other ones
    left, right = (target + 2 * phase) % 4, (target + 1 + 2 * phase) % 4
    goal[L_JOINTS] = _joints_at(*QUADRANTS[left], rng)
    goal[R_JOINTS] = _joints_at(*QUADRANTS[right], rng)
    goal[L_GRIP], goal[R_GRIP] = TASK_GRIPPERS[task_index % len(TASK_GRIPPERS)]
    return goal


def episode_goals(episode_index: int, num_tasks: int, seed: int = 0) -> list[np.ndarray]:
    """The phase 0 and phase 1 goals of an episode."""
    task, target = episode_index % num_tasks, episode_target(episode_index, num_tasks, seed)
    return [task_goal(task, seed, phase, target) for phase in (0, 1)]


# The expert's joint speed: a fraction of the remaining distance, capped per step (rad), so
# motion is sustained rather than front-loaded and a 0.5 s chunk ahead differs from "hold".
GAIN, MAX_STEP = 0.25, 0.045


def demo_phase(state: np.ndarray, task_index: int) -> int:
    """Phase 1 once the task's grippers have closed (visible in the state): the expert's switch."""
    grips = TASK_GRIPPERS[task_index % len(TASK_GRIPPERS)]
    closed = [state[g] > 0.5 for g, want in zip((L_GRIP, R_GRIP), grips) if want]
    return int(bool(closed) and all(closed))


def demo_episode(episode_index: int, length: int, num_tasks: int, seed: int = 0) -> Episode:
    """The expert trajectory of one episode (the parquet values are exactly these)."""
    task = episode_index % num_tasks
    goals = episode_goals(episode_index, num_tasks, seed)
    rng = np.random.default_rng([seed, episode_index])
    s = np.zeros(14)
    s[L_JOINTS] = rng.normal(0.0, 0.3, 6)
    s[R_JOINTS] = rng.normal(0.0, 0.3, 6)
    states, actions = np.zeros((length, 14)), np.zeros((length, 14))
    joints = np.r_[np.arange(0, 6), np.arange(7, 13)]
    for t in range(length):
        phase = demo_phase(s, task)
        goal = goals[phase]
        a = s.copy()
        step = np.clip(GAIN * (goal[joints] - s[joints]), -MAX_STEP, MAX_STEP)
        a[joints] = s[joints] + step + rng.normal(0.0, 0.003, 12)
        near = np.abs(goal[joints] - s[joints]).mean() < 0.1
        # Grippers close on reaching the phase-0 goal and stay closed while carrying.
        a[L_GRIP] = goal[L_GRIP] if (near or phase == 1) else 0.0
        a[R_GRIP] = goal[R_GRIP] if (near or phase == 1) else 0.0
        states[t], actions[t] = s, a
        s = a.copy()  # position control: joints reach the commanded position
        s[[L_GRIP, R_GRIP]] = states[t][[L_GRIP, R_GRIP]] + 0.5 * (
            a[[L_GRIP, R_GRIP]] - states[t][[L_GRIP, R_GRIP]]
        )
    return Episode(states.astype(np.float32), actions.astype(np.float32), task)


# -- rendering ------------------------------------------------------------------------------


def _arm_xy(joints: np.ndarray) -> tuple[float, float]:
    """Where an arm appears (fractions of the scene): a fixed smooth function of its 6 joints."""
    x = 0.5 + 0.4 * np.tanh(joints[0] + 0.5 * joints[1] - 0.3 * joints[2])
    y = 0.5 + 0.4 * np.tanh(joints[3] - 0.5 * joints[4] + 0.3 * joints[5])
    return float(x), float(y)


def _disk(img: np.ndarray, cx: float, cy: float, r: float, color: tuple[int, int, int]) -> None:
    h, w = img.shape[:2]
    yy, xx = np.mgrid[0:h, 0:w]
    img[(xx - cx * w) ** 2 + (yy - cy * h) ** 2 <= (r * min(h, w)) ** 2] = color


def _write_code(img: np.ndarray, code: int) -> None:
    """Bottom quarter: two rows of 8 blocks, bit b of ``code`` white (255) or black (0)."""
    h, w = img.shape[:2]
    top = h - h // 4
    for b in range(CODE_BITS):
        r0 = top + (b // 8) * (h // 8)
        c0 = (b % 8) * (w // 8)
        img[r0 : r0 + h // 8, c0 : c0 + w // 8] = 255 if (code >> b) & 1 else 0


def read_frame_code(image: np.ndarray) -> int:
    """Inverse of the code band: the frame ``index`` drawn into a (possibly resized) HWC frame."""
    img = np.asarray(image, dtype=np.float32)
    if img.ndim == 3 and img.shape[0] == 3 and img.shape[2] != 3:  # CHW
        img = img.transpose(1, 2, 0)
    if img.max() <= 1.0:
        img = img * 255.0
    gray = img.mean(-1)
    h, w = gray.shape
    code = 0
    for b in range(CODE_BITS):
        cy = (0.75 + (b // 8 + 0.5) / 8) * h
        cx = ((b % 8) + 0.5) / 8 * w
        ry, rx = max(1, int(h / 32)), max(1, int(w / 32))
        block = gray[int(cy) - ry + 1 : int(cy) + ry, int(cx) - rx + 1 : int(cx) + rx]
        code |= int(block.mean() > 127.5) << b
    return code


MARKER = 0.16  # goal marker radius, a fraction of the scene's smaller side


def render(
    camera: str, state: np.ndarray, goal: np.ndarray, task: int, code: int, size_hw: tuple[int, int]
) -> np.ndarray:
    h, w = size_hw
    img = np.zeros((h, w, 3), np.uint8)
    scene = img[: h - h // 4]
    tint = np.array(TASK_COLORS[task % len(TASK_COLORS)], np.float32)
    scene[:] = (0.25 * tint + 20).astype(np.uint8)
    lx, ly = _arm_xy(state[L_JOINTS])
    rx, ry = _arm_xy(state[R_JOINTS])
    if camera == "cam_high":
        # the arms, then the goal markers over them (bright, the arm's hue): always visible
        _disk(scene, lx, ly, 0.08 + 0.05 * state[L_GRIP], (200, 90, 90))
        _disk(scene, rx, ry, 0.08 + 0.05 * state[R_GRIP], (90, 90, 200))
        gl, gr = _arm_xy(goal[L_JOINTS]), _arm_xy(goal[R_JOINTS])
        _disk(scene, *gl, MARKER, (255, 240, 60))
        _disk(scene, *gr, MARKER, (60, 240, 255))
    else:
        left = camera == "cam_left_wrist"
        joints, grip = (L_JOINTS, L_GRIP) if left else (R_JOINTS, R_GRIP)
        ax, ay = (lx, ly) if left else (rx, ry)
        gx, gy = _arm_xy(goal[joints])
        # The goal seen from the wrist: offset from the view centre, magnified.
        _disk(scene, 0.5 + 1.5 * (gx - ax), 0.5 + 1.5 * (gy - ay), MARKER, (255, 255, 255))
        bar = int(round(float(state[grip]) * (scene.shape[0] - 2)))
        scene[scene.shape[0] - bar :, : max(2, w // 8)] = 230
    _write_code(img, code)
    return img


# -- writing --------------------------------------------------------------------------------


def demo_version(path: str | Path) -> int | None:
    """The generator version of the dataset folder ``path``: its meta/demo.json's; 1 for a dataset
    this generator wrote before meta/demo.json existed (its cameras, motors and tasks, no
    demo.json); None for anything else (not a demo dataset: never regenerated)."""
    meta = Path(path) / "meta"
    try:
        return int(json.loads((meta / DEMO_META).read_text())["version"])
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        info = json.loads((meta / "info.json").read_text())
        features = info["features"]
        ours = {f"observation.images.{c}" for c in CAMERAS} | {"observation.state", "action"}
        motors = all(features[k].get("names") == list(MOTORS) for k in ("observation.state", "action"))
        same = ours <= set(features) and motors
        if not same or not (meta / "modality.json").is_file():
            return None
        from dit4dit_npu.data.meta import LeRobotDatasetMetadata

        tasks = set(LeRobotDatasetMetadata(Path(path)).tasks.values())
    except Exception:  # unreadable or not LeRobot: not ours to replace
        return None
    return 1 if tasks <= set(TASKS) else None


def demo_frames(ep: Episode, goals: list[np.ndarray], first: int, size_hw: tuple[int, int]) -> dict[str, np.ndarray]:
    """Every camera's uint8 (T, H, W, 3) frames of an episode (its ``episode_goals``) whose first
    frame has ``index`` ``first``."""
    return {
        f"observation.images.{c}": np.stack(
            [
                render(c, s, goals[demo_phase(s, ep.task_index)], ep.task_index, first + t, size_hw)
                for t, s in enumerate(ep.states)
            ]
        )
        for c in CAMERAS
    }


def write_demo_dataset(
    out: str | Path,
    version: str = "v2.1",
    num_episodes: int = 64,
    episode_length: int = 48,
    fps: int = 15,
    image_size: tuple[int, int] = (32, 32),
    seed: int = 0,
    num_tasks: int = 4,
    gop: int = 8,
    codec: str = "libx264",
    replace: bool = False,
) -> Path:
    """Write the demo dataset to ``out`` atomically (temp folder + rename); returns ``out``.
    ``replace``: an existing ``out`` is replaced (at every moment the old dataset or the new one)."""
    out = Path(out)
    if version not in ("v2.1", "v3.0"):
        raise DatasetError(f"version must be 'v2.1' or 'v3.0', got {version!r}")
    if not replace and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DatasetError(f"refusing to write the demo dataset into non-empty {out}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:  # numpy's SeedSequence takes no negative
        raise DatasetError(f"seed (--seed): expected an int >= 0, got {seed!r}")
    if image_size[0] % 2 or image_size[1] % 2 or min(image_size) < 16:
        raise DatasetError(f"image_size must be even and >= 16, got {image_size}")
    if not 1 <= num_tasks <= len(TASKS):
        raise DatasetError(f"num_tasks must be in 1..{len(TASKS)}")
    for name, value in (("num_episodes", num_episodes), ("episode_length", episode_length), ("fps", fps), ("gop", gop)):
        if value < 1:  # fps 0 wrote a dataset of infinite timestamps; length 0 crashed mid-write
            raise DatasetError(f"{name} must be >= 1, got {value}")
    size_hw = (int(image_size[0]), int(image_size[1]))
    spec = DatasetSpec(
        fps=fps,
        tasks=TASKS[:num_tasks],
        video_keys=[f"observation.images.{c}" for c in CAMERAS],
        motors=MOTORS,
        codec=codec,
        gop=gop,
        extra_meta={
            "modality.json": aloha_modality([f"observation.images.{c}" for c in CAMERAS]),
            DEMO_META: {
                "generator": "dit4dit_npu.data.demo",
                "version": DEMO_VERSION,
                "episodes": num_episodes,
                "length": episode_length,
                "tasks": num_tasks,
                "seed": seed,
            },
        },
    )
    try:
        # Readers (other ranks) never see a half-written dataset. One episode rendered and encoded
        # at a time: memory stays that of one episode.
        with atomic_folder(out, replace=replace) as tmp, LeRobotWriter(tmp, version, spec) as writer:
            for e in tqdm(range(num_episodes), desc=f"demo {version}", unit="episode", disable=None):
                ep = demo_episode(e, episode_length, num_tasks, seed)
                goals = episode_goals(e, num_tasks, seed)
                writer.add_episode(ep, demo_frames(ep, goals, e * episode_length, size_hw))
    except OSError as e:  # an unwritable place, or a folder written into while we wrote
        if is_out_of_space(e):
            raise
        why = f"{e.strerror}: {e.filename}" if e.strerror and e.filename else str(e)
        raise DatasetError(f"cannot write the demo dataset to {out} ({why})") from None
    return out


if __name__ == "__main__":  # python -m dit4dit_npu.data.demo: the command is data/cli.py's
    from dit4dit_npu.data.cli import demo_main

    raise SystemExit(demo_main())
