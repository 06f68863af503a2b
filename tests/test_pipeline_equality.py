"""A training sample and the same recorded frames sent live give the same model inputs, bit for
bit: for every shipped config, every camera (cropped or not), through the one PolicyIO path
(frames decoded to RGB as stored, then its crop and resize steps).

The configs' data paths are replaced by one generated demo dataset at RoboTwin's and the ALOHA
sim's camera size (240x320), so each config's own cameras, crops, image size, layout and state
encoding are what is tested; no model is built (the model inputs are the PolicyIO's output).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from dit4dit_npu.config import load_config
from dit4dit_npu.data import build_training_data
from dit4dit_npu.data.demo import write_demo_dataset

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if "deepspeed" not in p.parts)


DEMO_CAMERAS = ("observation.images.cam_high", "observation.images.cam_left_wrist", "observation.images.cam_right_wrist")


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("equality")
    write_demo_dataset(root / "demo", num_episodes=2, episode_length=20, image_size=(240, 320))
    return root


def test_every_shipped_config_is_covered() -> None:
    names = {p.name for p in CONFIGS}
    assert {"dit4dit_robotwin.yaml", "dit4dit_robotwin_tiny.yaml", "dit4dit_aloha_transfer_cube.yaml",
            "dit4dit_aloha_transfer_cube_tiny.yaml", "dit4dit_aloha_insertion_tiny.yaml"} <= names


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_training_sample_equals_the_live_observation_bit_for_bit(config: Path, demo_root: Path) -> None:
    overrides = [
        f"datasets.vla_data.data_root_dir={demo_root}", "datasets.vla_data.data_mix=[{path: demo}]",
        "datasets.vla_data.val_fraction=0.0", "datasets.vla_data.generate_demo_if_missing=false",
        "datasets.vla_data.latent_cache=null",
    ]
    if not set(load_config(config).datasets.vla_data.camera_keys) <= set(DEMO_CAMERAS):
        # a config for another robot's cameras (Meta-World's one `observation.image`): its own steps
        # (size, layout, state encoding) on the demo's first camera; the key's name is not what is tested
        overrides.append(f"datasets.vla_data.camera_keys=[{DEMO_CAMERAS[0]}]")
    cfg = load_config(config, overrides)
    with warnings.catch_warnings():  # demo data has constant dims: not what is tested here
        warnings.simplefilter("ignore", UserWarning)
        data = build_training_data(cfg)
    ds, io = data.train_dataset, data.io
    uncropped = [k for k in io.camera_keys if k not in io.camera_crops]
    assert uncropped, "every config has an uncropped camera"
    for index in (0, 7, len(ds) - 1):
        item = ds[index]  # the training sample the model is fed
        raw = ds.raw_sample(index)
        k, row = ds.locate(index)
        # the recorded frames, as a camera would send them: whole, at the stored size
        recorded = {key: ds.datasets[k].frames_at([row], key, as_stored=True)[0] for key in io.camera_keys}
        assert all(f.shape == (240, 320, 3) for f in recorded.values())
        live, batched = io.encode_observation({**recorded, "state": raw.state, "instruction": raw.instruction})
        assert not batched
        # frame 0 of the clip is the observation's; every camera's view inside it, bit for bit
        assert torch.equal(live.frames[0, 0], item["frames"][0]), f"{config.name}: frames differ at sample {index}"
        if io.spec.state_width:
            assert torch.equal(live.state[0], item["state"])
        assert live.instruction == [item["instruction"]]
        # per camera: the view the policy makes of its recorded frame is the training view
        for v, key in enumerate(io.camera_keys):
            np.testing.assert_array_equal(io.view(key, recorded[key]), raw.views[0, v], err_msg=f"{config.name} {key}")

