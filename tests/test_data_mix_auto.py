"""One's own data with ``data_root_dir`` alone: an empty ``data_mix`` trains on every LeRobot dataset
folder under the root (or on the root when it is one), and a root with none is one clear line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dit4dit_npu.config import load_config
from dit4dit_npu.data import build_training_data
from dit4dit_npu.data.demo import write_demo_dataset
from dit4dit_npu.data.errors import DatasetError
from dit4dit_npu.doctor.results import FAIL, PASS
from dit4dit_npu.doctor.run_config import check_data

ROOT = Path(__file__).resolve().parents[1]
FULL = ROOT / "configs/robotwin/dit4dit_robotwin.yaml"  # lists ten RoboTwin task folders
TINY = ROOT / "configs/robotwin/dit4dit_robotwin_tiny.yaml"


def own_data(root: Path, *overrides: str):
    return load_config(TINY, [f"datasets.vla_data.data_root_dir={root}", "datasets.vla_data.data_mix=[]",
                              "datasets.vla_data.val_fraction=0.0", "datasets.vla_data.generate_demo_if_missing=false",
                              *overrides])


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mine")
    write_demo_dataset(root / "task_b", num_episodes=2, episode_length=12, image_size=(64, 64))
    shutil.copytree(root / "task_b", root / "task_a")
    (root / "notes").mkdir()  # not a dataset (no meta/info.json): left out
    return root


def test_an_empty_data_mix_trains_on_every_dataset_folder_under_the_root(tasks: Path) -> None:
    data = build_training_data(own_data(tasks))
    assert data.dataset_paths == [tasks / "task_a", tasks / "task_b"]  # by name
    assert list(data.sampler.weights) == [0.5, 0.5]
    assert sorted(data.split) == [str(tasks / "task_a"), str(tasks / "task_b")]
    # the main config's ten task folders, emptied on the command line: the same two
    full = load_config(FULL, [f"datasets.vla_data.data_root_dir={tasks}", "datasets.vla_data.data_mix=[]"])
    assert check_data(full).status == PASS and "2 dataset folder(s) readable" in check_data(full).detail


def test_a_root_that_is_itself_a_dataset_is_the_one_dataset(tasks: Path) -> None:
    data = build_training_data(own_data(tasks / "task_a"))
    assert data.dataset_paths == [tasks / "task_a"]


def test_a_root_without_datasets_is_one_line_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "empty" / "notes").mkdir(parents=True)
    for root, why in [(tmp_path / "empty", "holds no LeRobot dataset folder"), (tmp_path / "typo", "is not a folder")]:
        with pytest.raises(DatasetError) as e:
            build_training_data(own_data(root))
        message = str(e.value)
        assert "\n" not in message and message.startswith(f"datasets.vla_data.data_root_dir: {root} {why}")
        assert "data_mix is empty" in message
        result = check_data(own_data(root))
        assert result.status == FAIL and result.detail == message
