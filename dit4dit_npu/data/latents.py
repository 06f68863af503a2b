"""The latent cache: every training sample's clip VAE-encoded once, read back instead of video.

The VAE is frozen, its posterior-mean encode is deterministic and the training data has no
augmentation, so a sample's clip latents are a function of the dataset alone; caching them is
exact. ``python -m dit4dit_npu.data.encode_latents`` writes a cache; training with
``datasets.vla_data.latent_cache=DIR`` reads it (``RoboTwinDataset`` then never decodes video,
the loader's main cost, and the model skips its VAE encode, about a fifth of a full-size step).

What the latents depend on, and how each is keyed (a change of any one is refused, never used):

- the clip's pixels: the dataset's files (``dataset_fingerprint``: meta/ contents + the names and
  sizes of every data and video file; one sub-folder per fingerprint) and each sample's frame
  rows (stored per episode, compared with what the dataset would read now);
- how the frames become the VAE input: cameras, image size, view layout, clip offsets (the
  manifest's ``CacheKey``);
- the VAE: its weights and the dtype it runs in (``models.vae_identity``, in the key).

Layout::

    DIR/manifest.json                                  format + CacheKey
    DIR/<fingerprint>/dataset.json                     where the dataset was (information only)
    DIR/<fingerprint>/episode_000012.safetensors       latents (n, 16, T_lat, h, w) in the VAE's dtype,
                                                       clips (n, T) int64: the frame rows of each of
                                                       the episode's n samples, in row order

An episode file is written whole (temp file + rename), so an interrupted encode resumes at the
first missing episode and a reader never sees half a file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dit4dit_npu.data.errors import DatasetError
from dit4dit_npu.files import atomic_path, atomic_write_json

FORMAT = "dit4dit_npu.latent_cache/1"
MANIFEST = "manifest.json"
ENCODE_HINT = "python -m dit4dit_npu.data.encode_latents --config FILE --out DIR"
_OPEN_FILES = 32  # episode files kept open per process (each is an mmap; reads are ~15 us)


@dataclass(frozen=True)
class CacheKey:
    """Everything besides the dataset files that decides a sample's latents."""

    camera_keys: tuple[str, ...]
    image_size: tuple[int, int]
    view_layout: str
    clip_offsets: tuple[int, ...]
    vae: str  # models.vae_identity: weights + the dtype the VAE runs in

    @classmethod
    def of(cls, io: Any, vae: str) -> CacheKey:
        """The key of a PolicyIO's clips (cameras, size, layout, offsets) encoded by ``vae``."""
        return cls(tuple(io.camera_keys), tuple(io.image_size), io.view_layout, tuple(io.clip_offsets), vae)

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    def difference(self, other: CacheKey) -> str | None:
        """The first field that differs, as 'field: cache X, this run Y', else None."""
        mine, theirs = self.to_dict(), other.to_dict()
        for name in mine:
            if mine[name] != theirs[name]:
                return f"{name}: the cache has {mine[name]!r}, this run {theirs[name]!r}"
        return None


def dataset_fingerprint(root: str | Path) -> str:
    """A dataset's identity: its meta/ files' contents and the names and sizes of its data and
    video files. Path-independent (a moved dataset keeps its cache), cheap (no video is read)."""
    root = Path(root)
    h = hashlib.sha256()
    for sub, content in (("meta", True), ("data", False), ("videos", False)):
        for f in sorted(p for p in (root / sub).rglob("*") if p.is_file()):
            rel = f.relative_to(root).as_posix().encode()
            h.update(rel + (f.read_bytes() if content else str(f.stat().st_size).encode()))
    return h.hexdigest()[:20]


class LatentCache:
    """A cache folder whose manifest matches ``key``; ``fingerprints[k]`` names dataset k of the run."""

    def __init__(self, root: Path, key: CacheKey, fingerprints: Sequence[str]) -> None:
        self.root, self.key, self.fingerprints = Path(root), key, list(fingerprints)
        self._files: OrderedDict[Path, Any] = OrderedDict()

    # ------------------------------------------------------------------ opening

    @classmethod
    def create(cls, root: str | Path, key: CacheKey, datasets: Sequence[Any], write: bool = True) -> LatentCache | None:
        """Open ``root`` for writing: a new folder gets a manifest; an existing cache must have
        this key (adding datasets or episodes to it is fine; another VAE or image size is not).
        ``write=False`` only checks (every rank does, so all fail alike before rank 0 writes)."""
        root = Path(root)
        if (root / MANIFEST).is_file():
            return cls.open(root, key, datasets)
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise DatasetError(f"--out {root}: exists and is not a latent cache (no {MANIFEST}); choose an empty folder")
        if not write:
            return None
        try:
            root.mkdir(parents=True, exist_ok=True)
            atomic_write_json(root / MANIFEST, {"format": FORMAT, "key": key.to_dict()})
        except OSError as e:
            raise DatasetError(f"--out {root}: cannot create the cache folder ({e.strerror or e})") from None
        return cls(root, key, [dataset_fingerprint(ds.root) for ds in datasets])

    @classmethod
    def open(cls, root: str | Path, key: CacheKey, datasets: Sequence[Any]) -> LatentCache:
        """An existing cache whose key equals ``key``, else one line saying what differs."""
        root = Path(root)
        where = f"datasets.vla_data.latent_cache={root}"
        try:
            manifest = json.loads((root / MANIFEST).read_text())
        except FileNotFoundError:
            raise DatasetError(f"{where}: not a latent cache (no {MANIFEST}); make one with {ENCODE_HINT}") from None
        except (OSError, json.JSONDecodeError) as e:
            raise DatasetError(f"{where}: unreadable {MANIFEST} ({e})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            got = manifest.get("format") if isinstance(manifest, dict) else None
            raise DatasetError(f"{where}: format {got!r}, expected {FORMAT!r}; re-encode with {ENCODE_HINT}")
        try:
            saved = CacheKey(**{k: tuple(v) if isinstance(v, list) else v for k, v in manifest["key"].items()})
        except (KeyError, TypeError, AttributeError) as e:  # AttributeError: "key" is not a mapping
            raise DatasetError(f"{where}: {MANIFEST} has no valid key ({e})") from None
        diff = saved.difference(key)
        if diff is not None:
            raise DatasetError(f"{where} is stale ({diff}); re-encode into a new folder with {ENCODE_HINT}")
        return cls(root, key, [dataset_fingerprint(ds.root) for ds in datasets])

    # ------------------------------------------------------------------ episodes

    def episode_path(self, k: int, episode: int) -> Path:
        return self.root / self.fingerprints[k] / f"episode_{int(episode):06d}.safetensors"

    def has_episode(self, k: int, episode: int) -> bool:
        return self.episode_path(k, episode).is_file()

    def write_episode(self, k: int, episode: int, latents: torch.Tensor, clips: np.ndarray, source: Path) -> None:
        """All samples of one episode: latents (n, C, T_lat, h, w) and their frame rows (n, T).
        Non-finite latents (a VAE overflowing in bf16, say) are refused, not cached for training."""
        from safetensors.torch import save_file

        bad = (~torch.isfinite(latents)).flatten(1).any(1).nonzero().flatten().tolist()
        if bad:
            raise DatasetError(
                f"episode {int(episode)} of {source}: the VAE gave non-finite latents for {len(bad)} of its "
                f"{len(latents)} clips (e.g. sample {bad[0]}, frame rows {np.asarray(clips)[bad[0]].tolist()}); "
                "nothing written for it"
            )
        path = self.episode_path(k, episode)
        path.parent.mkdir(parents=True, exist_ok=True)
        info = path.parent / "dataset.json"
        if not info.is_file():
            atomic_write_json(info, {"path": str(source), "fingerprint": self.fingerprints[k]}, indent=None)
        with atomic_path(path) as tmp:  # a failed save (disk full) leaves no partial file behind
            save_file(
                {"latents": latents.contiguous().cpu(), "clips": torch.from_numpy(np.ascontiguousarray(clips, np.int64))},
                str(tmp),
                metadata={"format": FORMAT, "episode": str(int(episode))},
            )

    def check_episodes(self, k: int, dataset: Any, episodes: Sequence[int], clips_of: Any) -> None:
        """Every listed episode of dataset ``k`` is cached, for the same frame rows ``clips_of(ep)``
        gives now; else one line naming the dataset and the first few problems."""
        missing = [e for e in episodes if not self.has_episode(k, e)]
        where = f"datasets.vla_data.latent_cache={self.root}"
        if missing and not (self.root / self.fingerprints[k]).is_dir() and self._cached_before(dataset.root):
            raise DatasetError(
                f"{where}: the files of {dataset.root} changed since it was cached (its fingerprint differs); "
                f"re-encode with {ENCODE_HINT}"
            )
        if missing:
            raise DatasetError(
                f"{where}: lacks {len(missing)} of the {len(episodes)} training episodes of {dataset.root} "
                f"(e.g. {missing[:5]}); run {ENCODE_HINT} (it encodes only what is missing)"
            )
        for e in episodes:
            problem = self.episode_problem(k, e, clips_of(e))
            if problem is not None:
                raise DatasetError(
                    f"{where}: episode {e} of {dataset.root} {problem}; {ENCODE_HINT} encodes it again"
                )

    def episode_problem(self, k: int, episode: int, want: np.ndarray) -> str | None:
        """Why the cached file of ``episode`` cannot serve samples with frame rows ``want`` (n, T),
        or None. Reads only the header and the small ``clips`` tensor, but checks that every
        sample has its latents (else a read fails mid-training, far from the cause)."""
        from safetensors import SafetensorError, safe_open

        path = self.episode_path(k, episode)
        try:
            with safe_open(str(path), framework="pt") as f:
                names = set(f.keys())
                if names != {"latents", "clips"}:
                    return f"is damaged (its file holds {sorted(names)}, expected ['clips', 'latents'])"
                stored = f.get_tensor("clips").numpy()
                shape = list(f.get_slice("latents").get_shape())
        except (SafetensorError, OSError) as err:
            return f"is unreadable ({err})"
        if len(shape) != 5 or shape[0] != len(stored):
            return f"is damaged (latents {shape} for {len(stored)} clips, expected ({len(stored)}, C, T, h, w))"
        if stored.shape != want.shape or not np.array_equal(stored, want):
            return f"was cached for other frames ({stored.shape[0]} samples, now {want.shape[0]})"
        return None

    def _cached_before(self, source: Path) -> bool:
        """Some fingerprint folder of this cache was made from a dataset at ``source``."""
        for info in self.root.glob("*/dataset.json"):
            try:
                if Path(json.loads(info.read_text())["path"]).resolve() == Path(source).resolve():
                    return True
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return False

    def read(self, k: int, episode: int, i: int) -> torch.Tensor:
        """Latents (C, T_lat, h, w) of sample ``i`` (its row within the episode) of dataset ``k``.
        Non-finite values are refused here, naming the file (a NaN would otherwise surface steps
        later as a non-finite loss, or as a step DeepSpeed silently skips)."""
        path = self.episode_path(k, episode)
        latents = self._file(path).get_slice("latents")[i]
        if not bool(torch.isfinite(latents).all()):
            raise DatasetError(
                f"latent cache file {path}: sample {i} has non-finite latents; delete it and re-encode with {ENCODE_HINT}"
            )
        return latents

    def _file(self, path: Path) -> Any:
        from safetensors import SafetensorError, safe_open

        f = self._files.pop(path, None)
        if f is None:
            try:
                f = safe_open(str(path), framework="pt")
            except (OSError, SafetensorError) as e:
                raise DatasetError(f"latent cache file {path}: unreadable ({e}); delete it and re-encode") from None
            if len(self._files) >= _OPEN_FILES:
                self._files.popitem(last=False)
        self._files[path] = f
        return f

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers get a copy without open files (safe_open handles do not pickle).
        return {**self.__dict__, "_files": OrderedDict()}
