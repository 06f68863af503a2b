"""The data commands: each parses its flags and calls its library module.

    python -m dit4dit_npu.data.demo --out DIR ...            demo_main            (dit4dit-data-demo)
    python -m dit4dit_npu.data.inspect ROOT [--check]         inspect_main         (dit4dit-data-inspect)
    python -m dit4dit_npu.data.encode_latents --config FILE   encode_latents_main  (dit4dit-data-encode-latents)
    python -m dit4dit_npu.data.latent_stats --config FILE     latent_stats_main    (dit4dit-data-latent-stats)

Each library module keeps a two-line ``__main__`` block that calls its command here, so the
``python -m`` spellings keep working. A command imports its module when it runs: ``inspect`` and
``demo`` do not pay for torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dit4dit_npu.console import entry_point, size_hw
from dit4dit_npu.errors import DiT4DiTError


@entry_point
def demo_main(argv: list[str] | None = None) -> int:
    from dit4dit_npu.data import demo

    p = argparse.ArgumentParser(prog="python -m dit4dit_npu.data.demo", description=demo.__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="new (or empty) folder to write the dataset into")
    p.add_argument(
        "--version", default="v2.1", choices=["v2.1", "v3.0"], help="LeRobot format version (default: %(default)s)"
    )
    p.add_argument("--episodes", type=int, default=64, help="number of episodes (default: %(default)s)")
    p.add_argument("--length", type=int, default=48, help="frames per episode (default: %(default)s)")
    p.add_argument("--fps", type=int, default=15, help="frames per second (default: %(default)s)")
    p.add_argument("--size", default="32x32", help="HxW of every camera, even, >= 16 (default: %(default)s)")
    for half in ("--height", "--width"):  # the former spelling of --size, one half each
        p.add_argument(half, type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--tasks", type=int, default=4, help=f"number of distinct tasks, 1..{len(demo.TASKS)} (default: %(default)s)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the trajectories (default: %(default)s)")
    p.add_argument("--codec", default="libx264", help="libx264 (default) or libsvtav1 (lerobot's default)")
    p.add_argument("--gop", type=int, default=8, help="keyframe interval in frames (default: %(default)s)")
    a = p.parse_args(argv)
    h, w = size_hw(a.size)
    if a.height is not None or a.width is not None:
        print("notice: --height/--width are deprecated, use --size HxW", file=sys.stderr)
        h, w = a.height if a.height is not None else h, a.width if a.width is not None else w
    # bad arguments, a non-empty --out, an unknown codec: one line (the temp folder is removed)
    out = demo.write_demo_dataset(a.out, a.version, a.episodes, a.length, a.fps, (h, w), a.seed, a.tasks, a.gop, a.codec)
    print(
        f"wrote {a.version} demo dataset: {a.episodes} episodes x {a.length} frames, 3 cameras "
        f"{h}x{w} @ {a.fps} fps -> {out}"
    )
    return 0


@entry_point
def inspect_main(argv: list[str] | None = None) -> int:
    from dit4dit_npu.data.inspect import check_dataset, summarize

    p = argparse.ArgumentParser(prog="python -m dit4dit_npu.data.inspect", description="Inspect (and with --check validate) a LeRobot dataset folder.")
    p.add_argument("root", type=Path, help="the dataset folder (the one holding meta/info.json)")
    p.add_argument("--check", action="store_true", help="validate every file; exit 1 listing every problem")
    p.add_argument(
        "--tolerance-s",
        type=float,
        default=1e-4,
        help="how far timestamps may be off the 1/fps grid, in seconds (default: %(default)g, lerobot's)",
    )
    p.add_argument(
        "--decode", action=argparse.BooleanOptionalAction, default=None,
        help="with --check: decode every video frame (default: on when the videos total at most 1 GiB)",
    )
    a = p.parse_args(argv)
    if a.check:
        problems = check_dataset(a.root, a.tolerance_s, a.decode)
        if problems:
            print(f"{len(problems)} problem(s) in {a.root}:")
            for pr in problems:
                print(f"  - {pr}")
            return 1
    print(summarize(a.root))
    if a.check:
        print("check: OK")
    return 0


@entry_point
def encode_latents_main(argv: list[str] | None = None) -> int:
    from dit4dit_npu import device as dev
    from dit4dit_npu.config import ConfigError, load_config
    from dit4dit_npu.data.encode_latents import cache_bytes, encode_latents

    p = argparse.ArgumentParser(
        prog="python -m dit4dit_npu.data.encode_latents",
        description="Encode every training sample's clip once into a latent cache "
        "(then train with datasets.vla_data.latent_cache=DIR).",
        allow_abbrev=False,
    )
    p.add_argument("--config", required=True, help="the training run's YAML config")
    p.add_argument("--out", default=None, help="cache folder (default: datasets.vla_data.latent_cache)")
    p.add_argument("--batch-size", type=int, default=16, help="clips per VAE call (default 16)")
    args, overrides = p.parse_known_args(argv)
    dev.configure_host_allocator()
    cfg = load_config(args.config, overrides)
    out = args.out or cfg.datasets.vla_data.latent_cache
    if not out:
        raise ConfigError("no cache folder: pass --out DIR or set datasets.vla_data.latent_cache")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size {args.batch_size}: expected >= 1")
    counts = encode_latents(cfg, Path(out), args.batch_size)
    if int(os.environ.get("RANK", "0")) == 0:
        n, world = counts["samples"], int(os.environ.get("WORLD_SIZE", "1"))
        ranks = f" by {world} ranks" if world > 1 else ""
        total, clips = cache_bytes(Path(out))
        print(
            f"latent cache {out}: encoded {n} clips ({counts['episodes']} episodes){ranks} in {counts['seconds']} s, "
            f"{counts['cached_before']} episodes were already cached; {total / 2**20:.1f} MiB on disk for "
            f"{clips} clips ({total / max(clips, 1) / 1024:.1f} KiB per clip)"
        )
    return 0


@entry_point
def latent_stats_main(argv: list[str] | None = None) -> int:
    from dit4dit_npu.data import latent_stats

    p = argparse.ArgumentParser(prog="python -m dit4dit_npu.data.latent_stats",
                                description=latent_stats.__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="the run config whose tiny VAE and training images are used")
    p.add_argument("--samples", type=int, default=256, help="training frames encoded (default: %(default)s)")
    p.add_argument("--batch", type=int, default=16, help="frames per VAE encode (default: %(default)s)")
    p.add_argument("--smoke", action="store_true", help="4 frames, batch 2: checks that the command runs")
    p.add_argument("overrides", nargs="*", help="config overrides a.b=c")
    a = p.parse_args(argv)
    if a.smoke:
        a.samples, a.batch = 4, 2
    for name in ("samples", "batch"):
        if getattr(a, name) < 1:
            raise DiT4DiTError(f"--{name}: expected a positive integer, got {getattr(a, name)}")
    from dit4dit_npu.config import load_config

    cfg = load_config(a.config, a.overrides)  # a bad config is one line before torch is imported
    for line in latent_stats.report(cfg, a.config, a.samples, a.batch):
        print(line)
    return 0
