"""What the latent cache's content check costs: the share of a training epoch spent verifying.

    python bench/latent_verify.py [--episodes 16] [--length 60] [--height 240] [--width 320] [--batch-size 4]
    python bench/latent_verify.py --smoke   # seconds: 4 short episodes at 32x32

The first read of a cached episode in a run hashes its whole latent tensor and each of its
source files (data file, camera videos) against what was recorded when it was encoded
(``data/latents.py``: ``_verify``). This writes a demo dataset (RoboTwin-like: 3 cameras), encodes
its latent cache with the tiny config's VAE, then trains the tiny model for one epoch from the
cache in this process (a DataLoader in the main process, forward + backward + AdamW per batch,
as the trainer's step) and reports the time the epoch's reads spent verifying (``LatentCache.
verify_seconds``) against the epoch's wall time. The tiny model's step is far cheaper than the
real model's, so the share here is an upper bound of the share at full size for the same data.

The last line is ``verify/epoch: X.XXXX`` (verifying seconds / epoch seconds; the goal is <= 0.05).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from dit4dit_npu.batch import Batch
from dit4dit_npu.config import load_config
from dit4dit_npu.console import run
from dit4dit_npu.data import build_training_data
from dit4dit_npu.data.demo import write_demo_dataset
from dit4dit_npu.data.encode_latents import encode_latents

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "robotwin" / "dit4dit_robotwin_tiny.yaml"


def epoch(cfg, batch_size: int) -> tuple[float, float, int]:
    """(epoch seconds, of which verifying, samples): one pass over the training samples."""
    from dit4dit_npu.models.prompt_cache import PromptCache
    from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder, vae_identity

    data = build_training_data(cfg, vae_identity=vae_identity(cfg))  # every episode unverified
    ds = data.train_dataset
    model = build_dit4dit(cfg, data.io.spec)
    cache = PromptCache()
    cache.build(sorted({t for d in ds.datasets for t in d.meta.tasks.values()}), build_prompt_encoder(cfg))
    model.set_prompt_cache(cache)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, collate_fn=Batch.collate,
                                         generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    for batch in loader:
        out = model(batch)  # the trainer's objective: action + its weight x video
        loss = out["action_loss"] + cfg.trainer.loss_scale.future_video * out["video_loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return time.perf_counter() - t0, ds.latents.verify_seconds, len(ds)


def main() -> int:
    p = argparse.ArgumentParser(prog="python bench/latent_verify.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--length", type=int, default=60, help="frames per episode")
    p.add_argument("--height", type=int, default=240)
    p.add_argument("--width", type=int, default=320)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--smoke", action="store_true", help="4 episodes of 16 frames at 32x32")
    a = p.parse_args()
    if a.smoke:
        a.episodes, a.length, a.height, a.width = 4, 16, 32, 32
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="latent_verify_") as tmp:
        root = Path(tmp)
        write_demo_dataset(root / "data" / "robotwin_demo", num_episodes=a.episodes, episode_length=a.length,
                           image_size=(a.height, a.width))
        cfg = load_config(TINY, [f"datasets.vla_data.data_root_dir={root / 'data'}", f"run_root_dir={root / 'runs'}",
                                 "datasets.vla_data.generate_demo_if_missing=false", "datasets.vla_data.num_workers=0",
                                 f"datasets.vla_data.latent_cache={root / 'cache'}"])
        encode_latents(cfg, root / "cache", batch_size=16, progress=False)
        source = sum(f.stat().st_size for f in (root / "data").rglob("*") if f.is_file() and f.suffix in (".mp4", ".parquet"))
        latents = sum(f.stat().st_size for f in (root / "cache").rglob("episode_*.safetensors"))
        seconds, verifying, samples = epoch(cfg, a.batch_size)
    print(f"{a.episodes} episodes x {a.length} frames at {a.height}x{a.width}, 3 cameras: {samples} training samples; "
          f"{source / 2**20:.1f} MiB of source files, {latents / 2**20:.1f} MiB of latents verified")
    print(f"epoch (tiny model, batch {a.batch_size}, from the cache): {seconds:.2f} s; verifying: {verifying * 1e3:.1f} ms "
          f"({verifying / seconds:.2%})")
    print(f"verify/epoch: {verifying / seconds:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
