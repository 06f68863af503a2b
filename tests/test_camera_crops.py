"""Camera crops (datasets.vla_data.camera_crops): a region of interest cut out of a camera's frames
before the resize, the same way for training frames (decoded from the dataset's videos) and for
live images (whole camera frames at any resolution), saved with the policy (policy_io.json format
2; a PolicyIO without crops stays format 1), refused in one line when it cannot be right."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dit4dit_npu.config import ConfigError, load_config
from dit4dit_npu.data import build_training_data
from dit4dit_npu.data.demo import write_demo_dataset
from dit4dit_npu.transforms import FeatureStats, PolicyInputError, PolicyIO, PolicyIOError
from dit4dit_npu.transforms.images import crop_box, crop_rgb, resize_rgb

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs/robotwin/dit4dit_robotwin_tiny.yaml"
HIGH = "observation.images.cam_high"
CROP = [0.25, 0.5, 0.5, 0.5]  # rows 1/4 to 3/4 of the right half


def _stats(d: int) -> FeatureStats:
    x = np.random.default_rng(d).normal(size=(200, d))
    return FeatureStats.from_data(x)


def make_io(crops: dict | None = None, source: tuple[int, int] = (64, 64)) -> PolicyIO:
    return PolicyIO.build(
        camera_keys=["cam_a", "cam_b"], image_size=(16, 16), view_layout="width", clip_offsets=[0],
        chunk_length=2, state_stats=_stats(3), action_stats=_stats(4), state_norm="min_max",
        action_norm="min_max", source_sizes={"cam_a": [list(source)], "cam_b": [list(source)]},
        camera_crops=crops,
    )


def marker_frame(h: int, w: int, y: float, x: float) -> np.ndarray:
    """A grey frame with a white square around fractional position (y, x)."""
    img = np.full((h, w, 3), 80, np.uint8)
    cy, cx, r = int(y * h), int(x * w), max(1, h // 16)
    img[cy - r : cy + r, cx - r : cx + r] = 255
    return img


def test_crop_box_covers_the_fraction_at_any_resolution() -> None:
    assert crop_box(64, 64, CROP) == (16, 48, 32, 64)
    assert crop_box(240, 320, [0.4271, 0.4219, 0.3125, 0.3125]) == (103, 178, 135, 235)
    assert crop_box(240, 320, [0.999, 0.0, 0.001, 1.0]) == (239, 240, 0, 320)  # a sliver: its last row
    img = marker_frame(64, 64, 0.5, 0.75)
    cut = crop_rgb(img, CROP)
    assert cut.shape == (32, 32, 3) and cut.flags.c_contiguous
    assert crop_rgb(img, None) is img


def test_live_frames_are_cut_like_training_frames_at_any_resolution() -> None:
    io = make_io({"cam_a": CROP})
    frames = {"cam_a": marker_frame(64, 64, 0.5, 0.75), "cam_b": marker_frame(64, 64, 0.5, 0.5)}
    # the training path: a decoder that gives whole frames, as stored, in RGB
    views = io.camera_views(lambda key: frames[key][None])
    assert views.shape == (1, 2, 16, 16, 3)
    live = io.parse_observation({**frames, "state": np.zeros(3), "instruction": "go"})
    np.testing.assert_array_equal(live.views, views)
    # the crop is the frame's right half, rows 1/4-3/4: the marker at x = 3/4 lands in the middle
    bright = np.argwhere(views[0, 0, :, :, 0] > 200)
    assert np.allclose(bright.mean(0), [8, 8], atol=1.5), bright.mean(0)
    # a whole frame at another resolution (same aspect ratio) gives the same view, nearly
    big = io.parse_observation({"cam_a": marker_frame(256, 256, 0.5, 0.75), "cam_b": frames["cam_b"],
                                "state": np.zeros(3), "instruction": "go"})
    assert np.abs(big.views[0, 0].astype(int) - views[0, 0]).mean() < 12
    # a frame of another aspect ratio is not a whole frame of this camera
    with pytest.raises(PolicyInputError, match="cam_a: image size 64x128 .* send the whole camera frame"):
        io.parse_observation({**frames, "cam_a": np.zeros((64, 128, 3), np.uint8), "state": np.zeros(3),
                              "instruction": "go"})


def old_format(io: PolicyIO) -> dict:
    """policy_io.json as the releases before the steps wrote it: format 1 (no crops) or 2."""
    d = io.to_dict()
    crops = {"camera_crops": io.camera_crops} if io.camera_crops else {}
    return {
        "format": "dit4dit_npu.policy_io/2" if crops else "dit4dit_npu.policy_io/1",
        "camera_keys": d["camera_keys"], "image_size": list(io.image_size), "view_layout": io.view_layout,
        "clip_offsets": d["clip_offsets"], "chunk_length": d["chunk_length"], "source_sizes": d["source_sizes"],
        "resize_method": io.resize_method, **crops, "stats": d["stats"],
        "state": io.state.to_config(), "action": io.action.to_config(),
    }


def test_crops_travel_in_the_crop_step_and_formats_1_and_2_still_load(tmp_path: Path) -> None:
    io = make_io({"cam_a": CROP})
    io.save(tmp_path / "io.json")
    saved = json.loads((tmp_path / "io.json").read_text())
    assert saved["format"] == "dit4dit_npu.policy_io/3"
    assert [s["step"] for s in saved["steps"]] == ["crop_views", "resize_views", "tile_views", "encode_state",
                                                   "encode_action"]
    assert saved["steps"][0] == {"step": "crop_views", "crops": {"cam_a": CROP}}
    back = PolicyIO.load(tmp_path / "io.json")
    assert back == io and back.camera_crops == {"cam_a": CROP}
    for old in (old_format(io), old_format(make_io())):  # folders written before the steps
        assert PolicyIO.from_dict(old).to_dict() == (io if "camera_crops" in old else make_io()).to_dict()
    plain = old_format(make_io())
    assert plain["format"] == "dit4dit_npu.policy_io/1"
    with pytest.raises(PolicyIOError, match="camera_crops in a 'dit4dit_npu.policy_io/1' file"):
        PolicyIO.from_dict({**plain, "camera_crops": {"cam_a": CROP}})
    with pytest.raises(PolicyIOError, match=r"camera_crops.cam_a: expected 0 <= top"):
        PolicyIO.from_dict({**old_format(io), "camera_crops": {"cam_a": [0.5, 0.5, 0.6, 0.5]}})
    bad = {**saved, "steps": [{"step": "crop_views", "crops": {"cam_a": [0.5, 0.5, 0.6, 0.5]}}, *saved["steps"][1:]]}
    with pytest.raises(PolicyIOError, match=r"camera_crops.cam_a: expected 0 <= top"):
        PolicyIO.from_dict(bad)
    with pytest.raises(PolicyIOError, match=r"malformed PolicyIO: steps \['resize_views', .*expected exactly"):
        PolicyIO.from_dict({**saved, "steps": saved["steps"][1:]})


@pytest.mark.parametrize(
    "crops, message",
    [
        ({"cam_c": CROP}, r"camera_crops: 'cam_c' is not one of the camera_keys"),
        ({"cam_a": [0.1, 0.1, 0.5]}, r"camera_crops.cam_a: expected \[top, left, height, width\] as 4 fractions"),
        ({"cam_a": [0.6, 0.0, 0.5, 0.5]}, r"camera_crops.cam_a: expected 0 <= top"),
        ({"cam_a": [0.0, 0.0, 0.5, 0.25]}, r"cuts 32x16 \(HxW\) out of its 64x64 videos, another aspect ratio than "
                                           r"image_size \[16, 16\]; with width 0.25 the height fraction would be 0.2500"),
    ],
)
def test_bad_crops_are_one_line_naming_the_key(crops: dict, message: str) -> None:
    with pytest.raises(PolicyIOError, match=message) as e:
        make_io(crops)
    assert "\n" not in str(e.value) and "datasets.vla_data.camera_crops" in str(e.value)


def test_config_crops_are_checked_at_load_and_cut_the_training_frames(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"datasets.vla_data.camera_crops: got 'cam_x', expected one of camera_keys"):
        load_config(TINY, ["datasets.vla_data.camera_crops={cam_x: [0, 0, 1, 1]}"])
    with pytest.raises(ConfigError, match=rf"datasets.vla_data.camera_crops.{HIGH}: expected 0 <= top"):
        load_config(TINY, [f"datasets.vla_data.camera_crops={{{HIGH}: [0, 0, 1.5, 1]}}"])
    # a camera key's dots are the key's, not config sections: one camera's crop set by its path
    one = load_config(TINY, [f"datasets.vla_data.camera_crops.{HIGH}={CROP}"])
    assert one.datasets.vla_data.camera_crops == {HIGH: CROP}
    data = tmp_path / "data"
    write_demo_dataset(data / "robotwin_demo", num_episodes=2, episode_length=12, image_size=(64, 64))
    common = [f"datasets.vla_data.data_root_dir={data}", "datasets.vla_data.val_fraction=0.0",
              "datasets.vla_data.generate_demo_if_missing=false"]
    plain = build_training_data(load_config(TINY, common))
    cropped = build_training_data(load_config(TINY, [*common, f"datasets.vla_data.camera_crops={{{HIGH}: {CROP}}}"]))
    assert cropped.io.camera_crops == {HIGH: CROP} and plain.io.camera_crops == {}
    raw = plain.train_dataset.datasets[0]
    whole = raw.frames_at(np.array([3]), HIGH, as_stored=True)[0]
    assert whole.shape == (64, 64, 3)  # the stored frame, not shrunk to image_size before the cut
    sample = cropped.train_dataset.raw_sample(3)
    np.testing.assert_array_equal(sample.views[0, 0], resize_rgb(crop_rgb(whole, CROP), (32, 32)))
    live = cropped.io.parse_observation({HIGH: whole, **{k: sample.views[0, v] for v, k in enumerate(
        cropped.io.camera_keys) if v}, "state": sample.state, "instruction": sample.instruction})
    np.testing.assert_array_equal(live.views[0], sample.views[0])  # what a robot's whole frame becomes
    np.testing.assert_array_equal(sample.views[0, 1:], plain.train_dataset.raw_sample(3).views[0, 1:])


def test_offline_eval_of_a_cropping_policy_predicts_from_its_training_views(tmp_path: Path) -> None:
    """``python -m dit4dit_npu.eval`` feeds the dataset's views (already cut and resized) to the
    policy: they must not be cut again. Its predictions equal the policy's on the observation a
    robot would send at those frames (cam_high whole, as stored)."""
    from policy_fixtures import build_tiny_setup

    from dit4dit_npu.eval import offline
    from dit4dit_npu.policy import DiT4DiTPolicy

    data = tmp_path / "data"
    write_demo_dataset(data / "robotwin_demo", num_episodes=4, episode_length=20, image_size=(64, 64))
    setup = build_tiny_setup(tmp_path, f"datasets.vla_data.camera_crops={{{HIGH}: {CROP}}}", data_root=data)
    policy = DiT4DiTPolicy.from_pretrained(setup.policy_dir)
    ds = setup.data.train_dataset
    indices = np.array([2, 9])
    pred = offline.run_predictions(policy, ds, indices, batch_size=2, seed=3).pred
    samples = [ds.raw_sample(int(i)) for i in indices]
    sent = {k: np.stack([s.views[0, v] for s in samples]) for v, k in enumerate(policy.camera_keys)}
    sent[HIGH] = np.stack([ds.datasets[k].frames_at([row], HIGH, as_stored=True)[0] for k, row in map(ds.locate, indices)])
    robot = policy.predict_action({**sent, "state": np.stack([s.state for s in samples]),
                                   "instruction": [s.instruction for s in samples]}, seed=3)
    np.testing.assert_allclose(pred, robot, rtol=0, atol=1e-5)


def test_a_checkpoint_of_an_older_policy_io_format_resumes_and_a_change_is_still_named() -> None:
    from dit4dit_npu.train.resume import _data_change

    for io in (make_io(), make_io({"cam_a": CROP})):
        saved = {"split": [], "policy_io": old_format(io)}  # what a checkpoint written before recorded
        assert _data_change(saved, {"split": [], "policy_io": io.to_dict()}) is None
    other = make_io({"cam_a": [0.0, 0.0, 0.5, 0.5]}).to_dict()
    change = _data_change({"split": [], "policy_io": old_format(make_io({"cam_a": CROP}))}, {"split": [], "policy_io": other})
    assert change is not None and change.startswith("PolicyIO steps differ")
