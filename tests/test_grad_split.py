"""``python -m dit4dit_npu.train.grad_split``: the action and video losses' gradients apart, on a
real tiny joint run (DeepSpeed ZeRO-2 in this process, 2 steps, its checkpoint's exported policy)."""

from __future__ import annotations

import math

import pytest
import torch
from train_runs import VIDEO_CLIPS, run_training, tiny_overrides

from dit4dit_npu.train import grad_split
from dit4dit_npu.train.ops_cli import grad_split_main


def test_parts_follow_the_feature_layer():
    assert grad_split.part_of("action_model.model.blocks.0.attn.to_q.weight", 2) == "action head"
    assert grad_split.part_of("backbone.transformer.transformer_blocks.2.attn1.to_q.weight", 2) == "blocks 0..L"
    assert grad_split.part_of("backbone.transformer.transformer_blocks.3.attn1.to_q.weight", 2) == "blocks L+1.."
    assert grad_split.part_of("backbone.transformer.transformer_blocks.12.ff.net.0.proj.weight", 2) == "blocks L+1.."
    assert grad_split.part_of("backbone.transformer.proj_out.weight", 2) == "output layers"
    assert grad_split.part_of("backbone.transformer.norm_out.linear_1.weight", 2) == "output layers"
    assert grad_split.part_of("backbone.transformer.patch_embed.proj.weight", 2) == "embeddings"


def test_bad_arguments_are_one_line(tmp_path, capsys):
    assert grad_split_main(["--run", str(tmp_path)]) == 2
    assert "no config.yaml there" in capsys.readouterr().err
    assert grad_split_main(["--run", str(tmp_path), "--batches", "0"]) == 2
    assert "--batches: expected a positive integer" in capsys.readouterr().err
    (tmp_path / "config.yaml").write_text("run_id: x\n")
    assert grad_split_main(["--run", str(tmp_path)]) == 2
    assert "no checkpoints/step_*/policy there" in capsys.readouterr().err


def _joint_run(tmp_path, demo_root, backprop: bool):
    return run_training(tiny_overrides(tmp_path, demo_root, **{
        **VIDEO_CLIPS, "framework.cosmos25.backprop_action_to_backbone": str(backprop).lower(),
        "trainer.max_train_steps": "2", "trainer.loss_scale.future_video": "0.3",
    }))


def _rows(record):
    return {r["part"]: r for r in record["rows"]}


@pytest.mark.slow
def test_split_with_the_action_loss_into_the_backbone(tmp_path, demo_root, capsys):
    run = _joint_run(tmp_path, demo_root, backprop=True)
    with pytest.raises(grad_split.GradSplitError, match="--checkpoint step_9"):
        grad_split.checkpoint_dirs(run, ["step_9"])
    [rec] = grad_split.run_split(run, ["step_000002"], count=1, seed=3)
    rows = _rows(rec)
    head, shared, after, out = rows["action head"], rows["shared"], rows["blocks L+1.."], rows["output layers"]
    # the video loss never reaches the head; the action loss never reaches past the feature block
    assert head["action_norm"] > 0 and head["video_norm"] == 0 and head["cosine"] is None
    assert after["action_norm"] == 0 and after["video_norm"] > 0
    assert out["action_norm"] == 0 and out["video_norm"] > 0
    assert shared["action_norm"] > 0 and shared["video_norm"] > 0 and -1 <= shared["cosine"] <= 1
    # with one batch the parts add up (squared norms) to the whole
    for key in ("action_norm", "video_norm"):
        parts = sum(rows[p][key] ** 2 for p in ("action head", "embeddings", "blocks 0..L", "blocks L+1..", "output layers"))
        assert parts == pytest.approx(rows["all"][key] ** 2, rel=1e-5)

    # against the trainer's own objective: one backward of action + w * video, the same batch and
    # noise, has the norm that the two gradients and their cosine give
    cfg, data = grad_split.load_run(run)
    model = grad_split.model_at(cfg, data, run / "checkpoints/step_000002")
    [batch] = grad_split.batches(data, 1, cfg.datasets.vla_data.per_device_batch_size, 3)
    torch.manual_seed(3 * 1_000_003)
    out = model(batch)
    (out["action_loss"] + 0.3 * out["video_loss"]).backward()
    total = math.sqrt(sum(float((p.grad ** 2).sum()) for p in model.parameters() if p.grad is not None))
    a, v, c = rows["all"]["action_norm"], rows["all"]["video_norm"], rows["all"]["cosine"]
    assert total == pytest.approx(math.sqrt(a * a + v * v + 2 * c * a * v), rel=1e-4)
    assert out["action_loss"].item() == pytest.approx(rec["action_loss"], rel=1e-6)


@pytest.mark.slow
def test_split_with_detached_features_and_the_command(tmp_path, demo_root, capsys):
    run = _joint_run(tmp_path, demo_root, backprop=False)
    out_json = tmp_path / "split.json"
    assert grad_split_main(["--run", str(run), "--batches", "2", "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out
    assert "action loss into the backbone False" in printed and "| shared |" in printed
    import json

    [rec] = json.loads(out_json.read_text())
    shared = _rows(rec)["shared"]
    # the features are computed without grad: only the video loss trains the backbone
    assert shared["action_norm"] == 0 and shared["video_norm"] > 0 and shared["cosine"] is None
    assert shared["ratio"] is None  # inf: no action gradient there
