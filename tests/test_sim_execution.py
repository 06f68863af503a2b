"""Chunked execution in the closed-loop eval (sim/execution.py, rollout.py): the jerk measure, the
artificial delay on the control clock, the scripted expert as a chunk policy (the control), and
real-time chunking through a real policy folder."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gym_aloha", reason="simulation extra not installed (pip install -e '.[sim]')")

from dit4dit_npu.sim.execution import FPS, Execution, boundary_jerk, jerk  # noqa: E402
from dit4dit_npu.sim.rollout import run_episode  # noqa: E402


def test_jerk_is_the_third_difference_of_the_arm_joints():
    t = np.arange(20, dtype=np.float64)
    actions = np.zeros((20, 14))
    actions[:, 0] = t**3 / 6  # third difference 1 per step^3
    actions[:, 6] = np.arange(20) % 2  # a gripper toggling: not a joint, not counted
    j = jerk(actions)
    assert j[:3].tolist() == [0, 0, 0]
    np.testing.assert_allclose(j[3:], FPS**3)
    jumped = actions.copy()
    jumped[10:, 1] += 0.1  # a step at 10: the differences at 10, 11, 12 see it
    stats = boundary_jerk(jumped, [10, 1])  # 1 is too early to have a jerk: left out
    assert stats["boundaries"] == 1
    # the differences at 10, 11, 12 are 0.1, -0.2, 0.1 on that joint, beside the steady 1
    assert stats["boundary_jerk"] == pytest.approx(np.hypot(1.0, 0.2) * FPS**3, rel=1e-6)
    assert stats["interior_jerk"] == pytest.approx(FPS**3, rel=1e-6)


@pytest.mark.slow  # over 4 s of one core: the full tier (the fast tier keeps to 3 minutes)
def test_expert_chunks_succeed_and_a_sync_delay_pauses_the_robot():
    from dit4dit_npu.sim.policies import ExpertChunkPolicy
    from dit4dit_npu.sim.scene import AlohaScene

    with AlohaScene("transfer_cube", (32, 40)) as scene:
        plain = run_episode(scene, ExpertChunkPolicy(), 0, 400, None)
        assert plain["success"] and plain["policy_calls"] == -(-plain["steps"] // 16)
        slow = run_episode(scene, ExpertChunkPolicy(), 0, 400, None, execution=Execution("sync", 100.0))
        # the robot stands still 5 steps per chunk: the same plan finishes later
        assert slow["success"] and slow["steps_to_success"] > plain["steps_to_success"]
        assert slow["boundary_jerk"] > slow["interior_jerk"]  # stop-and-go at every chunk
        smooth = run_episode(scene, ExpertChunkPolicy(), 0, 400, 8, execution=Execution("ensemble", 100.0))
        assert smooth["success"]


@pytest.mark.slow
def test_rtc_through_a_policy_folder_inpaints_the_executed_prefix():
    from policy_fixtures import shared_tiny_setup

    from dit4dit_npu.sim.policies import FolderPolicy
    from dit4dit_npu.sim.scene import AlohaScene

    class Recording(FolderPolicy):
        """The real folder policy, keeping every request and the chunk it answered."""

        def act(self, obs, request=None):
            chunk = super().act(obs, request)
            self.calls.append((request, chunk))
            return chunk

    gaps = {}
    with AlohaScene("transfer_cube", (32, 32)) as scene:
        for mode in ("async", "rtc"):
            # real tiny model, 8-step chunks; trained on the RoboTwin demo data, so the ALOHA scene's
            # states lie outside its training range: allowed, the loop is what is tested here
            policy = Recording(str(shared_tiny_setup().policy_dir), allow_out_of_range=True)
            policy.calls = []
            r = run_episode(scene, policy, 0, 40, 4, execution=Execution(mode, 60.0))  # d = 3, s = 4
            assert r["error"] is None and r["steps"] == 40 and r["boundaries"] >= 6
            later = policy.calls[1:]
            assert all(req.executed == 4 for req, _ in later)
            if mode == "rtc":
                assert all(req.inference_delay == 3 and len(req.prev_chunk) == 4 for req, _ in later)
            # how far each new chunk's first d actions are from what the robot executes meanwhile
            previous = [c for _, c in policy.calls[:-1]]
            gaps[mode] = np.mean([np.abs(c[:3] - p[4:7]).max() for (_, c), p in zip(later, previous)])
    # the untrained model's chunks disagree wildly; RTC's new chunks start where the old ones are
    assert gaps["rtc"] < 0.1 * gaps["async"], gaps
