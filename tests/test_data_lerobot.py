"""LeRobotDataset (v2.1 and v3.0) against the demo writer's known frames and values."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from dit4dit_npu.data.demo import TASKS, demo_episode, read_frame_code, write_demo_dataset
from dit4dit_npu.data.errors import DatasetError
from dit4dit_npu.data.inspect import check_dataset, summarize
from dit4dit_npu.data.lerobot import LeRobotDataset
from dit4dit_npu.data.video import VideoDecoder
from dit4dit_npu.transforms.images import resize_rgb

EPISODES, LENGTH, FPS, TASK_COUNT = 7, 20, 10, 3
HIGH = "observation.images.cam_high"
CAMS = [HIGH, "observation.images.cam_left_wrist", "observation.images.cam_right_wrist"]


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("lerobot")
    return {
        v: write_demo_dataset(
            base / v,
            v,
            num_episodes=EPISODES,
            episode_length=LENGTH,
            fps=FPS,
            image_size=(32, 48),
            num_tasks=TASK_COUNT,
        )
        for v in ("v2.1", "v3.0")
    }


@pytest.fixture(params=["v2.1", "v3.0"])
def root(request, roots: dict[str, Path]) -> Path:
    return roots[request.param]


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
    }


def test_metadata(root: Path) -> None:
    ds = LeRobotDataset(root)
    m = ds.meta
    assert m.fps == FPS and m.total_episodes == EPISODES and m.total_frames == EPISODES * LENGTH
    assert m.camera_keys == CAMS and m.video_size(HIGH) == (32, 48)
    assert m.tasks == {i: TASKS[i] for i in range(TASK_COUNT)}
    assert m.episodes[3]["length"] == LENGTH and m.episodes[3]["dataset_from_index"] == 3 * LENGTH
    assert m.stats["action"]["max"].shape == (14,)
    assert len(ds) == EPISODES * LENGTH and ds.num_episodes == EPISODES and m.total_tasks == TASK_COUNT
    assert ds.episode_data_index["from"][2] == 2 * LENGTH and ds.episode_data_index["to"][2] == 3 * LENGTH


def test_getitem_matches_lerobot_schema_and_demo_values(root: Path) -> None:
    ds = LeRobotDataset(root)
    item = ds[LENGTH + 5]  # episode 1, frame 5
    ep = demo_episode(1, LENGTH, TASK_COUNT)
    assert item["observation.state"].dtype == torch.float32 and item["observation.state"].shape == (14,)
    np.testing.assert_array_equal(item["observation.state"].numpy(), ep.states[5])
    np.testing.assert_array_equal(item["action"].numpy(), ep.actions[5])
    assert item["timestamp"].shape == () and item["timestamp"].dtype == torch.float32
    assert abs(float(item["timestamp"]) - 5 / FPS) < 1e-6
    for k, v in (
        ("frame_index", 5),
        ("episode_index", 1),
        ("index", LENGTH + 5),
        ("task_index", 1 % TASK_COUNT),
    ):
        assert item[k].dtype == torch.int64 and item[k].shape == () and int(item[k]) == v
    assert item["task"] == TASKS[1 % TASK_COUNT]
    for cam in CAMS:
        img = item[cam]
        assert img.shape == (3, 32, 48) and img.dtype == torch.float32 and 0 <= img.min() and img.max() <= 1
        assert read_frame_code(img.numpy()) == LENGTH + 5  # the right frame, not a neighbour


def test_every_frame_decodes_to_its_own_index(root: Path) -> None:
    ds = LeRobotDataset(root)
    for ep in range(EPISODES):
        s, e = ds.episode_bounds(ep)
        rows = np.arange(s, e)
        for cam in CAMS:
            frames = ds.frames_at(rows, cam)
            assert [read_frame_code(f) for f in frames] == list(range(ep * LENGTH, (ep + 1) * LENGTH))
    # Random access order, repeats, and a resize on the fly keep the right frames.
    rows = np.array([LENGTH * 6 + 3, 2, LENGTH * 6 + 3, LENGTH * 2 + 19])
    groups = [r for r in rows if r // LENGTH == 6], [2], [LENGTH * 2 + 19]
    for g in groups:
        frames = ds.frames_at(g, HIGH, size_hw=(64, 96))
        assert frames.shape == (len(g), 64, 96, 3) and frames.dtype == np.uint8
        assert [read_frame_code(f) for f in frames] == [int(r) for r in g]


def test_delta_timestamps_pad_at_episode_edges(root: Path) -> None:
    deltas = {HIGH: [-2 / FPS, 0.0, 3 / FPS], "action": [i / FPS for i in range(4)]}
    ds = LeRobotDataset(root, delta_timestamps=deltas, image_size=(16, 24))
    ep = demo_episode(2, LENGTH, TASK_COUNT)
    first = ds[2 * LENGTH]  # first frame of episode 2: the -2 offset clamps to frame 0
    assert first[f"{HIGH}_is_pad"].tolist() == [True, False, False]
    assert first[HIGH].shape == (3, 3, 16, 24)
    assert [read_frame_code(f.numpy()) for f in first[HIGH]] == [2 * LENGTH, 2 * LENGTH, 2 * LENGTH + 3]
    last = ds[3 * LENGTH - 2]  # frame 18 of 20: action offsets 2, 3 clamp to the last frame
    assert last["action_is_pad"].tolist() == [False, False, True, True]
    np.testing.assert_array_equal(last["action"].numpy(), ep.actions[[18, 19, 19, 19]])
    assert last[f"{HIGH}_is_pad"].tolist() == [False, False, True]
    assert [read_frame_code(f.numpy()) for f in last[HIGH]] == [
        3 * LENGTH - 4,
        3 * LENGTH - 2,
        3 * LENGTH - 1,
    ]
    assert last["action_is_pad"].dtype == torch.bool


def test_episode_filter(root: Path) -> None:
    ds = LeRobotDataset(root, episodes=[5, 1])
    assert len(ds) == 2 * LENGTH and ds.selected_episodes == [1, 5]
    item = ds[LENGTH]  # first row of episode 5; `index` stays dataset-global like lerobot
    assert int(item["episode_index"]) == 5 and int(item["index"]) == 5 * LENGTH
    assert read_frame_code(item[HIGH].numpy()) == 5 * LENGTH
    with pytest.raises(DatasetError, match="no episode 99"):
        LeRobotDataset(root, episodes=[99])


def test_v3_multi_episode_files_use_video_from_timestamp(roots: dict[str, Path]) -> None:
    ds = LeRobotDataset(roots["v3.0"])
    assert ds.meta.codebase_version == "v3.0"
    eps = ds.meta.episodes
    # Data and video files shard episodes differently (starVLA used data indices for videos).
    assert (
        eps[2]["data_path"] == eps[3]["data_path"]
        and eps[2]["videos"][HIGH]["path"] != eps[3]["videos"][HIGH]["path"]
    )
    assert len({e["videos"][HIGH]["path"] for e in eps.values()}) < EPISODES
    assert any("chunk-001" in str(e["videos"][HIGH]["path"]) for e in eps.values())
    shifted = [e for e in eps.values() if e["videos"][HIGH]["from_timestamp"] > 0]
    assert shifted
    for e in shifted:
        s, _ = ds.episode_bounds(e["episode_index"])
        assert read_frame_code(ds.frames_at([s], HIGH)[0]) == e["dataset_from_index"]


def test_read_only_dataset_is_never_written(root: Path, tmp_path: Path) -> None:
    before = snapshot(root)
    modes = {p: p.stat().st_mode for p in [root, *root.rglob("*")]}
    try:
        for p in modes:
            os.chmod(p, modes[p] & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        ds = LeRobotDataset(root, delta_timestamps={HIGH: [0.0, 1 / FPS]})
        for i in range(0, len(ds), 17):
            ds[i]
        assert check_dataset(root) == []
        summarize(root)
    finally:
        for p, m in modes.items():
            os.chmod(p, m)
    assert snapshot(root) == before  # tests run as root: permissions alone prove nothing


def test_delta_timestamps_off_grid(root: Path) -> None:
    with pytest.raises(DatasetError, match="frame grid"):
        LeRobotDataset(root, delta_timestamps={"action": [0.0, 0.05]})  # 0.5 frame at 10 fps
    with pytest.raises(DatasetError, match="not features"):
        LeRobotDataset(root, delta_timestamps={"observation.images.nope": [0.0]})


def test_resize_rgb_is_the_decoder_resize_path(root: Path) -> None:
    ds = LeRobotDataset(root)
    full = ds.frames_at([7], HIGH)[0]
    assert np.array_equal(resize_rgb(full, (32, 48)), full)
    small = resize_rgb(full, (16, 24))
    assert small.shape == (16, 24, 3) and small.dtype == np.uint8 and read_frame_code(small) == 7
    # Decoding at a size and resizing a decoded RGB frame agree up to the YUV->RGB rounding.
    direct = ds.frames_at([7], HIGH, size_hw=(16, 24))[0]
    assert np.abs(direct.astype(int) - small.astype(int)).mean() < 3.0
    with pytest.raises(ValueError):
        resize_rgb(full.astype(np.float32), (16, 24))


def test_decoder_cache_survives_pickle(root: Path) -> None:
    import pickle

    dec = VideoDecoder(max_open=2)
    ds = LeRobotDataset(root, decoder=dec)
    ds.frames_at([0], HIGH)
    assert len(dec._cache) == 1
    clone = pickle.loads(pickle.dumps(ds))
    assert len(clone.decoder._cache) == 0 and read_frame_code(clone.frames_at([1], HIGH)[0]) == 1
    for cam in CAMS:
        ds.frames_at([0], cam)
    assert len(dec._cache) == 2  # LRU bound on open files


def test_demo_cli_and_refusal_to_overwrite(tmp_path: Path, capsys) -> None:
    from dit4dit_npu.data.cli import demo_main

    out = tmp_path / "cli"
    demo_main(
        [
            "--out",
            str(out),
            "--version",
            "v3.0",
            "--episodes",
            "3",
            "--length",
            "10",
            "--size",
            "16x24",
        ]
    )
    assert "wrote v3.0 demo dataset" in capsys.readouterr().out
    ds = LeRobotDataset(out)
    assert ds.meta.codebase_version == "v3.0" and len(ds) == 30 and ds.meta.video_size(HIGH) == (16, 24)
    assert check_dataset(out) == []
    before = snapshot(out)
    with pytest.raises(DatasetError, match="non-empty"):
        write_demo_dataset(out)
    assert snapshot(out) == before and not list(tmp_path.glob(".*tmp*"))


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "refusing to write the demo dataset into non-empty"),  # the folder written first below
        (["--fps", "0"], "fps must be >= 1, got 0"),  # was a dataset with infinite timestamps
        (["--length", "0"], "episode_length must be >= 1, got 0"),  # was a numpy traceback mid-write
        (["--codec", "nope"], "nope"),  # was av's UnknownCodecError traceback
        (["--size", "32x15"], "image_size must be even and >= 16"),
    ],
)
def test_demo_cli_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, capsys, args, message) -> None:
    from dit4dit_npu.data.cli import demo_main

    out = tmp_path / "demo"
    if not args:
        out.mkdir()
        (out / "mine.txt").write_text("mine")
    assert demo_main(["--out", str(out), "--episodes", "1", "--length", "10", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == (["demo", "mine.txt"] if not args else [])
