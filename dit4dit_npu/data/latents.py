"""The latent cache: every training sample's clip VAE-encoded once, read back instead of video.

The VAE is frozen, its posterior-mean encode is deterministic and the training data has no
augmentation, so a sample's clip latents are a function of the dataset alone; caching them is
exact. ``python -m dit4dit_npu.data.encode_latents`` writes a cache; training with
``datasets.vla_data.latent_cache=DIR`` reads it (``RoboTwinDataset`` then never decodes video,
the loader's main cost, and the model skips its VAE encode, about a fifth of a full-size step).

What the latents depend on, and how each is keyed (a change of any one is refused, never used):

- the clip's pixels: the dataset (``dataset_fingerprint``: its meta/ contents and the names of
  its data and video files; one sub-folder per fingerprint), each episode's source files (its
  data file, whose timestamps pick the frames, and its camera videos: size, mtime, a hash of
  their first and last MiB and the whole file's content hash recorded per episode, see
  ``source_record``) and each sample's frame rows (stored per episode, compared with what the
  dataset would read now);
- how the frames become the VAE input: cameras, crops, image size and resize path, view layout,
  clip offsets (the manifest's ``CacheKey``);
- the VAE: its weights and the dtype it runs in (``weights.vae_identity``, in the key).

The latents themselves are fingerprinted too: each episode file records the sha256 of its latent
bytes. Content, not mtimes, decides what is trained on: the first time a run reads an episode
(``read``, once per run across its loader workers: ``_verified`` is in shared memory), its whole
latent tensor is hashed (the bytes the run's reads of its samples take anyway) and each of its
source files hashed whole, against what was recorded when it was encoded; a difference stops
the run in one line naming the file and what changed. The start-up check (``check_episodes``)
is a cheap first look that finds most damage before a step: each episode file's mtime is set to
a value it records, so one ``stat`` shows it was not rewritten, and only a file that was is
hashed there; a source file is checked by size, and by its edges when its mtime moved. An edit
with the mtime put back passes the first look and is caught at the first read. A value far
outside the VAE's range (``latent_bound`` in the manifest: the encoder's probe of the VAE,
``encode_latents.latent_bound``) is refused when written and when read.

Layout::

    DIR/manifest.json                                  format + CacheKey + latent_bound
    DIR/<fingerprint>/dataset.json                     where the dataset was (information only)
    DIR/<fingerprint>/episode_000012.safetensors       latents (n, 16, T_lat, h, w) in the VAE's dtype,
                                                       clips (n, T) int64: the frame rows of each of
                                                       the episode's n samples, in row order; metadata:
                                                       the latents' sha256, the file's mtime, sources

An episode file is written whole (temp file + rename), so an interrupted encode resumes at the
first missing episode and a reader never sees half a file.

What decides the latents (the ``CacheKey``, the dataset's and the files' fingerprints) is
``latent_key.py``; this module is the cache folder: its manifest, episode files, checks and reads.
"""

from __future__ import annotations

import json
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dit4dit_npu.data.errors import DatasetError
from dit4dit_npu.data.latent_key import (
    CacheKey,
    dataset_fingerprint,
    episode_sources,
    latents_sha256,
    source_content_problem,
    source_problem,
    source_record,
)
from dit4dit_npu.files import atomic_path, atomic_write_json, is_out_of_space

# 2: content hashes and the VAE's latent bound; 3: each source file's whole content hash
FORMAT = "dit4dit_npu.latent_cache/3"
MANIFEST = "manifest.json"
ENCODE_HINT = "python -m dit4dit_npu.data.encode_latents --config FILE --out DIR"
_OPEN_FILES = 32  # episode files kept open per process (each is an mmap; reads are ~15 us)


class LatentCache:
    """A cache folder whose manifest matches ``key``; ``fingerprints[k]`` names dataset k of the run."""

    def __init__(self, root: Path, key: CacheKey, fingerprints: Sequence[str], bound: float) -> None:
        self.root, self.key, self.fingerprints = Path(root), key, list(fingerprints)
        self.bound = float(bound)  # the largest |latent| the VAE plausibly gives (manifest's latent_bound)
        self._files: OrderedDict[Path, Any] = OrderedDict()
        self._sources: dict[Path, dict[str, Any]] = {}  # source file -> its record, once per process
        # Verified by content in this run (an episode file, or a source file, which a v3.0 video
        # shares between episodes) -> its slot in ``_verified``: set once by whichever process
        # (a loader worker) reads it first, seen by all (shared memory; workers start each epoch).
        self._slots: dict[Any, int] = {}
        self._roots: dict[int, Path] = {}
        self._checked_sources: dict[tuple[int, int], list[str]] = {}  # episode_problem's, for _track
        self._verified = torch.zeros(0, dtype=torch.uint8)
        self._untracked: set[tuple[int, int]] = set()  # read without check_episodes: this process only
        self.verify_seconds = 0.0  # time this process spent verifying (bench/latent_verify.py)

    # ------------------------------------------------------------------ opening

    @classmethod
    def create(
        cls, root: str | Path, key: CacheKey, datasets: Sequence[Any], bound: float | None = None, write: bool = True
    ) -> LatentCache | None:
        """Open ``root`` for writing: a new folder gets a manifest with ``bound`` (the VAE's latent
        bound); an existing cache must have this key (adding datasets or episodes to it is fine;
        another VAE or image size is not). ``write=False`` only checks (every rank does, so all
        fail alike before rank 0 writes)."""
        root = Path(root)
        if (root / MANIFEST).is_file():
            return cls.open(root, key, datasets)
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise DatasetError(f"--out {root}: exists and is not a latent cache (no {MANIFEST}); choose an empty folder")
        if not write:
            return None
        if bound is None or not np.isfinite(bound) or bound <= 0:
            raise ValueError(f"a new latent cache needs the VAE's latent bound (> 0), got {bound}")
        try:
            root.mkdir(parents=True, exist_ok=True)
            atomic_write_json(root / MANIFEST, {"format": FORMAT, "key": key.to_dict(), "latent_bound": float(bound)})
        except OSError as e:
            raise DatasetError(f"--out {root}: cannot create the cache folder ({e.strerror or e})") from None
        return cls(root, key, [dataset_fingerprint(ds.root) for ds in datasets], bound)

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
            saved = CacheKey.from_dict(manifest["key"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # AttributeError: "key" is not a mapping
            raise DatasetError(f"{where}: {MANIFEST} has no valid key ({e})") from None
        diff = saved.difference(key)
        if diff is not None:
            raise DatasetError(f"{where} is stale ({diff}); re-encode into a new folder with {ENCODE_HINT}")
        bound = manifest.get("latent_bound")
        if isinstance(bound, bool) or not isinstance(bound, int | float) or not 0 < bound < float("inf"):
            raise DatasetError(f"{where}: {MANIFEST} has no valid latent_bound (got {bound!r}); re-encode with {ENCODE_HINT}")
        return cls(root, key, [dataset_fingerprint(ds.root) for ds in datasets], bound)

    # ------------------------------------------------------------------ episodes

    def episode_path(self, k: int, episode: int) -> Path:
        return self.root / self.fingerprints[k] / f"episode_{int(episode):06d}.safetensors"

    def has_episode(self, k: int, episode: int) -> bool:
        return self.episode_path(k, episode).is_file()

    def write_episode(self, k: int, episode: int, latents: torch.Tensor, clips: np.ndarray, dataset: Any) -> None:
        """All samples of one episode: latents (n, C, T_lat, h, w) and their frame rows (n, T),
        with the sha256 of the latents and the records of its source files. Non-finite latents (a
        VAE overflowing in bf16, say) and latents beyond the VAE's bound are refused, not cached
        for training."""
        from safetensors.torch import save_file

        source = Path(dataset.root)
        peak = latents.detach().abs().flatten(1).amax(1).float()
        bad = (~torch.isfinite(peak)).nonzero().flatten().tolist()
        if bad:
            raise DatasetError(
                f"episode {int(episode)} of {source}: the VAE gave non-finite latents for {len(bad)} of its "
                f"{len(latents)} clips (e.g. sample {bad[0]}, frame rows {np.asarray(clips)[bad[0]].tolist()}); "
                "nothing written for it"
            )
        if float(peak.max()) > self.bound:
            i = int(peak.argmax())
            raise DatasetError(
                f"episode {int(episode)} of {source}: the VAE gave latents up to {float(peak[i]):.4g} for sample {i} "
                f"(frame rows {np.asarray(clips)[i].tolist()}), beyond its range (|x| <= {self.bound:.4g}); "
                "nothing written for it"
            )
        sources = {rel: self._source(source / rel) for rel in episode_sources(dataset, episode, self.key.camera_keys)}
        path = self.episode_path(k, episode)
        path.parent.mkdir(parents=True, exist_ok=True)
        info = path.parent / "dataset.json"
        if not info.is_file():
            atomic_write_json(info, {"path": str(source), "fingerprint": self.fingerprints[k]}, indent=None)
        latents = latents.contiguous().cpu()
        stamp = time.time_ns() // 10**9 * 10**9  # whole seconds: every file system stores them exactly
        try:
            with atomic_path(path) as tmp:  # a failed save (disk full) leaves no partial file behind
                save_file(
                    {"latents": latents, "clips": torch.from_numpy(np.ascontiguousarray(clips, np.int64))},
                    str(tmp),
                    metadata={
                        "format": FORMAT, "episode": str(int(episode)), "latents_sha256": latents_sha256(latents),
                        "mtime_ns": str(stamp), "sources": json.dumps(sources),
                    },
                )
        except Exception as e:  # safetensors reports a full disk as its own error type, not OSError
            if not is_out_of_space(e):
                raise
            raise DatasetError(
                f"no space left writing {path} ({' '.join(str(e).split())}); nothing partial was left, the episodes "
                "written before are kept: run the encoder again once there is space"
            ) from None
        os.utime(path, ns=(stamp, stamp))

    def _source(self, path: Path) -> dict[str, Any]:
        if path not in self._sources:  # a v3.0 video file holds many episodes: recorded once
            self._sources[path] = source_record(path)
        return self._sources[path]

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
            problem = self.episode_problem(k, e, clips_of(e), dataset)
            if problem is not None:
                raise DatasetError(
                    f"{where}: episode {e} of {dataset.root} {problem}; {ENCODE_HINT} encodes it again"
                )
        self._track(k, Path(dataset.root), episodes)

    def _track(self, k: int, root: Path, episodes: Sequence[int]) -> None:
        """Give dataset ``k``'s episodes (and their source files) a slot in the shared ``_verified``
        flags, before any loader worker starts: the first read of each is then checked by content."""
        self._roots[k] = root
        for e in episodes:
            self._slots.setdefault(("episode", k, int(e)), len(self._slots))
            for rel in self._checked_sources.pop((k, int(e)), ()):
                self._slots.setdefault(("source", str(root / rel)), len(self._slots))
        flags = torch.zeros(len(self._slots), dtype=torch.uint8)
        flags[: len(self._verified)] = self._verified
        self._verified = flags.share_memory_()

    def episode_problem(self, k: int, episode: int, want: np.ndarray, dataset: Any, restamp: bool = False) -> str | None:
        """Why the cached file of ``episode`` cannot serve samples with frame rows ``want`` (n, T),
        or None. Checks that every sample has its latents (else a read fails mid-training, far from
        the cause), that its source files are the ones it was encoded from, and that its latents
        are the bytes encoded: from the file's mtime when it is the one recorded (one ``stat``),
        else by hashing them. ``restamp`` (the encoder) sets the recorded mtime back on a file
        whose latents hash right (a cache copied without its times), so later checks are cheap."""
        from safetensors import SafetensorError, safe_open

        path = self.episode_path(k, episode)
        try:
            with safe_open(str(path), framework="pt") as f:
                names = set(f.keys())
                if names != {"latents", "clips"}:
                    return f"is damaged (its file holds {sorted(names)}, expected ['clips', 'latents'])"
                meta = f.metadata() or {}
                stored = f.get_tensor("clips").numpy()
                shape = list(f.get_slice("latents").get_shape())
                stamp = int(meta.get("mtime_ns", "-1"))
                sources = json.loads(meta.get("sources", "null"))
                latents = None if path.stat().st_mtime_ns == stamp else f.get_tensor("latents")
        except (SafetensorError, OSError, ValueError) as err:
            return f"is unreadable ({' '.join(str(err).split())})"
        if len(shape) != 5 or shape[0] != len(stored):
            return f"is damaged (latents {shape} for {len(stored)} clips, expected ({len(stored)}, C, T, h, w))"
        if stored.shape != want.shape or not np.array_equal(stored, want):
            return f"was cached for other frames ({stored.shape[0]} samples, now {want.shape[0]})"
        if "latents_sha256" not in meta or not isinstance(sources, dict):
            return "has no content fingerprint (written by another tool, or edited)"
        if latents is not None:
            if latents_sha256(latents) != meta["latents_sha256"]:
                return "was changed since it was encoded (its latents do not match their recorded sha256)"
            if restamp:
                os.utime(path, ns=(stamp, stamp))
        for rel, record in sources.items():
            problem = source_problem(Path(dataset.root) / rel, record if isinstance(record, dict) else {})
            if problem is not None:
                return problem
        self._checked_sources[(k, int(episode))] = list(sources)
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
        Non-finite values and values beyond the VAE's bound are refused here, naming the file (a
        NaN would otherwise surface steps later as a non-finite loss, or as a step DeepSpeed
        silently skips; a scaled episode would be trained on). One reduction per sample: the
        first read of an episode checks its content (``_verify``); this is the backstop behind it."""
        path = self.episode_path(k, episode)
        slot = self._slots.get(("episode", k, int(episode)))
        if not (self._verified[slot] if slot is not None else (k, int(episode)) in self._untracked):
            self._verify(k, int(episode), path, slot)
        latents = self._file(path).get_slice("latents")[i]
        peak = float(latents.abs().max())
        if peak != peak or peak == float("inf"):
            raise DatasetError(
                f"latent cache file {path}: sample {i} has non-finite latents; delete it and re-encode with {ENCODE_HINT}"
            )
        if peak > self.bound:
            raise DatasetError(
                f"latent cache file {path}: episode {int(episode)} sample {i} has latents up to {peak:.4g}, far "
                f"outside the VAE's range (|x| <= {self.bound:.4g}); delete it and re-encode with {ENCODE_HINT}"
            )
        return latents

    def _verify(self, k: int, episode: int, path: Path, slot: int | None) -> None:
        """The episode's latents and source files, by content, against what the file recorded when
        it was encoded (the first read of the episode in this run); one line naming what changed.
        The whole latent tensor is hashed: the run reads every sample of it this epoch anyway."""
        t0 = time.perf_counter()
        f = self._file(path)
        meta = f.metadata() or {}
        if latents_sha256(f.get_tensor("latents")) != meta.get("latents_sha256"):
            raise DatasetError(
                f"latent cache file {path}: episode {episode}'s latents do not match the sha256 recorded when they "
                f"were encoded (changed since, its mtime set back); delete it and re-encode with {ENCODE_HINT}"
            )
        try:
            sources = json.loads(meta.get("sources", "null"))
        except ValueError:
            sources = None
        if not isinstance(sources, dict):
            raise DatasetError(f"latent cache file {path}: records no valid sources; delete it and re-encode with "
                               f"{ENCODE_HINT}")
        root = self._roots.get(k)
        for rel, record in sorted(sources.items()):
            if root is None:  # a cache read without check_episodes: nothing to compare the sources with
                break
            source = root / rel
            at = self._slots.get(("source", str(source)))
            if at is not None and self._verified[at]:
                continue
            problem = source_content_problem(source, record if isinstance(record, dict) else {})
            if problem is not None:
                raise DatasetError(f"latent cache file {path}: episode {episode}: {problem}; delete it and re-encode "
                                   f"with {ENCODE_HINT}")
            if at is not None:
                self._verified[at] = 1
        if slot is not None:
            self._verified[slot] = 1
        else:
            self._untracked.add((k, episode))
        self.verify_seconds += time.perf_counter() - t0

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
