"""``build_training_data(cfg)``: config -> validated datasets, split, PolicyIO, sampler.

Order matters: resolve paths (generating the demo dataset when asked and absent, rank 0 only,
and only at its shipped location: a mistyped path must not train on synthetic data), open every
dataset and validate it against the config (``validate.feature_problems``: cameras, state/action
widths, the clip offsets on each video's frame grid; episodes long enough for one sample) before
anything expensive, split episodes, compute statistics from the *training* episodes only, build
the PolicyIO from them (with the camera sizes the videos really decode to), then the datasets
and the sampler. Nothing is written anywhere except the generated demo dataset.
"""

from __future__ import annotations

import time
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dit4dit_npu.config import Config, ConfigError, VLADataConfig
from dit4dit_npu.data.errors import DatasetError
from dit4dit_npu.data.latent_key import CacheKey
from dit4dit_npu.data.latents import LatentCache
from dit4dit_npu.data.lerobot import LeRobotDataset
from dit4dit_npu.data.mixture import MixtureSampler, mixture_entries, split_episodes
from dit4dit_npu.data.robotwin import RoboTwinDataset
from dit4dit_npu.data.training_stats import compute_stats
from dit4dit_npu.data.validate import episode_length_problems, feature_problems, raise_first
from dit4dit_npu.data.video import decoded_size
from dit4dit_npu.transforms.policy_io import PolicyIO, PolicyIOError


@dataclass
class TrainingData:
    train_dataset: RoboTwinDataset
    val_dataset: RoboTwinDataset | None
    sampler: MixtureSampler
    io: PolicyIO
    # resolved dataset path -> {"train": [episode indices], "val": [...]}
    split: dict[str, dict[str, list[int]]]
    dataset_paths: list[Path]
    datasets: list[LeRobotDataset] = field(default_factory=list)


def resolve_dataset_paths(d: VLADataConfig) -> list[Path]:
    root = Path(d.data_root_dir)
    return [Path(e.path) if Path(e.path).is_absolute() else root / e.path for e in mixture_entries(d)]


# The only place the demo dataset is generated: the tiny config's data_root_dir / data_mix path,
# relative to the working directory. Anywhere else a missing dataset is an error, so a typo in
# data_root_dir fails instead of quietly training on synthetic data.
DEMO_LOCATION = Path("demo_data") / "robotwin_demo"


def is_demo_location(path: Path) -> bool:
    return Path(path).resolve() == DEMO_LOCATION.resolve()


def _not_found(p: Path, d: VLADataConfig) -> DatasetError:
    if d.generate_demo_if_missing and not is_demo_location(p):
        why = (
            f"the demo dataset is generated only at its default location {DEMO_LOCATION} (under the working "
            "directory), never at another path"
        )
    else:
        why = "set datasets.vla_data.data_root_dir / data_mix to a LeRobot dataset folder"
    return DatasetError(
        f"dataset folder not found: {p} (data_root_dir={d.data_root_dir!r}; {why}; to write the demo dataset "
        f"there on purpose: python -m dit4dit_npu.data.demo --out {p})"
    )


def _demo_size(d: VLADataConfig) -> tuple[int, int]:
    """Generate demo frames at the training size when it is small and even (no resize at all)."""
    h, w = d.image_size
    return (h, w) if h % 2 == 0 and w % 2 == 0 and 16 <= min(h, w) and max(h, w) <= 256 else (32, 32)


def _stale_demo(p: Path) -> bool:
    """A demo dataset written by another version of the generator (regenerated, not reused)."""
    from dit4dit_npu.data.demo import DEMO_VERSION, demo_version

    found = demo_version(p) if p.exists() else None
    return found is not None and found != DEMO_VERSION


def ensure_demo_data(
    paths: list[Path], d: VLADataConfig, rank: int, world_size: int, barrier: Callable[[], None] | None
) -> None:
    """Write the demo dataset at every missing path, and again over one that another version of
    the generator wrote (rank 0); other ranks wait for it."""
    missing = [p for p in paths if not p.exists()]
    stale = [p for p in paths if _stale_demo(p)]
    if not missing and not stale:
        if barrier is not None and world_size > 1:
            barrier()  # every rank calls the barrier the same number of times
        return
    if rank == 0:
        from dit4dit_npu.data.demo import DEMO_VERSION, demo_version, write_demo_dataset

        for p in stale:
            print(
                f"notice: {p} was written by version {demo_version(p)} of the demo generator; "
                f"writing version {DEMO_VERSION} over it",
                flush=True,
            )
            write_demo_dataset(p, image_size=_demo_size(d), replace=True)
        for p in missing:
            write_demo_dataset(p, image_size=_demo_size(d))  # an unwritable place: DatasetError
    if barrier is not None and world_size > 1:
        barrier()
    elif rank != 0:  # no barrier: the writer renames a finished folder into place, so poll for it
        deadline = time.monotonic() + 600
        while not all(p.exists() and not _stale_demo(p) for p in missing + stale):
            if time.monotonic() > deadline:
                raise DatasetError(f"timed out waiting for rank 0 to generate demo data at {missing + stale}")
            time.sleep(0.5)


def _split_seed(seed: int, name: str) -> int:
    # Stable across machines (the config path, not the resolved one) and different per dataset.
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**32)


def build_training_data(
    cfg: Config,
    rank: int = 0,
    world_size: int = 1,
    barrier: Callable[[], None] | None = None,
    vae_identity: str | None = None,
) -> TrainingData:
    """``vae_identity`` (``weights.vae_identity(cfg)``) names the VAE a latent cache must come from;
    needed only with ``datasets.vla_data.latent_cache``."""
    d = cfg.datasets.vla_data
    entries = mixture_entries(d)
    paths = resolve_dataset_paths(d)
    if d.generate_demo_if_missing:
        ensure_demo_data([p for p in paths if is_demo_location(p)], d, rank, world_size, barrier)
    for p in paths:
        if not p.exists():
            raise _not_found(p, d)
    datasets = [LeRobotDataset(p, image_size=tuple(d.image_size)) for p in paths]
    raise_first(feature_problems(datasets, d.camera_keys, [d.state_key, d.action_key], d.video_delta_indices))
    chunk = cfg.framework.action_model.chunk_length
    raise_first(episode_length_problems(datasets, [None] * len(datasets), d.clip_offsets, chunk))

    known = {e.path for e in entries} | {str(p) for p in paths}
    unknown = sorted(set(d.val_episodes or {}) - known)
    if unknown:
        raise DatasetError(
            f"datasets.vla_data.val_episodes names {unknown}, which are not in data_mix "
            f"({[e.path for e in entries]})"
        )
    split: dict[str, dict[str, list[int]]] = {}
    train_eps, val_eps = [], []
    for entry, p, ds in zip(entries, paths, datasets):
        explicit = (d.val_episodes or {}).get(entry.path, (d.val_episodes or {}).get(str(p)))
        val_spec = explicit if explicit is not None else d.val_fraction
        try:
            train, val = split_episodes(ds.selected_episodes, val_spec, _split_seed(cfg.seed, entry.path))
        except DatasetError as e:
            raise DatasetError(f"{p}: {e}") from None
        split[str(p)] = {"train": train, "val": val}
        train_eps.append(train)
        val_eps.append(val)

    stats = compute_stats(datasets, [d.state_key, d.action_key], train_eps)
    try:
        io = PolicyIO.from_config(cfg, stats[d.state_key], stats[d.action_key], source_sizes(datasets, d.camera_keys))
    except PolicyIOError as e:
        raise ConfigError(str(e)) from None
    train_ds = RoboTwinDataset(datasets, io, d.state_key, d.action_key, train_eps)
    if d.latent_cache:
        attach_latent_cache(train_ds, d.latent_cache, vae_identity)
    val_ds = RoboTwinDataset(datasets, io, d.state_key, d.action_key, val_eps) if any(val_eps) else None
    sampler = MixtureSampler(
        train_ds.dataset_sizes,
        [e.weight for e in entries],
        seed=cfg.seed,
        rank=rank,
        world_size=world_size,
        batch_size=d.per_device_batch_size,
    )
    return TrainingData(train_ds, val_ds, sampler, io, split, paths, datasets)


def attach_latent_cache(train_ds: RoboTwinDataset, folder: str, vae_identity: str | None) -> None:
    """Training samples read their clip latents from the cache at ``folder``, which must match this
    run (cameras, size, layout, clip, VAE, dataset files) and hold every training episode. Held-out
    samples keep their frames: evaluation runs ``predict_action``, which always encodes frames."""
    if vae_identity is None:
        raise ConfigError(
            "datasets.vla_data.latent_cache: this entry point cannot check which VAE made the cache; "
            "set it to null here"
        )
    key = CacheKey.of(train_ds.io, vae_identity)
    train_ds.use_latent_cache(LatentCache.open(folder, key, train_ds.datasets))


def source_sizes(datasets: list[LeRobotDataset], cameras: list[str]) -> dict[str, list[list[int]]]:
    """(H, W) of each camera's videos across the mixture (for the live-image aspect check), as
    they decode (the first episode's video per dataset): info.json may be wrong, and a wrong
    size baked into a policy would refuse every correct live image."""
    sizes: dict[str, list[list[int]]] = {k: [] for k in cameras}
    for ds in datasets:
        first = ds.selected_episodes[0]
        for key in cameras:
            hw = list(decoded_size(ds.root / ds.meta.get_video_file_path(first, key)))
            declared = ds.meta.video_size(key)
            if declared is not None and list(declared) != hw:
                warnings.warn(
                    f"{ds.root}: {key} videos decode to {hw[0]}x{hw[1]} but meta/info.json declares "
                    f"{declared[0]}x{declared[1]}; using the decoded size",
                    stacklevel=2,
                )
            if hw not in sizes[key]:
                sizes[key].append(hw)
    return {k: v for k, v in sizes.items() if v}
