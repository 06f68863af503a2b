"""``python -m dit4dit_npu.train.grad_split``: the action and video losses' gradients apart, on a
real tiny joint run (DeepSpeed ZeRO-2 in this process, 2 steps, its checkpoint's exported policy)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from train_runs import TINY, VIDEO_CLIPS, run_training, tiny_overrides

from dit4dit_npu.config import load_config, save_config
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
    # torch.manual_seed overflows past 2**63: said before the work, not as its traceback
    assert grad_split_main(["--run", str(tmp_path), "--seed", str(2**32)]) == 2
    assert "--seed: expected an int in [0, 2**32), got 4294967296" in capsys.readouterr().err
    # a folder that does not exist: said before every checkpoint's work, not as a traceback after it
    assert grad_split_main(["--run", str(tmp_path), "--json", str(tmp_path / "no" / "x.json")]) == 2
    assert f"x.json: {tmp_path / 'no'} is not a folder" in capsys.readouterr().err


def _fake_run(tmp_path, overrides: list[str]):
    """A run folder as the tool reads it before any weights: its config.yaml and an empty step folder."""
    run = tmp_path / "run"
    (run / "checkpoints/step_000001/policy").mkdir(parents=True)
    save_config(load_config(TINY, overrides), run / "config.yaml")
    return run


def test_a_run_without_future_frames_is_refused(tmp_path, demo_root, capsys):
    # the tiny config's one-frame clips: a joint run whose video loss is always 0
    run = _fake_run(tmp_path, tiny_overrides(tmp_path, demo_root))
    assert grad_split_main(["--run", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "clips of one frame" in err and "have no future frame" in err, err


def test_data_found_from_another_folder_is_refused_and_none_is_written(tmp_path, demo_root, capsys, monkeypatch):
    # a run whose config names its data relatively (with demo generation on), read from another folder
    overrides = [*tiny_overrides(tmp_path, demo_root, **VIDEO_CLIPS), "datasets.vla_data.data_root_dir=demo_data",
                 "datasets.vla_data.generate_demo_if_missing=true"]
    run = _fake_run(tmp_path, overrides)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert grad_split_main(["--run", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "dataset folder not found: demo_data/robotwin_demo" in err, err
    assert list(elsewhere.iterdir()) == []  # no demo dataset generated there
    # data found, but not what the checkpoint was trained on (its split recorded in fingerprint.json)
    monkeypatch.chdir(tmp_path)
    run = _fake_run(tmp_path / "b", tiny_overrides(tmp_path, demo_root, **VIDEO_CLIPS))
    ckpt = run / "checkpoints/step_000001"
    (ckpt / "fingerprint.json").write_text(json.dumps({"data": {"split": [{"train": [0], "val": [1]}], "policy_io": {}}}))
    assert grad_split_main(["--run", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not what step_000001 was trained on: data_mix[0] train episodes" in err, err


def test_the_header_says_where_the_action_loss_goes_and_whose_weights():
    # one pass without backprop_action_to_backbone detaches the head's features as two passes do
    cfg = load_config(TINY, ["framework.cosmos25.one_pass.enabled=true", "trainer.ema.decay=0.5", *[
        f"{k}={v}" for k, v in VIDEO_CLIPS.items()]])
    line = grad_split.header(TINY, cfg, 2, 0)
    assert "one pass True, action loss into the backbone False" in line
    assert "the EMA's weights (trainer.ema.decay=0.5)" in line


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
    [rec] = json.loads(out_json.read_text())
    shared = _rows(rec)["shared"]
    # the features are computed without grad: only the video loss trains the backbone
    assert shared["action_norm"] == 0 and shared["video_norm"] > 0 and shared["cosine"] is None
    assert shared["ratio"] is None  # inf: no action gradient there


@pytest.mark.slow
def test_one_pass_detached_and_float32_whatever_the_runs_precision(tmp_path, demo_root, capsys):
    run = run_training(tiny_overrides(tmp_path, demo_root, **{
        **VIDEO_CLIPS, "framework.cosmos25.one_pass.enabled": "true", "trainer.max_train_steps": "2",
    }))
    [rec] = grad_split.run_split(run, None, count=1, seed=1)
    assert "one pass True, action loss into the backbone False" in capsys.readouterr().out
    shared = _rows(rec)["shared"]
    assert shared["action_norm"] == 0 and shared["video_norm"] > 0  # one pass detaches the features too
    # the same run read as a bf16 one: its gradients are still float32's (no autocast)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace('mixed_precision: "no"', "mixed_precision: bf16")
                      .replace("mixed_precision: 'no'", "mixed_precision: bf16"))
    assert load_config(config).trainer.mixed_precision == "bf16"
    [bf16] = grad_split.run_split(run, None, count=1, seed=1)
    for a, b in zip(rec["rows"], bf16["rows"]):
        assert b["action_norm"] == pytest.approx(a["action_norm"], rel=1e-6), a["part"]
        assert b["video_norm"] == pytest.approx(a["video_norm"], rel=1e-6), a["part"]
