"""Inverse kinematics for the two ViperX arms: gripper (TCP) pose targets -> joint targets.

The TCP is the point between the fingers that gym-aloha's end-effector scenes weld to a mocap body
(about 13.5 cm ahead of ``gripper_link``); its offset is read from those scenes' weld constraint,
so a scripted expert written in TCP poses drives the joint-position scene directly.

Solver: a few damped-least-squares iterations per control step, warm-started from the previous
solution, on a scratch ``MjData`` (the simulated robot is never touched). The posture term pulls
``forearm_roll`` and ``wrist_rotate`` towards 0. Without it, near ``wrist_angle = 0`` these two
axes align (a singularity) and the solver drifts onto the equivalent branch (roll + pi,
-wrist_angle, rotate + pi): the same gripper pose with actions that jump by pi between episodes,
a bimodal target that a regression policy averages into nonsense.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from dit4dit_npu.sim.backend import import_mujoco

mujoco = import_mujoco()

ARMS = ("vx300s_left", "vx300s_right")
ARM_DOFS = (np.arange(0, 6), np.arange(8, 14))  # qpos index == dof index for these hinges
ROBOT_QPOS = 16  # two arms x (6 joints + 2 finger slides); objects follow
EE_SCENE = "bimanual_viperx_end_effector_transfer_cube.xml"
POSTURE_MASK = np.array([0, 0, 0, 1, 0, 1.0])  # forearm_roll, wrist_rotate


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.empty(4)
    mujoco.mju_mulQuat(out, np.asarray(a, float), np.asarray(b, float))
    return out


def quat_conj(q: np.ndarray) -> np.ndarray:
    return np.array([q[0], -q[1], -q[2], -q[3]])


def quat_rotate(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    out = np.empty(3)
    mujoco.mju_rotVecQuat(out, np.asarray(v, float), np.asarray(q, float))
    return out


def axis_angle(axis: tuple[float, float, float], degrees: float) -> np.ndarray:
    """(w, x, y, z) quaternion of a rotation by ``degrees`` about ``axis``."""
    axis_n = np.asarray(axis, float) / np.linalg.norm(axis)
    half = np.deg2rad(degrees) / 2
    return np.concatenate([[np.cos(half)], np.sin(half) * axis_n])


@lru_cache(maxsize=1)
def tcp_offsets() -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Per arm, the pose (pos, quat) of ``gripper_link`` in the TCP frame, from the EE scene's
    mocap weld (MuJoCo computes the weld's relative pose from the model's initial configuration)."""
    from gym_aloha.constants import ASSETS_DIR

    m = mujoco.MjModel.from_xml_path(str(ASSETS_DIR / EE_SCENE))
    out = []
    for arm in ARMS:
        body = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, f"{arm}/gripper_link")
        (eq,) = [e for e in range(m.neq) if m.eq_obj2id[e] == body]
        out.append((m.eq_data[eq, 3:6].copy(), m.eq_data[eq, 6:10].copy()))
    return tuple(out)


class ArmIK:
    """``solve(left_pose, right_pose) -> (12,)`` arm joint targets; poses are (xyz, quat) of the TCPs."""

    def __init__(
        self,
        model: mujoco.MjModel,
        qpos: np.ndarray,
        iters: int = 8,
        damping: float = 1e-4,
        posture: float = 1e-3,
    ) -> None:
        self.m = model
        self.d = mujoco.MjData(model)
        self.iters, self.damping, self.posture = iters, damping, posture
        self.bodies = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, f"{a}/gripper_link") for a in ARMS]
        self.lo = model.jnt_range[:ROBOT_QPOS, 0].copy()
        self.hi = model.jnt_range[:ROBOT_QPOS, 1].copy()
        self.q = np.array(qpos[:ROBOT_QPOS], float)  # warm start: the robot's current configuration

    def tcp_poses(self) -> list[np.ndarray]:
        """The TCP poses (7-d: xyz, quat) of the current solution (at construction: the robot's)."""
        self._kinematics()
        out = []
        for body, (rel_pos, rel_quat) in zip(self.bodies, tcp_offsets()):
            quat = quat_mul(self.d.xquat[body], quat_conj(rel_quat))
            out.append(np.concatenate([self.d.xpos[body] - quat_rotate(quat, rel_pos), quat]))
        return out

    def _kinematics(self) -> None:
        self.d.qpos[:ROBOT_QPOS] = self.q
        mujoco.mj_kinematics(self.m, self.d)
        mujoco.mj_comPos(self.m, self.d)  # needed by mj_jacBody

    def solve(self, *tcp_targets: np.ndarray) -> np.ndarray:
        # TCP target -> gripper_link target (the link is what the Jacobian is taken of).
        goals = []
        for target, (rel_pos, rel_quat) in zip(tcp_targets, tcp_offsets()):
            pos, quat = target[:3], target[3:7]
            goals.append((pos + quat_rotate(quat, rel_pos), quat_mul(quat, rel_quat)))
        jacp, jacr = np.zeros((3, self.m.nv)), np.zeros((3, self.m.nv))
        rot_err, dq, inv = np.zeros(3), np.zeros(4), np.zeros(4)
        damping = self.damping * np.eye(6) + self.posture * np.diag(POSTURE_MASK)
        for _ in range(self.iters):
            self._kinematics()
            for body, dofs, (goal_pos, goal_quat) in zip(self.bodies, ARM_DOFS, goals):
                mujoco.mju_negQuat(inv, self.d.xquat[body])
                mujoco.mju_mulQuat(dq, goal_quat, inv)
                mujoco.mju_quat2Vel(rot_err, dq, 1.0)
                err = np.concatenate([goal_pos - self.d.xpos[body], rot_err])
                mujoco.mj_jacBody(self.m, self.d, jacp, jacr, body)
                jac = np.concatenate([jacp[:, dofs], jacr[:, dofs]])
                # min |J dq - err|^2 + damping |dq|^2 + posture |q_roll + dq_roll|^2
                rhs = jac.T @ err - self.posture * POSTURE_MASK * self.q[dofs]
                self.q[dofs] += np.linalg.solve(jac.T @ jac + damping, rhs)
            self.q = np.clip(self.q, self.lo, self.hi)
        return np.concatenate([self.q[ARM_DOFS[0]], self.q[ARM_DOFS[1]]])
