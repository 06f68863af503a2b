"""``trainer.init_from``: a video-only pretraining run's transformer starts an action run (video
pretraining, then few-demo training), on the tiny model in this process; bad folders are one line before the run
folder exists. Runs: the session's ``full_run`` (joint, 4 steps), one 2-step video-only run and
one 2-step action run from it (~3 s each here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from safetensors.torch import load_file
from train_runs import TINY, VIDEO_CLIPS, run_training, tiny_overrides, train_here

from dit4dit_npu.config import load_config

TRANSFORMER = "backbone.transformer."
TWO_STEPS = {"trainer.max_train_steps": 2, "trainer.save_interval": 2, "trainer.eval_interval": 2}


def weights(run_dir: Path) -> dict:
    return load_file(str(sorted((run_dir / "checkpoints").glob("step_*"))[-1] / "policy" / "model.safetensors"))


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, demo_root) -> Path:
    """Stage 1: the video loss only (no action head), 5-frame clips."""
    root = tmp_path_factory.mktemp("pretrain")
    return run_training(tiny_overrides(root, demo_root, run_id="video_only", **TWO_STEPS, **VIDEO_CLIPS,
                                       **{"framework.cosmos25.training": "video"}))


@pytest.mark.slow  # over 4 s of one core: the full tier (the fast tier keeps to 3 minutes)
def test_an_action_run_starts_from_a_video_pretrained_transformer(pretrained, tmp_path, demo_root, capfd):
    video = weights(pretrained)
    assert video and all(k.startswith(TRANSFORMER) for k in video)  # the transformer alone
    # Stage 2 with the transformer frozen, so its exported weights are exactly what it started from.
    over = tiny_overrides(tmp_path, demo_root, run_id="from_video", **TWO_STEPS,
                          **{"trainer.init_from": str(pretrained), "trainer.freeze_modules": "[backbone.transformer]"})
    r = train_here(over, capfd)
    assert r.returncode == 0, r.stderr[-3000:]
    said = [line for line in r.stdout.splitlines() if line.startswith("trainer.init_from:")]
    assert said and re.search(rf"backbone.transformer \({len(video)} tensors\) from .*video_only.*step 2.*action_model at its initialization", said[0]), said
    tuned = weights(load_config(TINY, over).run_dir)
    assert all(tuned[k].equal(v) for k, v in video.items())
    assert any(k.startswith("action_model.") for k in tuned)

    # The control: the same run without init_from starts from the seed's random transformer, which
    # the pretraining's 2 steps moved away from.
    control = run_training(tiny_overrides(tmp_path / "control", demo_root, run_id="control", **TWO_STEPS,
                                          **{"trainer.freeze_modules": "[backbone.transformer]"}))
    assert not all(weights(control)[k].equal(v) for k, v in video.items())

    # A resume holds its own weights: init_from is ignored, and said so.
    r = train_here([*over, "trainer.resume=auto"], capfd)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "trainer.init_from ignored: resuming from" in r.stdout


@pytest.mark.parametrize("extra, pattern", [
    ({"trainer.init_from": "{tmp}/no_such_run"}, r"trainer.init_from: policy folder not found: .*no_such_run"),
    ({"trainer.init_from": "{tmp}"}, r"trainer.init_from: .* is not a policy folder"),
    # the tiny VAE's seed is its identity: a transformer trained on other latents is refused
    ({"trainer.init_from": "{pretrained}", "framework.cosmos25.tiny.seed": 7},
     r"trainer.init_from: .*video_only.* was trained on the latents of another VAE \(tiny:vae\d+:seed0; this run.s: tiny:vae\d+:seed7\)"),
    ({"trainer.init_from": "{pretrained}", "framework.cosmos25.tiny.vae_latents_std": "[" + ", ".join(["0.5"] * 16) + "]"},
     r"trainer.init_from: .*video_only.* normalized its latents with another framework.cosmos25.tiny.vae_latents_std"),
])
def test_bad_folders_are_one_line_before_the_run_folder(pretrained, tmp_path, demo_root, capfd, extra, pattern):
    extra = {k: str(v).format(tmp=tmp_path, pretrained=pretrained) for k, v in extra.items()}
    r = train_here(tiny_overrides(tmp_path / "runs", demo_root, **extra), capfd)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert re.search(pattern, r.stderr.strip().splitlines()[-1]), r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "runs").exists()  # nothing written


def test_weights_of_another_shape_are_one_line(full_run, tmp_path, demo_root, capfd):
    """A joint policy's action head into a head of another width (another embodiment's, say)."""
    r = train_here(tiny_overrides(tmp_path, demo_root, run_id="wider", **{
        "trainer.init_from": str(full_run), "framework.action_model.hidden_size": 64}), capfd)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert re.search(r"trainer.init_from: .*model.safetensors: action_model\.\S+ has shape \(.*\), this model's \(", last), last
    assert not list((tmp_path / "wider").glob("checkpoints/step_*"))


def test_a_policy_of_fewer_blocks_names_the_blocks_that_start_fresh(tmp_path, demo_root):
    """A 3-block policy into a 5-block model: every tensor fits, so it is accepted, and the line said
    the transformer came from the policy and kept its initialization at once, never which blocks."""
    import torch
    from policy_fixtures import build_tiny_setup, tiny_config

    from dit4dit_npu.train.init_from import check_init_from, init_weights
    from dit4dit_npu.weights import build_dit4dit

    shallow = build_tiny_setup(tmp_path / "shallow", "framework.cosmos25.tiny.num_layers=3", data_root=demo_root)
    cfg = tiny_config(tmp_path / "deep", "framework.cosmos25.tiny.num_layers=5",
                      f"trainer.init_from={shallow.policy_dir}", data_root=demo_root)
    model = build_dit4dit(cfg, shallow.data.io.spec)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    line = init_weights(model, *check_init_from(cfg))
    held = load_file(str(shallow.policy_dir / "model.safetensors"))
    n_head = sum(k.startswith("action_model.") for k in held)
    n_transformer = sum(k.startswith(TRANSFORMER) for k in held)
    total = sum(n.startswith(TRANSFORMER) for n, _ in model.named_parameters())
    assert line == (
        f"trainer.init_from: action_model ({n_head} tensors), backbone.transformer ({n_transformer} of its {total} "
        f"tensors) from {shallow.policy_dir} (step 0); backbone.transformer.transformer_blocks.3-4 at their "
        "initialization (not in the policy)"
    )
    params = dict(model.named_parameters())
    assert all(torch.equal(params[k], v) for k, v in held.items())
    fresh = [n for n in params if n.startswith(TRANSFORMER + "transformer_blocks.3.")]
    assert fresh and all(torch.equal(params[n], before[n]) for n in fresh)
