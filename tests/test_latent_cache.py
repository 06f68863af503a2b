"""The latent cache: encoded by two real ranks, read by the dataset instead of video, the same loss
as the online path, stale caches refused with one line, resumable encode, and a training run."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_runs import VIDEO_CLIPS, train_here

from dit4dit_npu.batch import Batch, BatchError
from dit4dit_npu.config import ConfigError, load_config
from dit4dit_npu.data import DatasetError, build_training_data
from dit4dit_npu.data.cli import encode_latents_main as encode_main
from dit4dit_npu.models.prompt_cache import PromptCache
from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder, vae_identity

# Every test reads the cache the 2-rank `accelerate launch` fixture encodes (the one-rank,
# in-process encode is tested in the fast tier: test_latent_cache_damage.py).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs/robotwin/dit4dit_robotwin_tiny.yaml"
ENV = {**os.environ, "DIT4DIT_DEVICE": "cpu", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
EPISODES, LENGTH = 6, 16  # val_fraction 0.2 -> 5 training episodes of 16 samples


def overrides(root: Path, *extra: str) -> list[str]:
    return [
        f"datasets.vla_data.data_root_dir={root / 'data'}",
        "datasets.vla_data.generate_demo_if_missing=false",
        "datasets.vla_data.num_workers=1",  # the encoder decodes in a loader process
        f"run_root_dir={root / 'runs'}",
        *(f"{k}={v}" for k, v in VIDEO_CLIPS.items()),  # multi-frame clips: the cache holds future frames
        *extra,
    ]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Demo data, and a latent cache encoded by two ranks (a real `accelerate launch`, gloo)."""
    from dit4dit_npu.data.demo import write_demo_dataset

    root = tmp_path_factory.mktemp("latents")
    write_demo_dataset(root / "data" / "robotwin_demo", num_episodes=EPISODES, episode_length=LENGTH)
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--main_process_port", "0", "-m", "dit4dit_npu.data.encode_latents", "--config", str(TINY),
        "--out", str(root / "cache"), "--batch-size", "6", *overrides(root),
    ]
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"encoded {5 * LENGTH} clips (5 episodes) by 2 ranks in " in r.stdout, r.stdout
    return root


def config(root: Path, *extra: str, cached: bool = True):
    cache = [f"datasets.vla_data.latent_cache={root / 'cache'}"] if cached else []
    return load_config(TINY, overrides(root, *cache, *extra))


def cached_data(cfg):
    return build_training_data(cfg, vae_identity=vae_identity(cfg))


def test_two_ranks_encode_every_training_episode_once(root):
    data = build_training_data(config(root, cached=False))
    (fingerprint,) = [p for p in (root / "cache").iterdir() if p.is_dir()]
    files = sorted(p.name for p in fingerprint.glob("episode_*.safetensors"))
    assert files == [f"episode_{e:06d}.safetensors" for e in data.split[str(data.dataset_paths[0])]["train"]]


@pytest.mark.parametrize("training", ["joint", "action"])
def test_cached_batch_has_no_frames_and_gives_the_online_loss(root, training, monkeypatch):
    mode = f"framework.cosmos25.training={training}"
    online, cached = build_training_data(config(root, mode, cached=False)), cached_data(config(root, mode))
    idx = [0, 5, 15, 16, 47, 79]  # episode ends included: clips clamped to the last frame
    b_on = Batch.collate([online.train_dataset[i] for i in idx])
    for ds in cached.train_dataset.datasets:  # training samples from the cache decode no video at all
        monkeypatch.setattr(ds, "frames_at", lambda *a, **k: pytest.fail("decoded video with a latent cache"))
    b_ca = Batch.collate([cached.train_dataset[i] for i in idx])
    monkeypatch.undo()
    assert b_ca.frames is None and b_ca.latents.shape == (6, 16, 2, 4, 12)  # 5 frames -> 2 latent, 32x96 / 8
    assert torch.equal(b_ca.action, b_on.action) and b_ca.instruction == b_on.instruction
    cfg = config(root, mode, cached=False)
    model = build_dit4dit(cfg, online.io.spec)
    prompts = PromptCache()
    prompts.build(sorted(set(b_on.instruction)), build_prompt_encoder(cfg))
    model.set_prompt_cache(prompts)
    # the cache holds exactly the model's own encode (up to the batch composition of the conv kernels)
    torch.testing.assert_close(model.clip_latents(b_ca), model.clip_latents(b_on), rtol=1e-5, atol=1e-5)
    torch.manual_seed(0)
    want = model(b_on)
    torch.manual_seed(0)
    got = model(b_ca)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)
    # the conditioning latent is latent frame 0 of the clip: the frame-0-only encode (causal VAE)
    first = dataclasses.replace(b_on, frames=b_on.frames[:, :1])
    torch.testing.assert_close(model.clip_latents(b_ca)[1], model.backbone.encode_video(
        model.video_input(first.frames)), rtol=1e-5, atol=1e-5)
    # held-out samples keep their frames (evaluation runs predict_action, which encodes frames)
    assert cached.val_dataset[0]["frames"] is not None


def test_batches_with_latents_are_checked(root):
    cfg = config(root, cached=False)
    data = cached_data(config(root))
    batch = Batch.collate([data.train_dataset[i] for i in (0, 1)])
    model = build_dit4dit(cfg, data.io.spec)
    with pytest.raises(BatchError, match=r"batch.latents: expected \(B, 16, 2, 4, 12\)"):
        model._checked(dataclasses.replace(batch, latents=batch.latents[:, :, :1]), training=True)
    sampled = build_dit4dit(config(root, "framework.cosmos25.condition_latent=sample", cached=False), data.io.spec)
    with pytest.raises(BatchError, match="a latent cache stores posterior means"):
        sampled.clip_latents(batch)
    with pytest.raises(ConfigError, match="datasets.vla_data.latent_cache: got .*, expected null with framework.cosmos25.condition_latent='sample'"):
        config(root, "framework.cosmos25.condition_latent=sample")
    with pytest.raises(BatchError, match="only training batches may bring latents"):
        batch.validate(data.io.spec, training=False)
    with pytest.raises(BatchError, match="batch.frames: expected uint8"):
        dataclasses.replace(batch, latents=None).validate(data.io.spec, training=True)


def _edit_info(root: Path, suffix: str) -> str:
    info = root / "data" / "robotwin_demo" / "meta" / "info.json"
    before = info.read_text()
    info.write_text(before + suffix)
    return before


@pytest.mark.parametrize(
    "extra, message",
    [
        (["datasets.vla_data.image_size=[16, 16]"], r"is stale \(image_size: the cache has \[32, 32\], this run \[16, 16\]\)"),
        (["datasets.vla_data.action_video_freq_ratio=1"], r"is stale \(clip_offsets: the cache has \[0, 2, 4, 6, 8\]"),
        (["datasets.vla_data.view_layout=height"], r"is stale \(view_layout"),
        (["datasets.vla_data.camera_crops={observation.images.cam_high: [0.25, 0.25, 0.5, 0.5]}"],
         r"is stale \(camera_crops: the cache has \{\}, this run \{'observation.images.cam_high': \[0.25, 0.25, 0.5, 0.5\]\}\)"),
        (["framework.cosmos25.tiny.seed=1"], r"is stale \(vae: the cache has 'tiny:vae8:seed0:float32'"),
        (["datasets.vla_data.val_fraction=0.0"], r"lacks 1 of the 6 training episodes of .*robotwin_demo \(e.g. \[\d\]\)"),
        ("edited dataset", r"the files of .*robotwin_demo changed since it was cached"),
        ("no manifest", r"not a latent cache \(no manifest.json\); make one with python -m dit4dit_npu.data.encode_latents"),
    ],
)
def test_a_stale_cache_is_refused_with_one_line(root, tmp_path, extra, message):
    before = None
    if extra == "edited dataset":
        before, extra = _edit_info(root, "\n"), []
    elif extra == "no manifest":
        extra = [f"datasets.vla_data.latent_cache={tmp_path}"]
    try:
        with pytest.raises(DatasetError, match=message) as e:
            cached_data(config(root, *extra))
    finally:
        if before is not None:
            (root / "data" / "robotwin_demo" / "meta" / "info.json").write_text(before)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="latent_cache: this entry point cannot check which VAE"):
        build_training_data(config(root))  # no vae_identity: refused, never unchecked


def test_encode_resumes_and_refuses_a_foreign_folder(root, capsys):
    folder = next(p for p in (root / "cache").iterdir() if p.is_dir())
    victim = sorted(folder.glob("episode_*.safetensors"))[2]
    from safetensors.torch import load_file

    before = load_file(victim)
    victim.unlink()
    assert encode_main(["--config", str(TINY), "--out", str(root / "cache"), *overrides(root)]) == 0
    assert f"encoded {LENGTH} clips (1 episodes)" in capsys.readouterr().out
    after = load_file(victim)
    assert torch.equal(after["clips"], before["clips"])
    torch.testing.assert_close(after["latents"], before["latents"], rtol=1e-5, atol=1e-5)
    foreign = root / "not_a_cache"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert encode_main(["--config", str(TINY), "--out", str(foreign), *overrides(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --out") and "is not a latent cache" in err and "\n" not in err
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]  # nothing written


def test_training_reads_the_cache(root):
    """The real trainer (DeepSpeed ZeRO-2 on CPU) from cached latents: no video decoded for training."""
    extra = overrides(root, f"datasets.vla_data.latent_cache={root / 'cache'}", "trainer.max_train_steps=2",
                      "trainer.save_interval=2", "trainer.eval_interval=2", "trainer.eval_samples=2",
                      "trainer.logging_frequency=1", "datasets.vla_data.per_device_batch_size=2",
                      "datasets.vla_data.num_workers=0")
    assert train_here(extra).returncode == 0
    run = root / "runs" / "dit4dit_robotwin_tiny"
    from dit4dit_npu.train.metrics import read_metrics

    rows = [x for x in read_metrics(run / "metrics.jsonl") if "video_loss" in x]
    assert [x["step"] for x in rows] == [1, 2] and all(x["video_loss"] > 0 for x in rows)
    assert (run / "checkpoints/step_000002/policy/model.safetensors").is_file()
    shutil.rmtree(root / "runs")


def test_a_cache_of_frames_resized_at_decode_is_stale(root):
    """Caches written before every camera took the PolicyIO's one path (RGB as stored, then its
    resize step) hold other pixels: their manifests have no view_path, and they are refused."""
    manifest = Path(config(root).datasets.vla_data.latent_cache) / "manifest.json"
    before = manifest.read_text()
    old = json.loads(before)
    assert old["key"]["view_path"] == "rgb as stored, then swscale resize"
    del old["key"]["view_path"]
    manifest.write_text(json.dumps(old))
    try:
        with pytest.raises(DatasetError, match=r"is stale \(view_path: the cache has 'resized at decode', this run "
                                               r"'rgb as stored, then swscale resize'\); re-encode"):
            cached_data(config(root))
    finally:
        manifest.write_text(before)
