"""Scripted experts: seeded, deterministic joint-action demonstrators for the ALOHA scenes.

An expert plans gripper (TCP) poses from the privileged object pose and turns them into the scene's
14-d joint actions with damped-least-squares IK (``ik.py``), in one pass in the joint-position
scene that is evaluated: what it records is exactly what was executed. (ACT's recipe, rolling out
in the mocap scene and replaying the joints, loses a third of the episodes under mujoco 3.8.)

    expert = make_expert(scene)      # right after scene.reset(seed)
    action = expert(obs)             # (14,) float32, once per control step

    chunks = make_chunk_expert(scene, 16)
    chunk = chunks(t)                # (16, 14): its plan from schedule step t, on the objects' poses of now
"""

from __future__ import annotations

import copy
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


class ScheduledExpert:
    """Schedules are written on ACT's 400-step clock and run at ``pace`` (< 1: faster)."""

    pace = 1.0

    @classmethod
    def _at(cls, step: int) -> int:
        """A time on ACT's 400-step clock -> this expert's control step."""
        return int(round(step * cls.pace))

    @classmethod
    def horizon(cls) -> int:
        """Steps until the schedule ends (what a demo records)."""
        return cls._at(400)


class TransferCubeExpert(ScheduledExpert):
    """The right arm picks the cube (gripper pitched 60 deg down) and carries it to a hand-over
    point; the left arm, gripper rolled 90 deg so its fingers close across the right ones, waits
    beside it, then follows the cube's *live* position (it slips a little in the right gripper)
    until its own fingers have closed; the right gripper opens and the left arm pulls the cube away.

    ``__call__(t, env_state) -> (left pose, left grip, right pose, right grip)``; poses are TCP
    (xyz, quat). Deterministic given the cube's start pose: no randomness, no branches on noise.

    Timing: the schedule is written on ACT's 400-step clock and run at ``pace`` 0.8, so the
    hand-over completes (reward 4) at steps 229-249 over seeds 0-99, inside gym-aloha's
    300-step limit with margin (at pace 1.0 it lands at 285-301: 3 of 100 seeds just miss it).
    """

    pace = 0.8
    handover = np.array([0.0, 0.5, 0.25])

    def __init__(self, env_state: np.ndarray, left_start: np.ndarray, right_start: np.ndarray) -> None:
        at = self._at
        cube = np.array(env_state[:3], float)
        cube[2] = CUBE_REST_Z
        grasp = cube + [0.0, 0.0, -0.015]  # a little below the centre: the fingers grip its lower half
        h = self.handover
        pick = axis_angle((0, 1, 0), -60)
        self.receive = axis_angle((1, 0, 0), 90)
        self.right = Waypoints(
            [
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
            ]
        )
        self.wait = h + [-0.12, 0, 0]
        self.left = Waypoints(
            [
                (0, left_start[:3], left_start[3:], CLOSED),
                (at(100), self.wait, self.receive, OPEN),  # beside the hand-over point, open
                (at(400), self.wait, self.receive, OPEN),
            ]
        )
        self.latch = at(235)  # the left arm starts following the cube
        self.catch: np.ndarray | None = None

    def __call__(self, t: int, env_state: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, float]:
        right, right_grip = self.right(t)
        if t < self.latch:
            left, left_grip = self.left(t)
            return left, left_grip, right, right_grip
        k, at = t - self.latch, self._at
        slid, shut, released, away = at(35), at(65), at(95), at(40)
        if k <= shut:  # track the cube until the fingers are shut
            self.catch = np.array(env_state[:3], float)
        if k <= slid:  # slide in around the cube, open
            left, left_grip = _blend(self.wait, self.receive, self.catch, self.receive, k / slid), OPEN
        elif k <= shut:  # close
            left, left_grip = np.concatenate([self.catch, self.receive]), 1.0 - (k - slid) / (shut - slid)
        elif k <= released:  # hold while the right gripper opens
            left, left_grip = np.concatenate([self.catch, self.receive]), CLOSED
        else:  # pull away, holding it, turning the gripper back upright
            a = min(1.0, (k - released) / away)
            left, left_grip = (
                _blend(self.catch, self.receive, self.catch + [-0.12, 0, 0], IDENTITY, a),
                CLOSED,
            )
        return left, left_grip, right, right_grip


class InsertionExpert(ScheduledExpert):
    """The left arm picks the socket, the right arm the peg (grippers pitched 60 deg down, ACT's
    waypoints); both lift to a meeting point above the table centre. From the lift on, the right
    arm servos the peg's *live* position onto the socket's axis (an integral correction of its
    target) while the planned gap closes until the peg touches the pin inside the socket (reward 4).

    Why servoing: the grasps are never exactly centred, and with ACT's open-loop waypoints the peg
    arrives 1-1.6 cm below the socket's axis, outside its 8 mm clearance (0/10 seeds); servoing
    on the privileged object poses makes it 40/40 at this pace, first success by step ~280.
    """

    pace = 0.75
    meet = np.array([0.0, 0.5, 0.15])
    gain = 0.05  # of the remaining peg-to-goal error added to the target per step
    gap_start, gap_end = 0.2, 0.07  # peg centre ahead of the socket centre; the pin is touched at 0.10
    # Anti-windup: once the peg rests on the pin the x error can no longer shrink; an unbounded
    # integral would drive the target away until the IK folds the wrist onto its other branch.
    max_correction = np.array([0.16, 0.04, 0.04])

    def __init__(self, env_state: np.ndarray, left_start: np.ndarray, right_start: np.ndarray) -> None:
        at = self._at
        peg, socket = np.array(env_state[:3], float), np.array(env_state[7:10], float)
        grasp = np.array([0.0, 0.0, -0.03])  # below the spawn height: the objects settle on the table
        above = np.array([0.0, 0.0, 0.08])
        left_q, right_q = axis_angle((0, 1, 0), 60), axis_angle((0, 1, 0), -60)
        m = self.meet

        def arm(start: np.ndarray, obj: np.ndarray, q: np.ndarray, side: float) -> Waypoints:
            return Waypoints(
                [
                    (0, start[:3], start[3:], CLOSED),
                    (at(120), obj + above, q, OPEN),
                    (at(170), obj + grasp, q, OPEN),
                    (at(220), obj + grasp, q, CLOSED),
                    (at(285), m + [side * 0.1, 0, 0], q, CLOSED),  # meet, 0.2 m apart
                    (at(400), m + [side * 0.1, 0, 0], q, CLOSED),
                ]
            )

        self.left, self.right = arm(left_start, socket, left_q, -1.0), arm(right_start, peg, right_q, 1.0)
        self.servo_from, self.close_from, self.close_to = at(250), at(285), at(360)
        self.correction = np.zeros(3)

    def __call__(self, t: int, env_state: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, float]:
        left, left_grip = self.left(t)
        right, right_grip = self.right(t)
        if t >= self.servo_from:
            a = float(np.clip((t - self.close_from) / (self.close_to - self.close_from), 0.0, 1.0))
            gap = self.gap_start + a * (self.gap_end - self.gap_start)
            peg, socket = env_state[:3], env_state[7:10]
            self.correction += self.gain * (socket + [gap, 0.0, 0.0] - peg)
            np.clip(self.correction, -self.max_correction, self.max_correction, out=self.correction)
            right = np.concatenate([right[:3] + self.correction, right[3:]])
        return left, left_grip, right, right_grip


EXPERTS = {"transfer_cube": TransferCubeExpert, "insertion": InsertionExpert}


def make_expert(scene: AlohaScene) -> Callable[[dict[str, Any]], np.ndarray]:
    """The task's expert for the episode ``scene`` was just reset to: ``expert(obs) -> (14,)``."""
    if scene.task.name not in EXPERTS:
        raise SimError(f"no scripted expert for task {scene.task.name!r} (available: {sorted(EXPERTS)})")
    ik = ArmIK(scene.physics.model.ptr, scene.physics.data.qpos)
    left_start, right_start = ik.tcp_poses()
    plan = EXPERTS[scene.task.name](scene.env_state, left_start, right_start)
    step = 0

    def expert(obs: dict[str, Any]) -> np.ndarray:
        nonlocal step
        left, left_grip, right, right_grip = plan(step, scene.env_state)
        step += 1
        arms = ik.solve(left, right)
        return np.concatenate([arms[:6], [left_grip], arms[6:], [right_grip]]).astype(np.float32)

    return expert


def make_chunk_expert(scene: AlohaScene, chunk_length: int) -> Callable[[int], np.ndarray]:
    """The expert as a chunk policy, a control for chunked and delayed execution: ``chunks(t)`` ->
    (chunk_length, 14), the actions the per-step expert would take from step ``t`` of its schedule
    on if the objects stayed where they are now (a chunk is open loop, like a learned policy's).
    The caller advances ``t`` by the actions it executed (not by the steps it waited: a paused
    robot's schedule pauses too). Its planner and IK state after each planned step are kept, so
    the next chunk, from any step this one covered, continues from exactly there."""
    if scene.task.name not in EXPERTS:
        raise SimError(f"no scripted expert for task {scene.task.name!r} (available: {sorted(EXPERTS)})")
    ik = ArmIK(scene.physics.model.ptr, scene.physics.data.qpos)
    left_start, right_start = ik.tcp_poses()
    plan = EXPERTS[scene.task.name](scene.env_state, left_start, right_start)
    after: dict[int, tuple[Any, np.ndarray]] = {-1: (plan, ik.q.copy())}  # step -> (planner, IK solution)

    def chunks(step: int) -> np.ndarray:
        planner, q = after[max(k for k in after if k < step)]
        planner, ik.q = copy.deepcopy(planner), q.copy()
        env_state = scene.env_state
        out = []
        for t in range(step, step + chunk_length):
            left, left_grip, right, right_grip = planner(t, env_state)
            arms = ik.solve(left, right)
            after[t] = (copy.deepcopy(planner), ik.q.copy())
            out.append(np.concatenate([arms[:6], [left_grip], arms[6:], [right_grip]]))
        for k in [k for k in after if k < step - 1]:
            del after[k]
        return np.asarray(out, np.float32)

    return chunks
