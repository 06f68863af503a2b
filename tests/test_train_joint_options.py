"""The cheaper joint-step options through the real trainer (``train_here``: DeepSpeed ZeRO-2 in
this process, the tiny config's 9-frame joint clips, 4 steps): one smoke per option. Their maths
is checked at the model level in ``tests/test_joint_cost_options.py``."""

from __future__ import annotations

import math

import pytest
import torch
from train_runs import TINY, VIDEO_CLIPS, run_training, tiny_overrides, train_here

from dit4dit_npu.config import load_config
from dit4dit_npu.train.metrics import read_metrics
from dit4dit_npu.weights.testing import make_batch


def _rows(run_dir):
    return {r["step"]: r for r in read_metrics(run_dir / "metrics.jsonl") if "total_loss" in r}


def _train(tmp_path, demo_root, **options) -> dict[int, dict]:
    run_dir = run_training(tiny_overrides(tmp_path, demo_root, **{**VIDEO_CLIPS, **options}))
    rows = _rows(run_dir)
    assert sorted(rows) == [1, 2, 3, 4]
    assert all(math.isfinite(r[k]) for r in rows.values() for k in ("action_loss", "video_loss", "total_loss"))
    return rows, run_dir


@pytest.mark.slow
def test_one_pass_trains_exports_and_predicts(tmp_path, demo_root):
    from dit4dit_npu.policy import DiT4DiTPolicy

    rows, run_dir = _train(tmp_path, demo_root, **{
        "framework.cosmos25.one_pass.enabled": "true",
        "framework.cosmos25.one_pass.condition_head_on_noise_level": "true",
        "framework.cosmos25.backprop_action_to_backbone": "true",
    })
    assert all(r["video_loss"] > 0 and r["action_loss"] > 0 for r in rows.values())
    policy = DiT4DiTPolicy.from_pretrained(run_dir)
    model = policy.model
    assert model.cfg.one_pass and model.action_model.noise_level_embedder is not None
    # the trained embedding left its zero init, and inference feeds it the feature sigma
    assert model.action_model.noise_level_embedder.linear_2.weight.abs().sum() > 0
    obs = make_batch(policy.io.spec, training=False)
    obs.instruction = [model.prompt_cache.instructions[0]] * len(obs.instruction)  # the demo data's task
    actions = model.predict_action(obs, seed=0)
    assert torch.isfinite(actions).all()


@pytest.mark.slow
def test_video_loss_every_second_step(tmp_path, demo_root):
    rows, _ = _train(tmp_path, demo_root, **{"trainer.video_loss_interval": "2"})
    # logged step s is optimizer update s - 1: updates 0 and 2 have the video loss, 1 and 3 not
    assert rows[1]["video_loss"] > 0 and rows[3]["video_loss"] > 0
    assert rows[2]["video_loss"] == 0 and rows[4]["video_loss"] == 0
    assert all(r["action_loss"] > 0 for r in rows.values())


@pytest.mark.slow
def test_video_loss_on_the_middle_half_of_the_training(tmp_path, demo_root, capfd):
    overrides = tiny_overrides(tmp_path, demo_root, **{**VIDEO_CLIPS, "trainer.video_loss_span": "[0.25, 0.75]"})
    r = train_here(overrides, capfd)
    assert r.returncode == 0, r.stdout[-3000:]
    rows = _rows(load_config(TINY, overrides).run_dir)
    # 4 updates: update s - 1 (logged as step s) is (s - 1) / 4 of the training: 0.25 and 0.5 have it
    assert rows[2]["video_loss"] > 0 and rows[3]["video_loss"] > 0
    assert rows[1]["video_loss"] == 0 and rows[4]["video_loss"] == 0
    assert all(r["action_loss"] > 0 for r in rows.values())
    said = [line for line in r.stdout.splitlines() if ": the video loss " in line]
    assert said == [f"step {s}: the video loss {on}: {where} trainer.video_loss_span=[0.25, 0.75]"
                    for s, on, where in ((1, "off", "outside"), (2, "on", "inside"), (4, "off", "outside"))], said


@pytest.mark.slow
def test_video_loss_on_one_future_latent_frame(tmp_path, demo_root):
    # all 9 frames of the clip (3 latent frames: 2 future), of which the video loss reads the first
    rows, _ = _train(tmp_path, demo_root, **{"datasets.vla_data.action_video_freq_ratio": "1",
                                             "framework.cosmos25.video_loss_future_frames": "1"})
    assert all(r["video_loss"] > 0 for r in rows.values())
