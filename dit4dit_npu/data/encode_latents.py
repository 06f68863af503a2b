"""Encode every training sample's clip once into a latent cache (``data/latents.py``).

    python -m dit4dit_npu.data.encode_latents --config FILE [--out DIR] [--batch-size 16] [a.b=c ...]
    accelerate launch --multi_gpu --num_processes 8 -m dit4dit_npu.data.encode_latents --config FILE --out DIR

then train with ``datasets.vla_data.latent_cache=DIR``. The samples are exactly the training
run's (same config, same split: the training episodes of every dataset), their frames exactly
what ``RoboTwinDataset`` decodes, the encode exactly the model's (``models.cosmos.vae_latents``
of ``models.dit4dit.video_input``), in the dtype training runs the VAE in. Only the VAE is
loaded. Decoding runs in ``datasets.vla_data.num_workers`` loader processes while the device
encodes batches of ``--batch-size`` clips. Resumable: finished episodes are skipped (each is
written whole); under a launcher each rank takes every world_size-th episode.

This is an entry point, like ``train``: it composes data/ with the model's VAE (imported here,
lazily); the dataset and loader code in data/ never import models/.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from dit4dit_npu import device as dev
from dit4dit_npu.config import Config
from dit4dit_npu.data.build import build_training_data
from dit4dit_npu.data.latent_key import CacheKey
from dit4dit_npu.data.latents import MANIFEST, LatentCache
from dit4dit_npu.data.robotwin import RoboTwinDataset


class _Windows(torch.utils.data.Dataset):
    """Clip frames of ``batch_size`` consecutive samples of one episode at a time, tiled as the
    model sees them: uint8 (b, T, 3, H, W). Each frame is decoded once per window, however many
    of its clips use it (neighbouring samples share T - 1 of their T frames)."""

    def __init__(self, ds: RoboTwinDataset, work: list[tuple[int, int]], batch_size: int) -> None:
        self.ds = ds
        self.items = [
            (k, e, a)
            for k, e in work
            for a in range(0, len(ds.episode_clips(k, e)), batch_size)
        ]
        self.batch_size = batch_size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[int, int, torch.Tensor]:
        k, e, a = self.items[i]
        clips = self.ds.episode_clips(k, e)[a : a + self.batch_size]  # (b, T) frame rows
        rows, inverse = np.unique(clips, return_inverse=True)
        io, source = self.ds.io, self.ds.datasets[k]
        views = io.camera_views(source.frame_source(rows))
        return k, e, io.frames(views[inverse.reshape(clips.shape)])


def encode_latents(cfg: Config, out: Path, batch_size: int = 16, progress: bool = True) -> dict[str, int]:
    """Encode this rank's share of the missing training episodes into ``out``; returns counts."""
    from dit4dit_npu.models.dit4dit import video_input
    from dit4dit_npu.models.vae import vae_latents
    from dit4dit_npu.weights import build_vae, vae_identity

    dev.set_device()  # before the process group: NCCL/HCCL bind to the current card
    device = dev.get_device()
    rank, world, barrier, owned = _distributed()
    online = dataclasses.replace(
        cfg, datasets=dataclasses.replace(cfg.datasets, vla_data=dataclasses.replace(cfg.datasets.vla_data, latent_cache=None))
    )
    data = build_training_data(online, rank, world, barrier)
    ds = data.train_dataset
    key = CacheKey.of(data.io, vae_identity(cfg))
    LatentCache.create(out, key, ds.datasets, write=False)  # every rank refuses a stale or foreign folder
    vae = build_vae(cfg).to(device)

    def encode(frames: torch.Tensor) -> torch.Tensor:
        return vae_latents(vae, video_input(frames.to(device))).cpu()

    barrier()
    if rank == 0 and not (out / MANIFEST).is_file():  # the probe only for a new cache
        LatentCache.create(out, key, ds.datasets, bound=latent_bound(encode, len(data.io.clip_offsets), data.io.frame_size))
    barrier()
    cache = LatentCache.open(out, key, ds.datasets)
    work = [(k, e) for k in range(len(ds.datasets)) for e in ds.episodes(k)]
    # Shard before filtering: every rank agrees on the shares whatever is already on disk. A file
    # that is there but damaged (truncated by a full disk, edited, its source video changed) is
    # encoded again, not kept.
    mine = [w for w in work[rank::world] if not _cached(cache, ds, *w)]
    samples = sum(len(ds.episode_clips(k, e)) for k, e in mine)
    from tqdm.auto import tqdm

    bar = tqdm(total=samples, desc=f"encode latents (rank {rank})", unit="clip", disable=not progress or rank != 0)
    t0 = time.perf_counter()

    workers = cfg.datasets.vla_data.num_workers
    try:
        for k, e, latents in _episodes(ds, mine, batch_size, workers, bar.update, encode):
            cache.write_episode(k, e, latents, ds.episode_clips(k, e), ds.datasets[k])
    finally:
        bar.close()  # an error (a corrupt video) then starts a line of its own
    counts = {"episodes": len(mine), "samples": samples, "cached_before": len(work[rank::world]) - len(mine)}
    counts = _sum_over_ranks(counts, world, device)
    if owned:
        import torch.distributed as dist

        dist.destroy_process_group()  # else gloo/hccl complain at exit
    return {**counts, "seconds": int(time.perf_counter() - t0)}


# How far beyond the extremes of its input range a posterior mean may plausibly lie (see latent_bound).
LATENT_MARGIN = 10.0


@torch.no_grad()
def latent_bound(encode: Callable[[torch.Tensor], torch.Tensor], frames: int, size: tuple[int, int]) -> float:
    """The largest |latent| this VAE plausibly gives: ``LATENT_MARGIN`` x the largest it gives for
    probe clips at the extremes of its input (black, white, saturated red/green/blue, uniform
    noise, a one-pixel checkerboard), one clip at a time, through the encoder's own path.

    Why a probe and not the VAE config's ``latents_mean``/``latents_std``: those describe the real
    VAE's latents of natural video, not a tiny or other VAE's, whose raw scale can be far smaller
    (the tiny VAE's posterior means stay below 1 where the real one's spread is ~2-3), so a bound
    from them would be loose enough to let a scaled episode through there. Saturated and
    high-frequency inputs drive a VAE hardest; real frames, inside the same pixel range, stay
    within a small multiple of them, so 10x refuses only gross corruption (an episode scaled x100,
    bytes that are not latents) and never a real clip."""
    h, w = size
    g = torch.Generator().manual_seed(0)
    checker = ((torch.arange(h)[:, None] + torch.arange(w)[None, :]) % 2 * 255).to(torch.uint8)
    planes = [
        torch.zeros(3, h, w, dtype=torch.uint8),
        torch.full((3, h, w), 255, dtype=torch.uint8),
        *[torch.zeros(3, h, w, dtype=torch.uint8).index_fill_(0, torch.tensor([c]), 255) for c in range(3)],
        torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8),
        checker.expand(3, h, w),
    ]
    peak = max(float(encode(p.expand(1, frames, 3, h, w).contiguous()).abs().max()) for p in planes)
    return LATENT_MARGIN * peak


def _cached(cache: LatentCache, ds: RoboTwinDataset, k: int, episode: int) -> bool:
    """Whether the episode's file is there and serves exactly its samples; says so when not."""
    if not cache.has_episode(k, episode):
        return False
    problem = cache.episode_problem(k, episode, ds.episode_clips(k, episode), ds.datasets[k], restamp=True)
    if problem is not None:
        print(f"re-encoding {cache.episode_path(k, episode)}: it {problem}", file=sys.stderr)
    return problem is None


def _episodes(
    ds: RoboTwinDataset,
    work: list[tuple[int, int]],
    batch_size: int,
    num_workers: int,
    advance: Callable[[int], object],
    encode: Callable[[torch.Tensor], torch.Tensor],
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(dataset, episode, latents of all its samples), episode by episode, in ``work`` order:
    each as soon as its last window is encoded (not when the next episode's first window
    arrives: an error there, a corrupt video, must not cost the finished episode)."""
    windows = _Windows(ds, work, batch_size)
    left = collections.Counter((k, e) for k, e, _ in windows.items)
    loader = torch.utils.data.DataLoader(windows, batch_size=None, num_workers=num_workers, shuffle=False)
    parts: list[torch.Tensor] = []
    for k, e, frames in loader:
        parts.append(encode(frames))
        advance(len(frames))
        left[(k, e)] -= 1
        if left[(k, e)] == 0:
            yield k, e, torch.cat(parts)
            parts = []


def _distributed() -> tuple[int, int, Callable[[], None], bool]:
    """(rank, world size, barrier, whether we started the group): a torch.distributed group when a
    launcher (accelerate launch --multi_gpu, torchrun) started several processes, else a world of one."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, lambda: None, False
    import torch.distributed as dist

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group(backend=dev.dist_backend())
    return dist.get_rank(), world, dist.barrier, owned


def _sum_over_ranks(counts: dict[str, int], world: int, device: torch.device) -> dict[str, int]:
    """Every rank's counts added up (a collective: every rank calls it once, after its share)."""
    if world == 1:
        return counts
    import torch.distributed as dist

    t = torch.tensor(list(counts.values()), dtype=torch.int32, device=device)
    dist.all_reduce(t)
    return dict(zip(counts, t.tolist()))


def cache_bytes(root: Path) -> tuple[int, int]:
    """(bytes on disk, clips) of every episode file in the cache."""
    from safetensors import SafetensorError, safe_open

    files = list(root.rglob("episode_*.safetensors"))
    clips = 0
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as h:
                clips += h.get_slice("clips").get_shape()[0]
        except (SafetensorError, OSError):  # a report only: a damaged file (another split's) is training's to name
            continue
    return sum(f.stat().st_size for f in files), clips


if __name__ == "__main__":  # python -m dit4dit_npu.data.encode_latents: the command is data/cli.py's
    from dit4dit_npu.data.cli import encode_latents_main

    raise SystemExit(encode_latents_main())
