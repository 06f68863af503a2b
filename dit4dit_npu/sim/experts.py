"""Scripted experts: seeded, deterministic joint-action demonstrators for the ALOHA scenes.

An expert plans gripper (TCP) poses from the privileged object pose and turns them into the scene's
14-d joint actions with damped-least-squares IK (``ik.py``), in one pass in the joint-position
scene that is evaluated: what it records is exactly what was executed. (ACT's recipe, rolling out
in the mocap scene and replaying the joints, loses a third of the episodes under mujoco 3.8.)

    expert = make_expert(scene)      # right after scene.reset(seed)
    action = expert(obs)             # (14,) float32, once per control step
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dit4dit_npu.sim.errors import SimError
from dit4dit_npu.sim.ik import ArmIK, axis_angle
from dit4dit_npu.sim.scene import AlohaScene

IDENTITY = np.array([1.0, 0.0, 0.0, 0.0])
OPEN, CLOSED = 1.0, 0.0  # gym-aloha's normalized gripper command
CUBE_REST_Z = 0.02  # the cube spawns at z=0.05 and settles on the table at its half-size


class Waypoints:
    """Piecewise-linear (xyz, quat, gripper) schedule over control steps; quaternions nlerp'ed."""

    def __init__(self, frames: Sequence[tuple[int, np.ndarray, np.ndarray, float]]) -> None:
        self.t = np.array([f[0] for f in frames], float)
        self.xyz = np.array([f[1] for f in frames], float)
        self.quat = np.array([f[2] for f in frames], float)
        self.grip = np.array([f[3] for f in frames], float)

    def __call__(self, step: int) -> tuple[np.ndarray, float]:
        """(7-d pose, gripper) at ``step`` (held constant outside the schedule)."""
        s = float(np.clip(step, self.t[0], self.t[-1]))
        i = min(int(np.searchsorted(self.t, s, side="right")) - 1, len(self.t) - 2)
        a = (s - self.t[i]) / (self.t[i + 1] - self.t[i])
        return _blend(self.xyz[i], self.quat[i], self.xyz[i + 1], self.quat[i + 1], a), float(
            (1 - a) * self.grip[i] + a * self.grip[i + 1]
        )


def _blend(x0: np.ndarray, q0: np.ndarray, x1: np.ndarray, q1: np.ndarray, a: float) -> np.ndarray:
    if np.dot(q0, q1) < 0:  # same rotation, shorter path
        q1 = -q1
    q = (1 - a) * q0 + a * q1
    return np.concatenate([(1 - a) * x0 + a * x1, q / np.linalg.norm(q)])


class TransferCubeExpert:
    """The right arm picks the cube (gripper pitched 60 deg down) and carries it to a hand-over
    point; the left arm, gripper rolled 90 deg so its fingers close across the right ones, waits
    beside it, then follows the cube's *live* position (it slips a little in the right gripper)
    until its own fingers have closed; the right gripper opens and the left arm pulls the cube away.

    ``__call__(t, cube_xyz) -> (left pose, left grip, right pose, right grip)``; poses are TCP
    (xyz, quat). Deterministic given the cube's start pose: no randomness, no branches on noise.

    Timing: the schedule is written on ACT's 400-step clock and run at ``pace`` 0.8, so the
    hand-over completes (reward 4) at steps 229-249 over seeds 0-99, inside gym-aloha's
    300-step limit with margin (at pace 1.0 it lands at 285-301: 3 of 100 seeds just miss it).
    """

    horizon = 400
    handover = np.array([0.0, 0.5, 0.25])

    def __init__(
        self, cube_xyz: np.ndarray, left_start: np.ndarray, right_start: np.ndarray, pace: float = 0.8
    ) -> None:
        self.pace = pace
        at = self._at
        cube = np.array(cube_xyz[:3], float)
        cube[2] = CUBE_REST_Z
        grasp = cube + [0.0, 0.0, -0.015]  # a little below the centre: the fingers grip its lower half
        h = self.handover
        pick = axis_angle((0, 1, 0), -60)
        self.receive = axis_angle((1, 0, 0), 90)
        self.right = Waypoints([
            (0, right_start[:3], right_start[3:], CLOSED),
            (at(90), cube + [0, 0, 0.08], pick, OPEN),  # above the cube
            (at(130), grasp, pick, OPEN),  # down
            (at(165), grasp, pick, CLOSED),  # grasp
            (at(200), h + [0.05, 0, 0], pick, CLOSED),  # lift towards the hand-over point
            (at(220), h, pick, CLOSED),
            (at(305), h, pick, CLOSED),  # hold while the left gripper closes
            (at(325), h, pick, OPEN),  # let go
            (at(365), h + [0.1, 0, 0], pick, OPEN),  # back off
            (at(400), h + [0.1, 0, 0], pick, OPEN),
        ])
        self.wait = h + [-0.12, 0, 0]
        self.left = Waypoints([
            (0, left_start[:3], left_start[3:], CLOSED),
            (at(100), self.wait, self.receive, OPEN),  # beside the hand-over point, open
            (at(400), self.wait, self.receive, OPEN),
        ])
        self.latch = at(235)  # the left arm starts following the cube
        self.catch: np.ndarray | None = None

    def _at(self, step: int) -> int:
        return int(round(step * self.pace))

    def __call__(self, t: int, cube_xyz: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, float]:
        right, right_grip = self.right(t)
        if t < self.latch:
            left, left_grip = self.left(t)
            return left, left_grip, right, right_grip
        k, at = t - self.latch, self._at
        slid, shut, released, away = at(35), at(65), at(95), at(40)
        if k <= shut:  # track the cube until the fingers are shut
            self.catch = np.array(cube_xyz[:3], float)
        if k <= slid:  # slide in around the cube, open
            left, left_grip = _blend(self.wait, self.receive, self.catch, self.receive, k / slid), OPEN
        elif k <= shut:  # close
            left, left_grip = np.concatenate([self.catch, self.receive]), 1.0 - (k - slid) / (shut - slid)
        elif k <= released:  # hold while the right gripper opens
            left, left_grip = np.concatenate([self.catch, self.receive]), CLOSED
        else:  # pull away, holding it, turning the gripper back upright
            a = min(1.0, (k - released) / away)
            left, left_grip = _blend(self.catch, self.receive, self.catch + [-0.12, 0, 0], IDENTITY, a), CLOSED
        return left, left_grip, right, right_grip


def make_expert(scene: AlohaScene) -> Callable[[dict[str, Any]], np.ndarray]:
    """The task's expert for the episode ``scene`` was just reset to: ``expert(obs) -> (14,)``."""
    if scene.task.name != "transfer_cube":
        raise SimError(f"no scripted expert for task {scene.task.name!r} (available: transfer_cube)")
    ik = ArmIK(scene.physics.model.ptr, scene.physics.data.qpos)
    left_start, right_start = ik.tcp_poses()
    plan = TransferCubeExpert(scene.env_state[:3], left_start, right_start)
    step = 0

    def expert(obs: dict[str, Any]) -> np.ndarray:
        nonlocal step
        left, left_grip, right, right_grip = plan(step, scene.env_state[:3])
        step += 1
        arms = ik.solve(left, right)
        return np.concatenate([arms[:6], [left_grip], arms[6:], [right_grip]]).astype(np.float32)

    return expert
