"""What decides a latent-cache entry: the ``CacheKey`` and the fingerprints of the dataset, its
source files and the latents themselves (``latents.py``'s docstring says what each one guards).

Apart from the cache folder (``latents.py``) because this is the identity of a sample's latents,
not its storage: the encoder and the dataset builder make the key (``CacheKey.of``: a PolicyIO and
a VAE identity), and the cache records it and compares each run's key with it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dit4dit_npu.files import edges_hash, hash_file


@dataclass(frozen=True)
class CacheKey:
    """Everything besides the dataset files that decides a sample's latents."""

    camera_keys: tuple[str, ...]
    image_size: tuple[int, int]
    view_layout: str
    clip_offsets: tuple[int, ...]
    vae: str  # weights.vae_identity: weights + the dtype the VAE runs in
    # PolicyIO.camera_crops as sorted (camera, crop) pairs; a manifest without them: no crops
    camera_crops: tuple[tuple[str, tuple[float, ...]], ...] = ()
    # How frames become views: caches written before the views took the PolicyIO's one path
    # (frames resized inside the decoder's YUV->RGB pass) hold other pixels, and have no such key.
    view_path: str = "resized at decode"

    @classmethod
    def of(cls, io: Any, vae: str) -> CacheKey:
        """The key of a PolicyIO's clips (cameras, crops, size, layout, offsets) encoded by ``vae``."""
        crops = tuple(sorted((k, tuple(float(v) for v in c)) for k, c in io.camera_crops.items()))
        path = f"rgb as stored, then {io.resize_method} resize"  # PolicyIO.view: the live images' path
        return cls(tuple(io.camera_keys), tuple(io.image_size), io.view_layout, tuple(io.clip_offsets), vae, crops, path)

    def to_dict(self) -> dict[str, Any]:
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}
        d["camera_crops"] = {k: list(c) for k, c in self.camera_crops}
        if not self.camera_crops:  # manifests of caches without crops stay as they were
            del d["camera_crops"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CacheKey:
        d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        crops = d.pop("camera_crops", {})
        return cls(**d, camera_crops=tuple(sorted((str(k), tuple(float(v) for v in c)) for k, c in crops.items())))

    def difference(self, other: CacheKey) -> str | None:
        """The first field that differs, as 'field: cache X, this run Y', else None."""
        mine, theirs = self.to_dict(), other.to_dict()
        for name in [f.name for f in dataclasses.fields(self)]:
            if mine.get(name, {}) != theirs.get(name, {}):
                return f"{name}: the cache has {mine.get(name, {})!r}, this run {theirs.get(name, {})!r}"
        return None


def dataset_fingerprint(root: str | Path) -> str:
    """A dataset's identity: its meta/ files' contents and the names of its data and video files.
    Path-independent (a moved dataset keeps its cache), cheap (no video is read). An edited data or
    video file is found per episode (``source_problem``), so only its episodes are encoded again."""
    root = Path(root)
    h = hashlib.sha256()
    for sub, content in (("meta", True), ("data", False), ("videos", False)):
        for f in sorted(p for p in (root / sub).rglob("*") if p.is_file()):
            rel = f.relative_to(root).as_posix().encode()
            h.update(rel + (f.read_bytes() if content else b""))
    return h.hexdigest()[:20]


def latents_sha256(latents: torch.Tensor) -> str:
    """sha256 of a latent tensor's bytes as stored (any dtype, bf16 included)."""
    flat = latents.detach().contiguous().cpu().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy()).hexdigest()


def episode_sources(dataset: Any, episode: int, camera_keys: Sequence[str]) -> list[str]:
    """The files an episode's cached clips come from, relative to the dataset root: its data file
    (its timestamps pick the frames) and the video of each camera."""
    ep = dataset.meta.episode(int(episode))
    return sorted({Path(ep["data_path"]).as_posix(), *(Path(ep["videos"][k]["path"]).as_posix() for k in camera_keys)})


def source_record(path: Path) -> dict[str, Any]:
    """What an episode records of a source file when it is encoded: size, mtime and edges (the
    start-up's first look, ``source_problem``) and the whole file's content hash (what the first
    read of the episode in a run checks, ``source_content_problem``). The encoder has just decoded
    the file, so hashing it reads bytes that are in the page cache."""
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "edges": edges_hash(path), "sha256": hash_file(path)}


def source_problem(path: Path, saved: dict[str, Any]) -> str | None:
    """The start-up's cheap first look at a source file: its size, and when its mtime moved (a copy
    that did not keep times, a touch, an edit) its first and last MiB (``files.edges_hash``, at
    most 2 MiB read). Hashing every video whole at every start-up would read the whole dataset
    (hundreds of GB at 100k episodes) each time; this finds a re-encoded or edited video, whose
    size or index changes, before a step. What it cannot see (a same-size edit with the mtime put
    back) the first read of the episode in the run finds, by content (``source_content_problem``)."""
    try:
        st = path.stat()
    except OSError:
        return f"its source {path} is missing"
    if st.st_size != saved.get("size"):
        return f"its source {path} changed since it was encoded ({st.st_size} bytes, {saved.get('size')} then)"
    if st.st_mtime_ns != saved.get("mtime_ns") and edges_hash(path) != saved.get("edges"):
        return f"its source {path} changed since it was encoded (same size, other content)"
    return None


def source_content_problem(path: Path, saved: dict[str, Any]) -> str | None:
    """Whether a source file's whole content is what the episode was encoded from (read whole)."""
    try:
        digest = hash_file(path)
    except OSError as e:
        return f"its source {path} cannot be read ({e.strerror or e})"
    if digest != saved.get("sha256"):
        same = "same size and mtime" if _same_stat(path, saved) else "same size"
        return f"its source {path} changed since it was encoded ({same}, other content: its sha256 differs)"
    return None


def _same_stat(path: Path, saved: dict[str, Any]) -> bool:
    st = path.stat()
    return st.st_size == saved.get("size") and st.st_mtime_ns == saved.get("mtime_ns")
