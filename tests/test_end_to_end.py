"""Every state encoding and every training mode, with padded widths: train 2 steps, export, act.

These combinations are where the observation/action transforms used to have several owners
(sin/cos state could not train; max_action_dim > action_dim could not train). Each state
encoding and each training mode is trained at least once (pairwise, not the 3 x 3 grid: the
encodings are PolicyIO's and the modes the model's; they meet only in the head's input width,
which every case pads). One training run per case (in this process,
``train_runs.train_here``) with the tiny config's default DeepSpeed ZeRO-2, so each mode is also
a DeepSpeed run; then the exported policy folder is loaded and driven through the public API
with robot-unit inputs. The joint case trains with the video loss scaled to 0 (lambda = 0):
the total is then the action loss alone.
"""

from __future__ import annotations

import numpy as np
import pytest
from train_runs import TINY, VIDEO_CLIPS, run_training
from train_runs import tiny_overrides as base_overrides

from dit4dit_npu.config import load_config
from dit4dit_npu.train.metrics import read_metrics

pytestmark = pytest.mark.slow

# Widths wider than the robot's: 14-d state (28 encoded as sin/cos) and 14-d actions.
MAX_STATE, MAX_ACTION = 32, 16
# joint mode with the video loss weighted 0 and detached features leaves the transformer without a
# loss, which a run refuses unless told to insist: this case insists (the override's path end to end)
LAMBDA_0 = {"trainer.loss_scale.future_video": "0.0", "trainer.learning_rate": "{base: 0.001, action_model: 0.001}",
            "trainer.allow_untrained_modules": "true"}
CASES = [("sincos", "joint"), ("mean_std", "action"), ("min_max", "video")]


@pytest.mark.parametrize("state_norm, training", CASES, ids=[f"{s}-{t}" for s, t in CASES])
def test_train_export_predict(tmp_path, demo_root, state_norm: str, training: str) -> None:
    overrides = base_overrides(tmp_path, demo_root, **{
        "datasets.vla_data.state_norm": state_norm,
        "datasets.vla_data.max_state_dim": MAX_STATE,
        "datasets.vla_data.max_action_dim": MAX_ACTION,
        "framework.cosmos25.training": training,
        "trainer.max_train_steps": 2,
        "trainer.eval_samples": 2,
        **(LAMBDA_0 if training == "joint" else {}),
        **VIDEO_CLIPS,  # the video mode needs a future frame
    })
    run_dir = run_training(overrides)

    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "total_loss" in r]
    assert len(rows) == 2 and all(r["total_loss"] is not None for r in rows)
    if training == "action":  # no video pass
        assert all(r["video_loss"] == 0.0 for r in rows)
    elif training == "video":  # no action head
        assert all(r["action_loss"] == 0.0 for r in rows)
    else:  # lambda = 0: the total is the action loss alone
        assert all(abs(r["total_loss"] - r["action_loss"]) < 1e-6 for r in rows)

    from dit4dit_npu.data import LeRobotDataset, RoboTwinDataset
    from dit4dit_npu.policy import DiT4DiTPolicy

    assert run_dir == load_config(TINY, overrides).run_dir
    policy = DiT4DiTPolicy.from_pretrained(run_dir)  # the latest checkpoint's exported folder
    spec = policy.io.spec
    assert (spec.state_width, spec.action_width) == (MAX_STATE, MAX_ACTION)
    assert policy.io.action_mask.tolist() == [True] * 14 + [False] * 2

    ds = RoboTwinDataset([LeRobotDataset(demo_root / "robotwin_demo", image_size=policy.image_size)], policy.io)
    s = ds.raw_sample(5)
    obs = {key: s.views[0, v] for v, key in enumerate(policy.camera_keys)}
    obs.update(state=s.state, instruction=s.instruction)
    if training == "video":  # no action head: a clear error, not a crash
        with pytest.raises(ValueError, match="needs an action head"):
            policy.predict_action(obs, seed=0)
        return
    actions = policy.predict_action(obs, seed=0)
    assert actions.shape == (8, 14) and actions.dtype == np.float32 and np.isfinite(actions).all()
    np.testing.assert_array_equal(actions, policy.predict_action(obs, seed=0))
