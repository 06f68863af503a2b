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
line wrapper and the checkpoint writer share.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import uuid
from collections.abc import Iterator
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
