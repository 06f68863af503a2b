"""The LeRobot writer's files in lerobot's layout, read back by our reader.

What lerobot 0.4.4 itself needs (checked with the real library by scripts/interop_check.sh; these
tests pin the layout so the check stays green): a ``meta/tasks.parquet`` whose pandas metadata
lets ``pd.read_parquet`` rebuild the task-text index, statistics of every feature (cameras: per
channel, shape (3, 1, 1), over lerobot's frame sample) per episode and in ``meta/stats.json``, and
lerobot's episode metadata columns.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dit4dit_npu.data.demo import CAMERAS, TASKS, write_demo_dataset
from dit4dit_npu.data.lerobot_stats import QUANTILE_NAMES, PixelHistogram, sample_indices
from dit4dit_npu.data.meta import LeRobotDatasetMetadata
from dit4dit_npu.data.writer import DatasetSpec, Episode, LeRobotWriter

EPISODES, LENGTH, TASK_COUNT = 5, 130, 3  # 130 frames: lerobot samples 100 of them for image stats
KEYS = [f"observation.images.{c}" for c in CAMERAS]
NUMERIC = ["observation.state", "action", "timestamp", "frame_index", "episode_index", "index", "task_index"]
STATS = ["min", "max", "mean", "std", "count", *QUANTILE_NAMES]
# The columns of meta/episodes/*.parquet that lerobot 0.4.4's own writer produces (per camera and
# per feature), recorded from a dataset written by LeRobotDataset.create/save_episode/finalize.
LEROBOT_EPISODE_COLUMNS = [
    "episode_index", "tasks", "length", "data/chunk_index", "data/file_index", "dataset_from_index",
    "dataset_to_index", "meta/episodes/chunk_index", "meta/episodes/file_index",
]
LEROBOT_VIDEO_COLUMNS = ["chunk_index", "file_index", "from_timestamp", "to_timestamp"]
# What pandas 2.2.3 writes for pd.DataFrame({"task_index": range(n)}, index=tasks).to_parquet()
# (recorded with pandas 2.2.3 / pyarrow 26; pandas 3 differs only in numpy_type "str").
PANDAS_TASKS_METADATA = {
    "index_columns": ["__index_level_0__"],
    "column_indexes": [
        {"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object", "metadata": {"encoding": "UTF-8"}}
    ],
    "columns": [
        {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64", "metadata": None},
        {"name": None, "field_name": "__index_level_0__", "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
    ],
    "attributes": {},
}


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("writer")
    return {
        v: write_demo_dataset(base / v, v, num_episodes=EPISODES, episode_length=LENGTH, num_tasks=TASK_COUNT)
        for v in ("v2.1", "v3.0")
    }


def test_tasks_parquet_carries_pandas_own_metadata(roots: dict[str, Path]) -> None:
    table = pq.read_table(roots["v3.0"] / "meta/tasks.parquet")
    meta = json.loads(table.schema.metadata[b"pandas"])
    assert {k: v for k, v in meta.items() if k not in ("creator", "pandas_version")} == PANDAS_TASKS_METADATA
    # every column pyarrow will look up is described, in schema order
    assert [c["field_name"] for c in meta["columns"]] == table.column_names
    assert table.column("__index_level_0__").to_pylist() == list(TASKS[:TASK_COUNT])
    assert table.column("task_index").to_pylist() == list(range(TASK_COUNT))
    assert LeRobotDatasetMetadata(roots["v3.0"]).tasks == dict(enumerate(TASKS[:TASK_COUNT]))


def test_tasks_parquet_index_through_pandas(roots: dict[str, Path]) -> None:
    """lerobot's own read (``load_tasks``) and lookups (``tasks.loc[task].task_index``, ``iloc[i].name``)."""
    pd = pytest.importorskip("pandas")
    tasks = pd.read_parquet(roots["v3.0"] / "meta/tasks.parquet")
    assert list(tasks.index) == list(TASKS[:TASK_COUNT])
    assert int(tasks.loc[TASKS[1]].task_index) == 1 and tasks.iloc[2].name == TASKS[2]


def _episode_stats(root: Path, version: str) -> list[dict]:
    if version == "v2.1":
        lines = (root / "meta/episodes_stats.jsonl").read_text().splitlines()
        return [json.loads(line)["stats"] for line in lines]
    rows = pq.read_table(next((root / "meta/episodes").glob("*/*.parquet"))).to_pylist()
    out = []
    for r in rows:
        per: dict = {}
        for col, v in r.items():
            if col.startswith("stats/"):
                feat, _, name = col[len("stats/") :].rpartition("/")
                per.setdefault(feat, {})[name] = v
        out.append(per)
    return out


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_episode_stats_in_lerobot_layout(roots: dict[str, Path], version: str) -> None:
    episodes = _episode_stats(roots[version], version)
    assert len(episodes) == EPISODES
    for per in episodes:
        assert sorted(per) == sorted(NUMERIC + KEYS)
        for key in KEYS:
            assert sorted(per[key]) == sorted(STATS)
            assert per[key]["count"] == [len(sample_indices(LENGTH))] == [100]
            for name in (n for n in STATS if n != "count"):
                assert np.asarray(per[key][name]).shape == (3, 1, 1), (key, name)
                assert 0.0 <= np.min(per[key][name]) and np.max(per[key][name]) <= 1.0
        for key in NUMERIC:
            width = 14 if key in ("observation.state", "action") else 1
            assert all(np.asarray(per[key][n]).shape == (width,) for n in STATS if n != "count")
            assert per[key]["count"] == [LENGTH]


def test_image_stats_are_those_of_lerobots_frame_sample(roots: dict[str, Path], tmp_path: Path) -> None:
    """Written from the source frames: for a known clip, equal to numpy over lerobot's sample."""
    rng = np.random.default_rng(0)
    clips = [rng.integers(0, 256, (LENGTH, 16, 24, 3), dtype=np.uint8) for _ in range(2)]
    clips[0][:, :4] //= 4  # skewed, so quantiles differ from a uniform's
    spec = DatasetSpec(fps=10, tasks=["t"], video_keys=["observation.images.cam"], motors=[f"m{i}" for i in range(2)])
    ep = Episode(rng.normal(size=(LENGTH, 2)).astype(np.float32), rng.normal(size=(LENGTH, 2)).astype(np.float32), 0)
    with LeRobotWriter(tmp_path / "ds", "v3.0", spec) as w:
        for clip in clips:
            w.add_episode(ep, {"observation.images.cam": clip})
    stats = json.loads((tmp_path / "ds/meta/stats.json").read_text())["observation.images.cam"]
    picked = np.concatenate([c[sample_indices(LENGTH)].reshape(-1, 3) for c in clips]) / 255.0
    np.testing.assert_allclose(np.ravel(stats["mean"]), picked.mean(0), rtol=1e-12)
    np.testing.assert_allclose(np.ravel(stats["std"]), picked.std(0), rtol=1e-10)
    for name, q in zip(QUANTILE_NAMES, (0.01, 0.10, 0.50, 0.90, 0.99)):
        np.testing.assert_allclose(np.ravel(stats[name]), np.quantile(picked, q, axis=0), atol=1e-12)
    assert np.ravel(stats["max"]).tolist() == list(picked.max(0)) and stats["count"] == [200]
    state = json.loads((tmp_path / "ds/meta/stats.json").read_text())["observation.state"]
    both = np.concatenate([ep.states, ep.states]).astype(np.float64)
    np.testing.assert_allclose(state["q10"], np.quantile(both, 0.1, axis=0))  # exact, not averaged


def test_pixel_histogram_quantiles_match_numpy() -> None:
    rng = np.random.default_rng(1)
    for n in (1, 2, 7, 101):
        frames = rng.integers(0, 256, (n, 3, 5, 3), dtype=np.uint8)
        got = PixelHistogram.of_episode(frames).stats()
        picked = frames[sample_indices(n)].reshape(-1, 3) / 255.0
        for name, q in zip(QUANTILE_NAMES, (0.01, 0.10, 0.50, 0.90, 0.99)):
            np.testing.assert_allclose(got[name].ravel(), np.quantile(picked, q, axis=0), atol=1e-12)


def test_stats_json_read_by_our_reader(roots: dict[str, Path]) -> None:
    v3 = LeRobotDatasetMetadata(roots["v3.0"]).stats
    assert sorted(v3) == sorted(NUMERIC + KEYS)
    for key in KEYS:
        assert v3[key]["mean"].shape == (3, 1, 1) and v3[key]["q99"].shape == (3, 1, 1)
        assert v3[key]["count"].tolist() == [EPISODES * 100]
    # v2.1 has no stats.json: our reader pools episodes_stats.jsonl, to the same numbers
    v21 = LeRobotDatasetMetadata(roots["v2.1"]).stats
    for key in KEYS + ["observation.state", "action"]:
        for name in ("min", "max", "mean", "std", "count"):
            np.testing.assert_allclose(v21[key][name], v3[key][name], rtol=1e-9, atol=1e-12)


def test_episode_metadata_has_lerobots_columns(roots: dict[str, Path]) -> None:
    table = pq.read_table(next((roots["v3.0"] / "meta/episodes").glob("*/*.parquet")))
    want = LEROBOT_EPISODE_COLUMNS + [f"videos/{k}/{c}" for k in KEYS for c in LEROBOT_VIDEO_COLUMNS]
    want += [f"stats/{k}/{s}" for k in NUMERIC + KEYS for s in STATS]
    assert sorted(table.column_names) == sorted(want)
    rows = table.to_pylist()
    assert [r["dataset_to_index"] - r["dataset_from_index"] for r in rows] == [LENGTH] * EPISODES
    info = json.loads((roots["v3.0"] / "meta/info.json").read_text())
    assert info["total_episodes"] == EPISODES and info["total_tasks"] == TASK_COUNT


def test_writer_refuses_an_unknown_task_index(tmp_path: Path) -> None:
    spec = DatasetSpec(fps=10, tasks=["only"], video_keys=["cam"], motors=["a"])
    ep = Episode(np.zeros((4, 1), np.float32), np.zeros((4, 1), np.float32), task_index=1)
    with pytest.raises(ValueError, match=r"episode 0: task_index 1, expected 0\.\.0"):
        LeRobotWriter(tmp_path / "ds", "v3.0", spec).add_episode(ep, {"cam": np.zeros((4, 16, 16, 3), np.uint8)})


# meta/stats.json as lerobot 0.4.4 wrote it for a recorded dataset (two of its features, verbatim).
LEROBOT_STATS = {
    "observation.images.cam_high": {
        "min": [[[0.0]], [[0.0]], [[0.0]]],
        "max": [[[0.996078431372549]], [[0.996078431372549]], [[0.996078431372549]]],
        "mean": [[[0.49778055427900325]], [[0.4960757186989379]], [[0.4981408611621732]]],
        "std": [[[0.002012005974264708]], [[0.0010552300347222154]], [[0.0007274752348856162]]],
        "count": [24],
        "q01": [[[0.007903946448036913]], [[0.005949027117853763]], [[0.007880395442635774]]],
        "q10": [[[0.09417008496700226]], [[0.0979950554399003]], [[0.09807339339406947]]],
        "q50": [[[0.5038764727882784]], [[0.49611520323684877]], [[0.49800145227321685]]],
        "q90": [[[0.8979956591183494]], [[0.8979670253224438]], [[0.8961275480896888]]],
        "q99": [[[0.9901536596568562]], [[0.9882422915478971]], [[0.988250496801351]]],
    },
    "frame_index": {
        "min": [0], "max": [11], "mean": [5.5], "std": [3.452052529534663], "count": [24], "q01": [-1e-10],
        "q10": [0.9992399999181679], "q50": [5.00059999999092], "q90": [10.000760000081831], "q99": [10.999736000099995],
    },
}


def test_our_reader_reads_lerobots_stats_json(roots: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    root = Path(shutil.copytree(roots["v3.0"], tmp_path / "ds"))
    (root / "meta/stats.json").write_text(json.dumps(LEROBOT_STATS))
    stats = LeRobotDatasetMetadata(root).stats
    assert sorted(stats) == sorted(LEROBOT_STATS)
    cam = stats["observation.images.cam_high"]
    assert sorted(cam) == sorted(STATS) and cam["q50"].shape == (3, 1, 1) and cam["count"].tolist() == [24]
    assert stats["frame_index"]["max"].dtype == np.float64 and stats["frame_index"]["max"].tolist() == [11.0]


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_modality_json_names_the_14d_layout_and_real_video_keys(roots: dict[str, Path], version: str) -> None:
    """starVLA/GR00T loaders slice state/action by modality.json and find videos by original_key."""
    root = roots[version]
    modality = json.loads((root / "meta" / "modality.json").read_text())
    features = json.loads((root / "meta" / "info.json").read_text())["features"]
    for part in ("state", "action"):
        spans = sorted((r["start"], r["end"]) for r in modality[part].values())
        assert spans == [(0, 6), (6, 7), (7, 13), (13, 14)]  # contiguous, covering all 14 dims
    assert sorted(modality["video"]) == sorted(CAMERAS)
    assert all(v["original_key"] in features for v in modality["video"].values())
