"""Loader throughput and frame-sparse vs whole-clip decoding, on demo data at a realistic size.

    python bench/loader.py [--episodes 4] [--length 120] [--height 240] [--width 320]
                           [--codec libx264] [--gop 8] [--samples 96] [--workers 1 4]
    python bench/loader.py --smoke   # seconds: 2 short episodes at 64x80, a few samples, 1 worker

Writes a demo dataset (RoboTwin-like: 3 cameras at 240x320, 15 fps) into a temp dir, then
1. samples/s of RoboTwinDataset through a DataLoader (3 cameras x the clip subsampled by
   action_video_freq_ratio, resized to 224x224) with 1 and 4 workers;
2. per-sample decode time of the same clips two ways, in the same run, on the same open files:
   - sparse (ours): one seek, decode forward, convert only the T kept frames to RGB at the stored
     size, then the PolicyIO's view step (crop + resize), the path live images take too;
   - whole clip (the original's loader): convert every frame from the first to the last delta
     to RGB at full size, then resize the kept ones one by one (one seek per clip, which is
     kinder to the baseline than the original's seek per timestamp).
   - for reference, the whole clip with the original's primitives (a fresh swscale context per
     frame, float conversion and ``F.interpolate`` per kept frame).
The last line is ``speedup: X.XX`` (whole-clip time / sparse time, same primitives).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import av
import numpy as np
import torch
from av.video.reformatter import VideoReformatter

from dit4dit_npu.batch import Batch
from dit4dit_npu.config import load_config
from dit4dit_npu.console import run
from dit4dit_npu.data import build_training_data
from dit4dit_npu.data.demo import write_demo_dataset
from dit4dit_npu.data.video import VideoDecoder
from dit4dit_npu.transforms.images import resize_rgb

_FULL = VideoReformatter()


def whole_clip(
    container: av.container.InputContainer, t0: float, t1: float, kept: np.ndarray, size_hw: tuple[int, int]
) -> list[np.ndarray]:
    """The original's way: every frame in [t0, t1] to full-size RGB, then resize the kept ones.

    It uses the same fast primitives as the sparse path (a persistent swscale context), so the
    ratio measures the algorithm, not an implementation detail.
    """
    stream = container.streams.video[0]
    container.seek(max(int((t0 - 1e-4) / stream.time_base), 0), stream=stream, backward=True)
    out = []
    for frame in container.decode(stream):
        t = float(frame.pts * stream.time_base)
        if t < t0 - 1e-4:
            continue
        if t > t1 + 1e-4:
            break
        rgb = _FULL.reformat(frame, format="rgb24").to_ndarray()
        if np.abs(kept - t).min() <= 1e-4:
            out.append(resize_rgb(rgb, size_hw))
    return out


def original_clip(
    container: av.container.InputContainer, t0: float, t1: float, kept: np.ndarray, size_hw: tuple[int, int]
) -> list[torch.Tensor]:
    """Closer to the original's primitives (its image preprocessing): every clip frame to RGB with a fresh
    swscale context (``to_ndarray``), kept frames to float [0, 1], then ``F.interpolate`` each."""
    stream = container.streams.video[0]
    container.seek(max(int((t0 - 1e-4) / stream.time_base), 0), stream=stream, backward=True)
    out = []
    for frame in container.decode(stream):
        t = float(frame.pts * stream.time_base)
        if t < t0 - 1e-4:
            continue
        if t > t1 + 1e-4:
            break
        rgb = torch.from_numpy(frame.to_ndarray(format="rgb24"))
        if np.abs(kept - t).min() <= 1e-4:
            x = rgb.permute(2, 0, 1)[None].float() / 255.0
            out.append(
                torch.nn.functional.interpolate(x, size=size_hw, mode="bilinear", align_corners=False)[0]
            )
    return out


def bench_decode(data, deltas: list[int], n: int, seed: int) -> tuple[float, float, float]:
    """Per-sample decode seconds: sparse, whole clip, whole clip with the original's primitives;
    ``deltas`` are the clip's frame offsets before subsampling (the whole clip's span)."""
    ds = data.train_dataset
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(ds), n)
    deltas = np.asarray(deltas)
    size = ds.io.image_size
    sparse_dec = VideoDecoder()
    containers: dict[str, av.container.InputContainer] = {}
    jobs = []
    for i in picks:
        k, row = ds.locate(int(i))
        lr = ds.datasets[k]
        ep = int(lr.column("episode_index")[row])
        start, end = lr.episode_bounds(ep)
        for key in ds.io.camera_keys:
            vid = lr.meta.episode(ep)["videos"][key]
            ts = lr.column("timestamp").astype(np.float64) + vid["from_timestamp"]
            kept = ts[np.clip(row + ds.clip_offsets, start, end - 1)]
            every = ts[np.clip(row + deltas, start, end - 1)]
            jobs.append((key, str(lr.root / vid["path"]), kept, every[0], every[-1]))
    def sparse_clip(key: str, path: str, kept) -> np.ndarray:  # what the dataset does per camera
        return np.stack([ds.io.view(key, f) for f in sparse_dec.decode(path, kept)])

    for key, path, kept, *_ in jobs[:6]:  # warm both caches (open files) outside the timing
        sparse_clip(key, path, kept)
        containers.setdefault(path, av.open(path)).streams.video[0].codec_context.thread_count = 1
    for _, path, *_ in jobs:
        if path not in containers:
            containers[path] = av.open(path)
            containers[path].streams.video[0].codec_context.thread_count = 1
    t = time.perf_counter()
    for key, path, kept, _, _ in jobs:
        sparse_clip(key, path, kept)
    sparse = time.perf_counter() - t
    t = time.perf_counter()
    for _, path, kept, t0, t1 in jobs:
        whole_clip(containers[path], t0, t1, kept, size)
    whole = time.perf_counter() - t
    t = time.perf_counter()
    for _, path, kept, t0, t1 in jobs:
        original_clip(containers[path], t0, t1, kept, size)
    original = time.perf_counter() - t
    return sparse / n, whole / n, original / n


def bench_loader(data, workers: int, batches: int, batch_size: int) -> float:
    loader = torch.utils.data.DataLoader(
        data.train_dataset,
        batch_size=batch_size,
        sampler=data.sampler,
        collate_fn=Batch.collate,
        num_workers=workers,
        persistent_workers=False,
        prefetch_factor=2 if workers else None,
    )
    it = iter(loader)
    next(it)  # worker start-up and first file opens are not throughput
    t = time.perf_counter()
    n = 0
    for _ in range(batches):
        n += len(next(it).instruction)
    return n / (time.perf_counter() - t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--length", type=int, default=120)
    p.add_argument("--height", type=int, default=240)
    p.add_argument("--width", type=int, default=320)
    p.add_argument("--gop", type=int, default=8)
    p.add_argument("--codec", default="libx264", help="libx264, or libsvtav1 --gop 2 like lerobot's encoder")
    p.add_argument("--samples", type=int, default=96, help="samples for the decode comparison")
    p.add_argument("--batches", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    p.add_argument("--smoke", action="store_true", help="a seconds-long run at tiny sizes (overrides the size options): checks that the bench works; its numbers mean nothing")
    a = p.parse_args()
    if a.smoke:
        a.episodes, a.length, a.height, a.width, a.samples, a.batches, a.batch_size, a.workers = 2, 24, 64, 80, 4, 2, 2, [1]
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        write_demo_dataset(
            Path(tmp) / "demo",
            "v2.1",
            a.episodes,
            a.length,
            15,
            (a.height, a.width),
            num_tasks=4,
            gop=a.gop,
            codec=a.codec,
        )
        print(
            f"demo data: {a.episodes} episodes x {a.length} frames, 3 cameras {a.height}x{a.width} {a.codec} "
            f"gop {a.gop}, written in {time.perf_counter() - t:.1f} s"
        )
        cfg = load_config(
            None,
            [
                f"datasets.vla_data.data_root_dir={tmp}",
                "datasets.vla_data.data_mix=[{path: demo}]",
                "datasets.vla_data.image_size=[224, 224]",
                "datasets.vla_data.video_delta_indices=[0, 1, 2, 3, 4, 5, 6, 7, 8]",
                "datasets.vla_data.action_video_freq_ratio=2",
                "datasets.vla_data.val_fraction=0.0",
                "framework.action_model.chunk_length=16",
            ],
        )
        data = build_training_data(cfg)
        T = len(data.train_dataset.clip_offsets)
        print(f"sample: 3 cameras x {T} frames (9 deltas / 2) at 224x224, chunk 16, batch {a.batch_size}")
        for w in a.workers:
            sps = bench_loader(data, w, a.batches, a.batch_size)
            print(f"loader  workers={w}: {sps:7.1f} samples/s")
        sparse, whole, original = bench_decode(data, cfg.datasets.vla_data.video_delta_indices, a.samples, seed=0)
        print(
            f"decode per sample (3 cameras): sparse {sparse * 1e3:.1f} ms   whole clip {whole * 1e3:.1f} ms"
        )
        print(
            f"whole clip with the original's primitives (to_ndarray, float, F.interpolate): "
            f"{original * 1e3:.1f} ms ({original / sparse:.2f}x sparse)"
        )
        print(f"speedup: {whole / sparse:.2f}")


if __name__ == "__main__":
    raise SystemExit(run(main))  # user errors: one line, exit code 2 (dit4dit_npu.console)
