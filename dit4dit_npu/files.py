"""Atomic writes: a file or folder is either the old one or the complete new one, never half-new.

Every write the project makes that a reader (another rank, a resumed run, a robot) may open goes
through here: the content is written into a temp sibling (same folder, so the rename stays on one
file system), flushed to disk (``fsync``), and renamed over the target with ``os.replace``, which
is atomic on POSIX. A failure at any point removes the temp and leaves the target as it was.

    atomic_write_text(path, text)             atomic_write_bytes(path, data)
    atomic_write_json(path, obj)              with atomic_path(path) as tmp: save_file(..., tmp)
    with atomic_folder(out) as tmp: ...       publish_folder(tmp, out)   # tmp written elsewhere

Temp names start with a dot and end in ``.tmp`` (files) or hold ``.tmp-`` (folders), so globs for
the real names (``episode_*.safetensors``, ``step_*``) never match them.

Also here: ``is_out_of_space``, the one test for "the disk (or a quota) ran out" that the command
line wrapper and the checkpoint writer share, and the content hashes that checkpoints, policy
folders and the latent cache record to find files damaged in place (``hash_files``, ``edges_hash``;
``seal`` / ``seal_state`` for a JSON manifest that carries its own hash).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


def _temp_sibling(path: Path, kind: str) -> Path:
    # pid for a human reading a leftover, a random part so threads of one process never collide
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable. Some file systems cannot fsync a folder: skipped there."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temp path next to ``path`` for a writer that takes a file name (``safetensors.save_file``,
    ``torch.save``, ``pq.write_table``); when the block ends without an exception the file is
    synced and renamed to ``path``. On any exception the temp is removed and ``path`` untouched."""
    path = Path(path)
    tmp = path.with_name(_temp_sibling(path, "tmp").name + ".tmp")
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # gone after a successful rename; a partial file otherwise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (the parent folder must exist); returns ``path``."""
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
    return path


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    return atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 1) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent))


# --------------------------------------------------------------------------------------------
# Folders
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_folder(path: str | Path, replace: bool = True) -> Iterator[Path]:
    """A new, empty temp folder next to ``path`` to fill; published as ``path`` (``publish_folder``)
    when the block ends without an exception, removed otherwise.

    ``replace=True``: an existing ``path`` is replaced (moved aside first, so ``path`` is at every
    moment either the old folder or the new one). ``replace=False``: only a missing or empty
    ``path`` is taken; one that appeared with content meanwhile raises ``FileExistsError`` and the
    new folder is dropped (e.g. another process published the same cache entry first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_sibling(path, "tmp")
    tmp.mkdir()
    try:
        yield tmp
        if not replace and path.exists():
            try:
                path.rmdir()  # an empty folder (e.g. made for --out by the user) is taken
            except OSError:
                raise FileExistsError(errno.EEXIST, "exists and is not empty", str(path)) from None
        publish_folder(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish_folder(tmp: str | Path, path: str | Path, aside: str | Path | None = None) -> None:
    """Make the finished folder ``tmp`` (a sibling of ``path``) the folder ``path``: its files are
    synced, then renamed into place. An existing ``path`` is first renamed to ``aside`` (default: a
    hidden sibling) and removed after, so a kill between the two renames leaves a complete copy
    under one of the two names (``train/checkpoint.clean_stale`` puts a checkpoint's back)."""
    tmp, path = Path(tmp), Path(path)
    for root, _, names in os.walk(tmp):
        for name in names:
            _fsync_file(Path(root, name))
        _fsync_dir(Path(root))
    if not path.exists():
        os.replace(tmp, path)
    else:
        old = Path(aside) if aside is not None else _temp_sibling(path, "old")
        shutil.rmtree(old, ignore_errors=True)  # a leftover of the same name would block the rename
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(path.parent)


# --------------------------------------------------------------------------------------------
# Out of space
# --------------------------------------------------------------------------------------------

_NO_SPACE_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
# torch's zip writer and safetensors' Rust writer drop the errno; these are their short-write texts.
_NO_SPACE_TEXTS = ("no space left", "file too large", "disk quota", "file write failed", "unexpected pos",
                   "os error 28", "os error 27", "storagefull", "filetoolarge")


def is_out_of_space(e: BaseException) -> bool:
    """Whether a write failed because the disk (or a file-size/quota limit) ran out: the error
    itself or any error in its cause/context chain."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _NO_SPACE_ERRNOS:
            return True
        if any(t in str(e).lower() for t in _NO_SPACE_TEXTS):
            return True
        e = e.__cause__ or e.__context__
    return False


# --------------------------------------------------------------------------------------------
# Content hashes
# --------------------------------------------------------------------------------------------

# How ``hash_files`` hashes: sha256 (hardware-accelerated on x86 with SHA-NI and on ARMv8, faster
# there than blake2b) of each 64 MiB piece of a file, then sha256 of the pieces' digests. Pieces
# let threads hash one big file (a 10 GB optimizer shard) in parallel: hashlib releases the GIL.
HASH_SCHEME = "sha256/64MiB-pieces"
_PIECE = 64 * 2**20
_BLOCK = 8 * 2**20  # read size: large enough to stream, small enough per thread
_EDGE = 2**20


def _hash_piece(path: Path, index: int, block: int = _BLOCK) -> bytes:
    h = hashlib.sha256()
    buf = bytearray(block)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        f.seek(index * _PIECE)
        left = _PIECE
        while left > 0:
            n = f.readinto(view[: min(_BLOCK, left)])
            if not n:
                break
            h.update(view[:n])
            left -= n
    return h.digest()


def hash_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def hash_files(paths: Sequence[str | Path], workers: int | None = None) -> dict[Path, str]:
    """The content hash (``HASH_SCHEME``, hex) of each file, hashed by ``workers`` threads (default
    ``hash_workers()``). Raises OSError for a file that cannot be read."""
    paths = [Path(p) for p in paths]
    pieces = [(p, i) for p in paths for i in range(max(1, -(-p.stat().st_size // _PIECE)))]
    with ThreadPoolExecutor(max_workers=workers or hash_workers()) as pool:
        digests = list(pool.map(lambda job: _hash_piece(*job), pieces))
    out: dict[Path, list[bytes]] = {p: [] for p in paths}
    for (p, _), d in zip(pieces, digests):
        out[p].append(d)
    return {p: hashlib.sha256(b"".join(ds)).hexdigest() for p, ds in out.items()}


def hash_file(path: str | Path) -> str:
    """``hash_files([path])[path]`` in this thread, reading into a buffer no larger than the file:
    for many small files (a dataset's videos, hashed from loader workers), where a thread pool and
    an 8 MiB buffer per file cost more than the hashing (~4 ms against microseconds)."""
    path = Path(path)
    size = path.stat().st_size
    block = max(1, min(_BLOCK, size))
    pieces = (_hash_piece(path, i, block) for i in range(max(1, -(-size // _PIECE))))
    return hashlib.sha256(b"".join(pieces)).hexdigest()


def edges_hash(path: str | Path) -> str:
    """sha256 of a file's size and its first and last MiB (the whole file when smaller): a cheap
    check that a file is still the one hashed whole before. An mp4 keeps its index of frame sizes
    and offsets (the ``moov`` box) at one of its two ends, so a re-encoded or edited video changes
    its size or these bytes; only a deliberate same-size edit of the middle goes unseen."""
    path = Path(path)
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(_EDGE))
        if size > 2 * _EDGE:
            f.seek(size - _EDGE)
            h.update(f.read(_EDGE))
        elif size > _EDGE:
            h.update(f.read())
    return h.hexdigest()


# A JSON manifest that lists other files' hashes carries its own under this key: the sha256 of
# its other keys in canonical form (sorted keys, no spaces). A flipped byte that leaves valid JSON
# (a digit of a size, a letter of a hash) is then named as the manifest's damage, not its files'.
SELF_HASH = "manifest_sha256"


def _canonical_digest(obj: dict[str, Any]) -> str:
    body = {k: v for k, v in obj.items() if k != SELF_HASH}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with its own content hash under ``SELF_HASH`` (last, so a reader sees the rest first)."""
    body = {k: v for k, v in obj.items() if k != SELF_HASH}
    return {**body, SELF_HASH: _canonical_digest(body)}


def seal_state(obj: dict[str, Any]) -> str:
    """"ok" (its own hash matches), "broken" (it does not: the manifest was changed after it was
    written) or "none" (it records none: written by an older version)."""
    if SELF_HASH not in obj:
        return "none"
    return "ok" if obj[SELF_HASH] == _canonical_digest(obj) else "broken"
