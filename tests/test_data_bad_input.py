"""Bad datasets and configs: one clear DatasetError naming the file/key and expectation; nothing written."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dit4dit_npu.config import load_config
from dit4dit_npu.data import build_training_data
from dit4dit_npu.data.cli import inspect_main
from dit4dit_npu.data.demo import write_demo_dataset
from dit4dit_npu.data.errors import DatasetError
from dit4dit_npu.data.inspect import check_dataset
from dit4dit_npu.data.lerobot import LeRobotDataset

HIGH = "observation.images.cam_high"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("pristine")
    return {
        v: write_demo_dataset(base / v, v, num_episodes=4, episode_length=12, fps=10, num_tasks=2)
        for v in ("v2.1", "v3.0")
    }


@pytest.fixture(params=["v2.1", "v3.0"])
def ds_copy(request, pristine, tmp_path: Path) -> Path:
    dst = tmp_path / "data" / "ds"
    shutil.copytree(pristine[request.param], dst)
    return dst


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def raises_and_writes_nothing(watch: Path, fn: Callable[[], object], *patterns: str) -> str:
    before = snapshot(watch)
    with pytest.raises(DatasetError) as err:
        fn()
    assert snapshot(watch) == before
    msg = str(err.value)
    for p in patterns:
        assert p in msg, f"{p!r} not in {msg!r}"
    return msg


def cfg_for(root: Path, *extra: str):
    return load_config(
        None,
        [
            f"datasets.vla_data.data_root_dir={root.parent}",
            f"datasets.vla_data.data_mix=[{{path: {root.name}}}]",
            "datasets.vla_data.image_size=[32, 32]",
            "datasets.vla_data.val_fraction=0.0",
            *extra,
        ],
    )


def first_data_file(root: Path) -> Path:
    return sorted((root / "data").rglob("*.parquet"))[0]


def first_video(root: Path) -> Path:
    return sorted((root / "videos").rglob("*.mp4"))[0]


def test_missing_info_json(ds_copy: Path) -> None:
    (ds_copy / "meta/info.json").unlink()
    raises_and_writes_nothing(ds_copy.parent, lambda: LeRobotDataset(ds_copy), "missing", "meta/info.json")
    assert any("info.json" in p for p in check_dataset(ds_copy))


def test_unknown_codebase_version(ds_copy: Path) -> None:
    info = json.loads((ds_copy / "meta/info.json").read_text())
    info["codebase_version"] = "v9.9"
    (ds_copy / "meta/info.json").write_text(json.dumps(info))
    raises_and_writes_nothing(
        ds_copy.parent, lambda: LeRobotDataset(ds_copy), "'v9.9'", "info.json", "v2.1", "v3.0"
    )


def test_missing_video(ds_copy: Path) -> None:
    video = first_video(ds_copy)
    video.unlink()
    raises_and_writes_nothing(
        ds_copy.parent, lambda: LeRobotDataset(ds_copy), "video file(s) missing", str(video)
    )


def test_truncated_video(ds_copy: Path) -> None:
    video = first_video(ds_copy)
    data = video.read_bytes()
    video.write_bytes(data[: len(data) // 2])
    ds = LeRobotDataset(ds_copy)
    key = next(k for k in ds.meta.video_keys if k in str(video))
    raises_and_writes_nothing(ds_copy.parent, lambda: ds.frames_at([0], key), str(video), "truncated")
    assert any(str(video) in p for p in check_dataset(ds_copy))


def test_camera_key_absent(ds_copy: Path) -> None:
    cfg = cfg_for(
        ds_copy, "datasets.vla_data.camera_keys=[observation.images.cam_high, observation.images.cam_top]"
    )
    raises_and_writes_nothing(
        ds_copy.parent, lambda: build_training_data(cfg), str(ds_copy), "'observation.images.cam_top'", HIGH
    )


def test_declared_width_differs_from_the_parquet(ds_copy: Path) -> None:
    info = ds_copy / "meta" / "info.json"
    meta = json.loads(info.read_text())
    meta["features"]["action"]["shape"] = [16]
    info.write_text(json.dumps(meta))
    raises_and_writes_nothing(
        ds_copy.parent,
        lambda: build_training_data(cfg_for(ds_copy)),
        str(ds_copy),
        "'action' is 14 wide in the parquet files but meta/info.json declares 16",
    )


def test_state_key_absent(ds_copy: Path) -> None:
    cfg = cfg_for(ds_copy, "datasets.vla_data.state_key=observation.qpos")
    raises_and_writes_nothing(
        ds_copy.parent, lambda: build_training_data(cfg), "'observation.qpos'", "observation.state"
    )


def test_nan_in_parquet(ds_copy: Path) -> None:
    path = first_data_file(ds_copy)
    table = pq.read_table(path)
    actions = np.array(table.column("action").to_pylist(), dtype=np.float32)
    actions[5, 3] = np.nan
    table = table.set_column(
        table.column_names.index("action"), "action", pa.array(list(actions), pa.list_(pa.float32()))
    )
    pq.write_table(table, path)
    raises_and_writes_nothing(
        ds_copy.parent, lambda: LeRobotDataset(ds_copy), str(path), "'action'", "NaN", "frame_index 5"
    )
    assert any(str(path) in p and "NaN" in p for p in check_dataset(ds_copy))


def test_timestamps_off_the_fps_grid(ds_copy: Path) -> None:
    path = first_data_file(ds_copy)
    table = pq.read_table(path)
    ts = np.array(table.column("timestamp").to_pylist(), dtype=np.float32)
    ts[4] += 0.03  # 0.3 frame at 10 fps
    table = table.set_column(table.column_names.index("timestamp"), "timestamp", pa.array(ts))
    pq.write_table(table, path)
    raises_and_writes_nothing(ds_copy.parent, lambda: LeRobotDataset(ds_copy), str(path), "1/fps")


def test_clip_offsets_off_a_video_frame_grid(ds_copy: Path) -> None:
    info = json.loads((ds_copy / "meta/info.json").read_text())
    info["features"][HIGH]["info"]["video.fps"] = 7  # video at another rate than the data
    (ds_copy / "meta/info.json").write_text(json.dumps(info))
    raises_and_writes_nothing(
        ds_copy.parent, lambda: build_training_data(cfg_for(ds_copy)), "7 fps grid", HIGH
    )


def test_missing_dataset_folder(tmp_path: Path) -> None:
    raises_and_writes_nothing(
        tmp_path,
        lambda: build_training_data(cfg_for(tmp_path / "nope")),
        "not found",
        "python -m dit4dit_npu.data.demo --out",
    )


def test_inspect_check_lists_every_problem(ds_copy: Path, capsys) -> None:
    data_file, video = first_data_file(ds_copy), first_video(ds_copy)
    table = pq.read_table(data_file)
    state = np.array(table.column("observation.state").to_pylist(), dtype=np.float32)
    state[0, 0] = np.inf
    col = table.column_names.index("observation.state")
    pq.write_table(
        table.set_column(col, "observation.state", pa.array(list(state), pa.list_(pa.float32()))), data_file
    )
    video.unlink()
    before = snapshot(ds_copy.parent)
    assert inspect_main([str(ds_copy), "--check"]) == 1
    out = capsys.readouterr().out
    assert "2 problem(s)" in out and str(data_file) in out and "NaN/inf" in out and str(video) in out
    assert snapshot(ds_copy.parent) == before
    assert inspect_main([str(ds_copy.parent / "nothing"), "--check"]) == 1


def test_inspect_check_episode_length_mismatch(ds_copy: Path) -> None:
    if (ds_copy / "meta/episodes.jsonl").is_file():
        lines = (ds_copy / "meta/episodes.jsonl").read_text().splitlines()
        ep = json.loads(lines[1])
        ep["length"] += 1
        lines[1] = json.dumps(ep)
        (ds_copy / "meta/episodes.jsonl").write_text("\n".join(lines) + "\n")
    else:
        path = next((ds_copy / "meta/episodes").rglob("*.parquet"))
        table = pq.read_table(path)
        lengths = table.column("length").to_pylist()
        lengths[1] += 1
        pq.write_table(
            table.set_column(table.column_names.index("length"), "length", pa.array(lengths)), path
        )
    problems = check_dataset(ds_copy)
    assert any("episode 1 has 12 rows, metadata length is 13" in p for p in problems)
    assert any("video frames" in p for p in problems)  # the videos no longer match the lengths either
    assert any("total_frames is 48 but meta/episodes" in p and "lists 49" in p for p in problems)
    with pytest.raises(DatasetError, match="total_frames is 48 but meta/episodes.* lists 49"):
        LeRobotDataset(ds_copy)


# -- more bad datasets ---------------------------------------------------------------------------


def set_info(root: Path, **changes) -> None:
    info = json.loads((root / "meta/info.json").read_text())
    info.update(changes)
    (root / "meta/info.json").write_text(json.dumps(info))


def test_non_numeric_fps(ds_copy: Path) -> None:
    set_info(ds_copy, fps="fast")
    raises_and_writes_nothing(
        ds_copy.parent, lambda: LeRobotDataset(ds_copy), f"{ds_copy}/meta/info.json: fps must be a number > 0, got 'fast'"
    )
    assert check_dataset(ds_copy) == [f"{ds_copy}/meta/info.json: fps must be a number > 0, got 'fast'"]


def drop_index_rows(root: Path, keep: Callable[[int], bool]) -> None:
    """Remove episodes from the episode index only (their data and videos stay on disk)."""
    if (root / "meta/episodes.jsonl").is_file():
        lines = (root / "meta/episodes.jsonl").read_text().splitlines()
        kept = [ln for ln in lines if keep(json.loads(ln)["episode_index"])]
        (root / "meta/episodes.jsonl").write_text("".join(ln + "\n" for ln in kept))
    else:
        path = next((root / "meta/episodes").rglob("*.parquet"))
        table = pq.read_table(path)
        mask = pa.array([keep(e) for e in table.column("episode_index").to_pylist()])
        pq.write_table(table.filter(mask), path)


def test_empty_dataset(ds_copy: Path) -> None:
    drop_index_rows(ds_copy, lambda e: False)
    index = "meta/episodes/" if (ds_copy / "meta/episodes").is_dir() else "meta/episodes.jsonl"
    line = f"{ds_copy}: the dataset has no episodes ({index} lists none)"
    raises_and_writes_nothing(ds_copy.parent, lambda: build_training_data(cfg_for(ds_copy)), line)
    assert check_dataset(ds_copy) == [line]


def test_episode_on_disk_but_not_in_the_index(ds_copy: Path) -> None:
    drop_index_rows(ds_copy, lambda e: e != 3)
    v3 = (ds_copy / "meta/episodes").is_dir()
    index = "meta/episodes/" if v3 else "meta/episodes.jsonl"
    first = f"{ds_copy}/meta/info.json: total_episodes is 4 but {index} lists 3"
    raises_and_writes_nothing(ds_copy.parent, lambda: LeRobotDataset(ds_copy), first)
    problems = check_dataset(ds_copy)
    assert first in problems and f"{ds_copy}/meta/info.json: total_frames is 48 but {index} lists 36" in problems
    if v3:  # one data file holds every episode: its rows of episode 3 are the stray ones
        assert any("rows of episode(s) [3] that the episode index does not list" in p for p in problems)
    else:  # one file per episode: episode 3's file is the stray one
        stray = ds_copy / "data/chunk-000/episode_000003.parquet"
        assert any(f"data file(s) {stray} hold episodes that meta/episodes.jsonl does not list" in p for p in problems)


def test_inspect_check_reports_the_declared_width(ds_copy: Path) -> None:
    meta = json.loads((ds_copy / "meta/info.json").read_text())
    meta["features"]["action"]["shape"] = [16]
    (ds_copy / "meta/info.json").write_text(json.dumps(meta))
    assert f"{first_data_file(ds_copy)}: 'action' is 14 wide but meta/info.json declares 16" in check_dataset(ds_copy)


def test_camera_size_in_info_json_differs_from_the_video(ds_copy: Path) -> None:
    meta = json.loads((ds_copy / "meta/info.json").read_text())
    meta["features"][HIGH]["shape"] = [48, 64, 3]  # names: height, width, channels; the mp4s are 32x32
    (ds_copy / "meta/info.json").write_text(json.dumps(meta))
    with pytest.warns(UserWarning, match=f"{HIGH} videos decode to 32x32 but meta/info.json declares 48x64"):
        data = build_training_data(cfg_for(ds_copy))
    assert data.io.source_sizes[HIGH] == [[32, 32]]  # the decoded size, never the declared one
    assert any("frames are 32x32, info.json says 48x64" in p for p in check_dataset(ds_copy))


def test_decode_pass_finds_a_corrupt_payload(ds_copy: Path, capsys) -> None:
    video = first_video(ds_copy)
    data = bytearray(video.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = b"\xff" * 64  # same size, container intact: only decoding sees it
    video.write_bytes(bytes(data))
    assert check_dataset(ds_copy, decode=False) == []  # demuxing alone passes it
    problems = check_dataset(ds_copy, decode=True)
    assert len(problems) == 1 and problems[0].startswith(f"{video}: decoding fails after frame ")
    assert inspect_main([str(ds_copy), "--check"]) == 1  # small dataset: decoded by default
    assert f"{video}: decoding fails" in capsys.readouterr().out
    assert inspect_main([str(ds_copy), "--check", "--no-decode"]) == 0


@pytest.mark.parametrize(
    "override, message",
    [
        ("framework.action_model.chunk_length=16",
         "episode 0 has 12 frames, fewer than the action chunk (16 steps = "
         "framework.action_model.chunk_length): every sample of it would train on padding"),
        ("datasets.vla_data.video_delta_indices=[0, 4, 8, 12, 16]",
         "episode 0 has 12 frames, fewer than the video clip spans (17 frames: clip offsets [0, 8, 16]): every "
         "sample of it would train on padding"),
    ],
    ids=["chunk", "clip"],
)
def test_episodes_shorter_than_a_sample(ds_copy: Path, override: str, message: str) -> None:
    raises_and_writes_nothing(ds_copy.parent, lambda: build_training_data(cfg_for(ds_copy, override)), message)


def test_demo_data_is_generated_only_at_its_default_location(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    typo = tmp_path / "dmeo_data"
    cfg = cfg_for(typo / "robotwin_demo", "datasets.vla_data.generate_demo_if_missing=true")
    raises_and_writes_nothing(
        tmp_path,
        lambda: build_training_data(cfg),
        f"dataset folder not found: {typo}/robotwin_demo (data_root_dir='{typo}'; the demo dataset is generated "
        "only at its default location demo_data/robotwin_demo (under the working directory), never at another path",
    )
    assert not typo.exists()
    (tmp_path / "demo_data").write_text("")  # the default location cannot be written
    cfg = cfg_for(Path("demo_data/robotwin_demo"), "datasets.vla_data.generate_demo_if_missing=true")
    raises_and_writes_nothing(
        tmp_path, lambda: build_training_data(cfg),
        "cannot write the demo dataset to demo_data/robotwin_demo (File exists: demo_data)",
    )
