"""The policy folder as a versioned format: version 3's layout holds each fact once and
loads without the training schema; folders version 2 wrote (tests/fixtures/policy_v2, with the
actions that version predicted) load and act as they did; unknown versions are one line."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml
from policy_fixtures import reseal, shared_tiny_setup

from dit4dit_npu.policy import FORMAT_VERSION, DiT4DiTPolicy, PolicyLoadError, UnverifiedPolicyWarning
from dit4dit_npu.policy.folder import load_policy_folder, write_policy_json

V2 = Path(__file__).parent / "fixtures" / "policy_v2"


def recorded(folder: Path) -> tuple[dict, int, np.ndarray, np.ndarray]:
    """(observation, seed, actions, normalized chunk) as the writing version predicted them."""
    e = np.load(folder / "expected.npz")
    obs = {k.removeprefix("obs/"): e[k] for k in e.files if k.startswith("obs/")}
    obs["instruction"] = str(e["instruction"])
    return obs, int(e["seed"]), e["actions"], e["normalized"]


@pytest.mark.parametrize("name", ["plain", "lora"])
def test_version_2_folders_act_as_version_2_did(name: str, tmp_path: Path) -> None:
    src = V2 / name
    assert json.loads((src / "policy.json").read_text())["format_version"] == 2
    obs, seed, actions, normalized = recorded(src)
    policy = DiT4DiTPolicy.from_pretrained(src)
    np.testing.assert_allclose(policy.predict_action(obs, seed=seed), actions, rtol=0, atol=1e-6)
    batch, _ = policy.io.encode_observation(obs)
    np.testing.assert_allclose(policy.model.predict_action(batch, seed=seed)[0].numpy(), normalized, rtol=0, atol=1e-6)
    m = policy.manifest
    assert m.step == 3 and m.base_model == "tiny" and m.framework.cosmos25.lora.rank == (2 if name == "lora" else 0)
    assert m.framework.action_model.chunk_length == policy.chunk_length == actions.shape[0]
    assert m.data.action_names[0] == "left_waist" and m.data.state_key == "observation.state"
    held_out = json.loads((src / "policy.json").read_text())["held_out_episodes"]
    assert {p: r.held_out_episodes for p, r in m.data.datasets.items()} == held_out

    # The same policy in version 3 (the manifest written from what version 2 gave, no config.yaml)
    # and in version 4 (with the content hashes) is the same in memory and acts the same.
    v3 = tmp_path / "v3"
    shutil.copytree(src, v3)
    (v3 / "config.yaml").unlink()
    (v3 / "policy.json").write_text(json.dumps({**m.to_json(), "format_version": 3}))
    with pytest.warns(UnverifiedPolicyWarning, match="format_version 3 records no content hashes"):
        again = load_policy_folder(v3)
    assert again.manifest == m
    write_policy_json(v3, m.to_json())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnverifiedPolicyWarning)
        v4 = DiT4DiTPolicy.from_pretrained(v3)
    assert v4.manifest == m
    np.testing.assert_array_equal(v4.predict_action(obs, seed=seed), policy.predict_action(obs, seed=seed))


V3 = Path(__file__).parent / "fixtures" / "policy_v3"


@pytest.mark.parametrize("name", ["plain", "lora", "cropped"])
def test_version_3_folders_act_as_version_3_did(name: str) -> None:
    """Folders main wrote at 8712bd4 (tests/fixtures/policy_v3): every later format change must
    keep them loading and acting the same."""
    src = V3 / name
    assert json.loads((src / "policy.json").read_text())["format_version"] == 3
    obs, seed, actions, normalized = recorded(src)
    with pytest.warns(UnverifiedPolicyWarning) as w:  # version 3 recorded no content hashes
        policy = DiT4DiTPolicy.from_pretrained(src)
    assert [str(x.message) for x in w] == [
        f"{src}: policy format_version 3 records no content hashes, so its files load unverified (a file changed "
        "after export goes unseen; export it again to have them checked)"
    ]
    np.testing.assert_allclose(policy.predict_action(obs, seed=seed), actions, rtol=0, atol=1e-6)
    batch, _ = policy.io.encode_observation(obs)
    np.testing.assert_allclose(policy.model.predict_action(batch, seed=seed)[0].numpy(), normalized, rtol=0, atol=1e-6)
    m = policy.manifest
    assert m.step == 3 and m.base_model == "tiny" and m.framework.cosmos25.lora.rank == (2 if name == "lora" else 0)
    assert policy.chunk_length == actions.shape[0]
    crops = {"observation.images.cam_high": [0.25, 0.5, 0.5, 0.5]} if name == "cropped" else {}
    assert policy.io.camera_crops == crops


def test_version_2_reads_only_what_inference_needs(tmp_path: Path) -> None:
    """Its config.yaml is read for the framework section, the precision and the dataset keys; a
    trainer or dataset key renamed since (or any other change there) does not matter."""
    folder = tmp_path / "plain"
    shutil.copytree(V2 / "plain", folder)
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    cfg["trainer"] = {"mixed_precision": cfg["trainer"]["mixed_precision"], "a_key_renamed_later": 1}
    cfg["datasets"]["vla_data"] = {k: cfg["datasets"]["vla_data"][k] for k in ("state_key", "action_key")}
    cfg["datasets"]["vla_data"]["image_sise"] = [1, 2]
    cfg["not_a_section"] = True
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    obs, seed, actions, _ = recorded(folder)
    np.testing.assert_allclose(DiT4DiTPolicy.from_pretrained(folder).predict_action(obs, seed=seed), actions, atol=1e-6)

    (folder / "config.yaml").write_text(yaml.safe_dump({k: v for k, v in cfg.items() if k != "trainer"}))
    with pytest.raises(PolicyLoadError) as e:
        DiT4DiTPolicy.from_pretrained(folder)
    assert str(e.value) == (
        f"{folder} (format_version 2: policy.json + config.yaml): trainer.mixed_precision: missing "
        "(expected a mapping with 'trainer' at the top level)"
    )
    (folder / "config.yaml").unlink()
    with pytest.raises(PolicyLoadError, match=r"incomplete, missing \['config.yaml'\]"):
        DiT4DiTPolicy.from_pretrained(folder)


def test_version_4_layout_holds_each_fact_once() -> None:
    setup = shared_tiny_setup()
    folder = setup.policy_dir
    assert sorted(p.name for p in folder.iterdir()) == [
        "model.safetensors", "policy.json", "policy_io.json", "prompt_cache.safetensors", "train_config.yaml",
    ]
    manifest = json.loads((folder / "policy.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION == 4
    assert sorted(manifest) == ["content", "data", "format_version", "manifest_sha256", "model", "step"]
    assert sorted(manifest["content"]["files"]) == ["model.safetensors", "policy_io.json", "prompt_cache.safetensors"]
    assert sorted(manifest["model"]) == ["framework", "mixed_precision"]
    assert sorted(manifest["data"]) == [
        "action_key", "action_names", "datasets", "num_trajectories", "state_key", "state_names", "statistics_tag",
    ]
    # What policy_io.json or the prompt cache owns is not repeated here.
    text = json.dumps({k: v for k, v in manifest.items() if k != "content"})  # content names the files
    for owned_elsewhere in ("future_action_window_size", "chunk_length", "camera_keys", "image_size", "prompt_cache",
                            "instructions", "max_action_dim", "stats", "trainer", "vla_data"):
        assert owned_elsewhere not in text, owned_elsewhere
    assert manifest["model"]["framework"]["cosmos25"]["extract_layer"] == setup.cfg.framework.cosmos25.extract_layer


def test_version_3_never_reads_the_training_config(tmp_path: Path) -> None:
    setup = shared_tiny_setup()
    folder = tmp_path / "policy"
    shutil.copytree(setup.policy_dir, folder)
    (folder / "train_config.yaml").write_text("trainer: {renamed: [unclosed\n")  # not even YAML
    policy = DiT4DiTPolicy.from_pretrained(folder)
    (folder / "train_config.yaml").unlink()
    assert DiT4DiTPolicy.from_pretrained(folder).manifest == policy.manifest
    assert policy.manifest.framework.action_model.chunk_length == policy.io.chunk_length


@pytest.mark.parametrize("version", [1, 5, "4", None])
def test_unknown_versions_are_refused_with_one_line(version, tmp_path: Path) -> None:
    folder = tmp_path / "policy"
    shutil.copytree(shared_tiny_setup().policy_dir, folder)
    manifest = json.loads((folder / "policy.json").read_text())
    (folder / "policy.json").write_text(json.dumps({**manifest, "format_version": version}))
    with pytest.raises(PolicyLoadError) as e:
        DiT4DiTPolicy.from_pretrained(folder)
    newer = "; a newer dit4dit_npu wrote it: update this one" if version == 5 else ""
    assert str(e.value) == (
        f"{folder}: policy format_version {version!r} is not supported by this dit4dit_npu (it reads versions [2, 3, 4]){newer}"
    )


def test_training_only_settings_are_not_in_the_manifest_and_old_manifests_with_them_load(tmp_path: Path) -> None:
    """trainer.state_noise_std is not written; a version 3 folder written while it was
    framework.action_model.state_noise_std (main up to 8712bd4) carries it there and still loads
    (the version 3 fixtures, written then, carry it too)."""
    v3 = json.loads((Path(__file__).parent / "fixtures/policy_v3/plain/policy.json").read_text())
    assert "state_noise_std" in v3["model"]["framework"]["action_model"]
    setup = shared_tiny_setup()
    manifest = json.loads((setup.policy_dir / "policy.json").read_text())
    assert "state_noise_std" not in json.dumps(manifest)
    folder = tmp_path / "policy"
    shutil.copytree(setup.policy_dir, folder)
    manifest["model"]["framework"]["action_model"]["state_noise_std"] = [0.0, 0.5]
    (folder / "policy.json").write_text(json.dumps(manifest))
    reseal(folder)  # as a format-4 writer that still had the key would have recorded it
    old = DiT4DiTPolicy.from_pretrained(folder)
    assert old.manifest == DiT4DiTPolicy.from_pretrained(setup.policy_dir).manifest
    assert "state_noise_std" not in json.dumps(old.manifest.to_json())
