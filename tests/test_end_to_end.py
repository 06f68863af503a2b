"""Every state encoding x every training mode, with padded widths: train 2 steps, export, act.

These combinations are where the observation/action transforms used to have several owners
(sin/cos state could not train; max_action_dim > action_dim could not train). One real training
process per case (accelerate, no DeepSpeed: ZeRO is covered in test_train.py), then the exported
policy folder is loaded and driven through the public API with robot-unit inputs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dit4dit_npu.config import load_config

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs/robotwin/dit4dit_robotwin_tiny.yaml"
ENV = {**os.environ, "DIT4DIT_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
# Widths wider than the robot's: 14-d state (28 encoded as sin/cos) and 14-d actions.
MAX_STATE, MAX_ACTION = 32, 16


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory) -> Path:
    from dit4dit_npu.data.demo import write_demo_dataset

    root = tmp_path_factory.mktemp("data")
    write_demo_dataset(root / "robotwin_demo", num_episodes=6, episode_length=24)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("training", ["joint", "action", "video"])
@pytest.mark.parametrize("state_norm", ["min_max", "mean_std", "sincos"])
def test_train_export_predict(tmp_path: Path, demo_root: Path, state_norm: str, training: str) -> None:
    overrides = [
        f"run_root_dir={tmp_path}",
        f"datasets.vla_data.data_root_dir={demo_root}",
        "datasets.vla_data.generate_demo_if_missing=false",
        f"datasets.vla_data.state_norm={state_norm}",
        f"datasets.vla_data.max_state_dim={MAX_STATE}",
        f"datasets.vla_data.max_action_dim={MAX_ACTION}",
        "datasets.vla_data.per_device_batch_size=2",
        f"framework.cosmos25.training={training}",
        "trainer.deepspeed_config=null",
        "trainer.max_train_steps=2",
        "trainer.save_interval=2",
        "trainer.eval_interval=2",
        "trainer.eval_samples=2",
        "trainer.logging_frequency=1",
        "trainer.num_warmup_steps=1",
    ]
    r = subprocess.run(
        [sys.executable, "-m", "dit4dit_npu.train", "--config", str(TINY), *overrides],
        env=ENV, capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]

    from dit4dit_npu.data import LeRobotDataset, RoboTwinDataset
    from dit4dit_npu.policy import DiT4DiTPolicy

    run_dir = load_config(TINY, overrides).run_dir
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
