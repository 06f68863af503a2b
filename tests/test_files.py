"""dit4dit_npu.files: a write either lands whole or leaves the target as it was, and no temp behind."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from dit4dit_npu.files import (
    atomic_folder,
    atomic_path,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    is_out_of_space,
    publish_folder,
)


class Boom(Exception):
    pass


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_file_writes_land_whole(tmp_path: Path) -> None:
    atomic_write_bytes(tmp_path / "a.bin", b"\x00\x01")
    atomic_write_text(tmp_path / "b.txt", "héllo")
    atomic_write_json(tmp_path / "c.json", {"x": [1, 2]})
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "b.txt").read_text(encoding="utf-8") == "héllo"
    assert json.loads((tmp_path / "c.json").read_text()) == {"x": [1, 2]}
    atomic_write_text(tmp_path / "b.txt", "new")  # replacing
    assert (tmp_path / "b.txt").read_text() == "new"
    assert names(tmp_path) == ["a.bin", "b.txt", "c.json"]


def test_a_failed_file_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "x.safetensors"
    target.write_text("old")
    with pytest.raises(Boom), atomic_path(target) as tmp:
        tmp.write_text("half of the new")
        raise Boom
    assert target.read_text() == "old" and names(tmp_path) == ["x.safetensors"]
    with pytest.raises(TypeError):  # json of an object it cannot encode: nothing written
        atomic_write_json(target, {"bad": object()})
    assert target.read_text() == "old" and names(tmp_path) == ["x.safetensors"]


def test_the_temp_is_a_hidden_sibling_no_glob_of_real_names_matches(tmp_path: Path) -> None:
    with atomic_path(tmp_path / "episode_000001.safetensors") as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".") and tmp.name.endswith(".tmp")
        tmp.write_bytes(b"x")
        assert list(tmp_path.glob("episode_*.safetensors")) == []
    assert names(tmp_path) == ["episode_000001.safetensors"]


def test_folder_is_published_whole_and_replaces_an_old_one(tmp_path: Path) -> None:
    out = tmp_path / "policy"
    with atomic_folder(out) as tmp:
        (tmp / "a.txt").write_text("1")
        assert not out.exists()  # nothing visible until the block ends
    assert names(out) == ["a.txt"]
    with atomic_folder(out) as tmp:
        (tmp / "b.txt").write_text("2")
        assert names(out) == ["a.txt"]  # the old folder stays whole while the new one is written
    assert names(out) == ["b.txt"] and names(tmp_path) == ["policy"]


def test_a_failed_folder_write_keeps_the_old_folder_and_leaves_no_temp(tmp_path: Path) -> None:
    out = tmp_path / "data"
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    with pytest.raises(Boom), atomic_folder(out) as tmp:
        (tmp / "half").write_text("x")
        raise Boom
    assert names(tmp_path) == ["data"] and names(out) == ["mine.txt"]


def test_replace_false_takes_only_a_missing_or_empty_folder(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with atomic_folder(empty, replace=False) as tmp:
        (tmp / "a").write_text("1")
    assert names(empty) == ["a"]
    taken = tmp_path / "taken"
    with pytest.raises(FileExistsError), atomic_folder(taken, replace=False) as tmp:
        (tmp / "mine").write_text("1")
        taken.mkdir()  # another process published it meanwhile
        (taken / "theirs").write_text("2")
    assert names(taken) == ["theirs"] and names(tmp_path) == ["empty", "taken"]


def test_publish_folder_moves_the_old_copy_to_the_given_aside_name(tmp_path: Path) -> None:
    final, tmp, aside = tmp_path / "step_1", tmp_path / ".tmp-step_1", tmp_path / ".old-step_1"
    final.mkdir()
    (final / "old").write_text("o")
    tmp.mkdir()
    (tmp / "sub").mkdir()
    (tmp / "sub" / "new").write_text("n")
    publish_folder(tmp, final, aside=aside)
    assert names(tmp_path) == ["step_1"] and (final / "sub" / "new").read_text() == "n"


def test_is_out_of_space_follows_the_cause_chain() -> None:
    assert is_out_of_space(OSError(errno.ENOSPC, "No space left on device"))
    assert is_out_of_space(RuntimeError("safetensors: os error 28"))
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as e:
            raise RuntimeError("save failed") from e
    except RuntimeError as wrapped:
        assert is_out_of_space(wrapped)
    assert not is_out_of_space(OSError(errno.EACCES, "Permission denied"))
    assert not is_out_of_space(ValueError("bad value"))


def test_hash_file_is_hash_files_without_threads(tmp_path):
    """The one-file hash (the latent cache's source files) gives the same digest as the threaded
    one, for an empty file, a small one and one of several 64 MiB pieces."""
    from dit4dit_npu.files import hash_file, hash_files

    files = [tmp_path / "empty", tmp_path / "small", tmp_path / "pieces"]
    files[0].write_bytes(b"")
    files[1].write_bytes(b"abc" * 1000)
    files[2].write_bytes(bytes(range(256)) * (130 * 2**20 // 256))  # three pieces, the last partial
    assert [hash_file(f) for f in files] == [hash_files([f])[f] for f in files]
