"""Policy folders are content-verified (format_version 4): every file loading reads
has the size and content hash recorded in policy.json when it was written, policy.json carries its
own hash, and a file changed after export (same size, other bytes: a LoRA adapter with every weight
changed) is one line naming it. Folders of formats 2 and 3 load with one notice that they are
unverified; `doctor --policy` and `convert to-dit4dit` hash every file whole."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from dit4dit_npu.config import load_config
from dit4dit_npu.policy import DiT4DiTPolicy, PolicyLoadError, UnverifiedPolicyWarning, export_policy
from dit4dit_npu.policy.folder import load_policy_folder, verify_policy
from dit4dit_npu.policy.integrity import CHANGED, content_problem, content_section

V3 = Path(__file__).parent / "fixtures" / "policy_v3"
ADAPTER = "adapter/adapter_model.safetensors"


def recorded(folder: Path) -> tuple[dict, int, np.ndarray]:
    e = np.load(folder / "expected.npz")
    obs = {k.removeprefix("obs/"): e[k] for k in e.files if k.startswith("obs/")}
    obs["instruction"] = str(e["instruction"])
    return obs, int(e["seed"]), e["actions"]


def reexport(name: str, out: Path) -> Path:
    """The version 3 fixture ``name`` loaded and exported again by today's code (format 4)."""
    src = V3 / name
    with pytest.warns(UnverifiedPolicyWarning):
        loaded = load_policy_folder(src)
    cfg = load_config(src / "train_config.yaml")
    split = {p: r.held_out_episodes for p, r in loaded.manifest.data.datasets.items()}
    return export_policy(out / name, loaded.model, cfg, loaded.io, loaded.prompt_cache, split, list(split),
                         loaded.manifest.step)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("v4")
    return {name: reexport(name, root) for name in ("plain", "lora", "cropped")}


def copy(folder: Path, tmp_path: Path) -> Path:
    dst = tmp_path / folder.name
    shutil.copytree(folder, dst)
    return dst


def refused(folder: Path) -> str:
    with pytest.raises(PolicyLoadError) as e:
        DiT4DiTPolicy.from_pretrained(folder)
    assert "\n" not in str(e.value)
    return str(e.value)


def flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["plain", "lora", "cropped"])
def test_a_reexported_version_3_folder_is_verified_and_acts_the_same(exported, name):
    folder = exported[name]
    manifest = json.loads((folder / "policy.json").read_text())
    assert manifest["format_version"] == 4 and manifest["content"]["hash"] == "sha256/64MiB-pieces"
    files = sorted(manifest["content"]["files"])
    adapter = ["adapter/adapter_config.json", ADAPTER] if name == "lora" else []
    assert files == sorted(["model.safetensors", "policy_io.json", "prompt_cache.safetensors", *adapter])
    for rel, rec in manifest["content"]["files"].items():
        assert rec["size"] == (folder / rel).stat().st_size and len(rec["sha256"]) == 64
    obs, seed, actions = recorded(V3 / name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnverifiedPolicyWarning)  # verified: no notice
        policy = DiT4DiTPolicy.from_pretrained(folder)
    np.testing.assert_allclose(policy.predict_action(obs, seed=seed), actions, rtol=0, atol=1e-6)
    assert verify_policy(folder) == (True, f"{folder}: format_version 4; policy.json and its {len(files)} files "
                                           "match their content hashes")


def test_a_lora_adapter_changed_in_place_is_refused_naming_it(exported, tmp_path):
    """The issue's case: every adapter weight changed, same size, same metadata."""
    for folder in (copy(exported["lora"], tmp_path / "v4"), copy(V3 / "lora", tmp_path / "v3")):
        path = folder / ADAPTER
        size = path.stat().st_size
        with safe_open(str(path), "pt") as f:
            meta, weights = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
        save_file({k: v * 1.5 for k, v in weights.items()}, str(path), metadata=meta)
        assert path.stat().st_size == size
    v4, v3 = tmp_path / "v4" / "lora", tmp_path / "v3" / "lora"
    assert refused(v4) == f"{v4 / ADAPTER} {CHANGED}"
    assert CHANGED == "does not match the content hash recorded when the policy was written (changed after export)"
    with pytest.warns(UnverifiedPolicyWarning, match="records no content hashes"):
        DiT4DiTPolicy.from_pretrained(v3)  # what version 3 could not see: it loads, with the notice


@pytest.mark.parametrize("rel", ["model.safetensors", "policy_io.json", "prompt_cache.safetensors",
                                 "adapter/adapter_config.json", ADAPTER])
def test_each_file_changed_in_place_is_refused_naming_it(exported, tmp_path, rel):
    folder = copy(exported["lora"], tmp_path)
    flip_middle_byte(folder / rel)
    assert refused(folder) == f"{folder / rel} {CHANGED}"
    from dit4dit_npu.convert.export import export_dit4dit

    with pytest.raises(PolicyLoadError) as e:  # the export checks the folder as the loader does
        export_dit4dit(folder, tmp_path / "run")
    assert str(e.value) == f"{folder / rel} {CHANGED}"
    assert not (tmp_path / "run").exists()


def test_a_truncated_missing_or_added_file_is_named(exported, tmp_path):
    folder = copy(exported["plain"], tmp_path / "a")
    data = (folder / "policy_io.json").read_bytes()
    (folder / "policy_io.json").write_bytes(data[:-10])
    assert refused(folder) == (f"{folder}/policy_io.json has {len(data) - 10} bytes, {len(data)} when the policy was "
                               "written (truncated or replaced after export)")
    folder = copy(exported["plain"], tmp_path / "b")
    shutil.copytree(exported["lora"] / "adapter", folder / "adapter")
    assert refused(folder) == f"{folder}/{ADAPTER} has no content hash in {folder}/policy.json (added after export?)"
    folder = copy(exported["plain"], tmp_path / "c")
    (folder / "train_config.yaml").write_text("never read, never hashed\n")
    DiT4DiTPolicy.from_pretrained(folder)


def test_the_manifest_carries_its_own_hash(exported, tmp_path):
    """A change to policy.json that leaves valid JSON (a step, a size, a hash) is named as the
    manifest's, not blamed on the file it lists."""
    start = json.loads((exported["plain"] / "policy.json").read_text())
    assert list(start)[-1] == "manifest_sha256"
    cases = {
        "step": lambda m: m.__setitem__("step", 4),
        "size": lambda m: m["content"]["files"]["model.safetensors"].__setitem__("size", 1),
        "hash": lambda m: m["content"]["files"]["policy_io.json"].__setitem__("sha256", "0" * 64),
        "base": lambda m: m["model"]["framework"]["cosmos25"].__setitem__("base_model", "/elsewhere"),
    }
    for name, change in cases.items():
        folder = copy(exported["plain"], tmp_path / name)
        m = json.loads((folder / "policy.json").read_text())
        change(m)
        (folder / "policy.json").write_text(json.dumps(m, indent=1))
        assert refused(folder) == (
            f"{folder}/policy.json does not match its own content hash (manifest_sha256): edited or damaged after "
            "export (to load it with another base model pass base_model= / --base-model instead of editing it)"
        ), name
    folder = copy(exported["plain"], tmp_path / "unsealed")
    (folder / "policy.json").write_text(json.dumps({k: v for k, v in start.items() if k != "manifest_sha256"}))
    assert "records no content hash of its own (manifest_sha256)" in refused(folder)
    folder = copy(exported["plain"], tmp_path / "flip")
    flip_middle_byte(folder / "policy.json")  # a byte of the text itself: unreadable JSON or a wrong hash
    assert refused(folder).startswith(f"{folder}/policy.json")


def test_large_files_are_checked_by_edges_unless_asked_fully(exported, tmp_path):
    """Above ALWAYS_HASHED_BYTES (2 GiB) a file is checked by size and its first and last MiB at
    load; a full check (doctor --policy, convert to-dit4dit, full_check=True) hashes it whole.
    Shown with the threshold lowered to 1 MiB and a 3 MiB file instead of writing a 2 GiB one."""
    folder = copy(exported["plain"], tmp_path)
    big = folder / "big.bin"  # larger than both edges (1 MiB each): its middle is in neither
    big.write_bytes(np.random.default_rng(0).integers(0, 256, 3 * 2**20, dtype=np.uint8).tobytes())
    read = ["big.bin", "policy_io.json"]
    section = content_section(folder, read, always_hashed=2**20)
    assert "edges_sha256" in section["files"]["big.bin"] and "edges_sha256" not in section["files"]["policy_io.json"]
    flip_middle_byte(big)
    assert content_problem(folder, section, read, full=False, always_hashed=2**20) is None
    assert content_problem(folder, section, read, full=True, always_hashed=2**20) == f"{big} {CHANGED}"
    data = bytearray(big.read_bytes())
    data[-1] ^= 0x01
    big.write_bytes(bytes(data))
    assert content_problem(folder, section, read, full=False, always_hashed=2**20) == f"{big} {CHANGED}"
    flip_middle_byte(folder / "policy_io.json")  # under the threshold: hashed whole either way
    assert content_problem(folder, section, ["policy_io.json"], full=False, always_hashed=2**20) == (
        f"{folder}/policy_io.json {CHANGED}")


def test_doctor_checks_a_policy_fully(exported, tmp_path, capsys):
    from dit4dit_npu.doctor.cli import main

    assert main(["--policy", str(exported["lora"])]) == 0
    assert capsys.readouterr().out.strip() == (f"PASS policy: {exported['lora']}: format_version 4; policy.json and its 5 "
                                               "files match their content hashes")
    assert main(["--policy", str(V3 / "plain")]) == 0
    assert capsys.readouterr().out.strip() == (f"WARN policy: {V3 / 'plain'}: format_version 3 parses and its "
                                               "model.safetensors reads, but it records no content hashes: its files "
                                               "are unverified")
    damaged = copy(V3 / "plain", tmp_path / "v3")  # unhashed, so only reading the weights can tell
    (damaged / "model.safetensors").write_bytes((damaged / "model.safetensors").read_bytes()[:200])
    assert main(["--policy", str(damaged)]) == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"FAIL policy: {damaged / 'model.safetensors'}") and "\n" not in line, line
    folder = copy(exported["lora"], tmp_path)
    flip_middle_byte(folder / ADAPTER)
    assert main(["--policy", str(folder)]) == 1
    assert capsys.readouterr().out.strip() == f"FAIL policy: {folder / ADAPTER} {CHANGED}"


def test_files_of_two_checkpoints_of_one_run_are_named_as_such(exported, tmp_path, capsys):
    """A policy.json (or a weight file) copied from another checkpoint of the same run matches its
    own hash; the steps the files record tell that they come from two checkpoints, in
    from_pretrained and in the doctor, instead of blaming the weights as changed after export."""
    from dit4dit_npu.doctor.cli import main

    first = exported["lora"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnverifiedPolicyWarning)
        loaded = load_policy_folder(first)
    step = loaded.manifest.step
    import torch

    with torch.no_grad():
        for p in loaded.model.parameters():
            if p.requires_grad:
                p.add_(0.01)  # trained on: other weights at a later step
    cfg = load_config(V3 / "lora" / "train_config.yaml")
    split = {p: r.held_out_episodes for p, r in loaded.manifest.data.datasets.items()}
    later = export_policy(tmp_path / "later", loaded.model, cfg, loaded.io, loaded.prompt_cache, split, list(split),
                          step + 5)
    cases = {"policy.json": ("policy.json", "model.safetensors", "weights"),
             "model.safetensors": ("model.safetensors", "model.safetensors", "weights"),
             ADAPTER: (ADAPTER, ADAPTER, "adapter")}
    for name, (copied, named, what) in cases.items():
        folder = copy(later, tmp_path / name.replace("/", "_"))
        shutil.copyfile(first / copied, folder / copied)
        theirs = step if copied != "policy.json" else step + 5
        ours = step + 5 if copied != "policy.json" else step
        message = (f"{folder} holds files of two checkpoints: {folder}/policy.json records step {ours} but "
                   f"{folder / named} holds the {what} of step {theirs} (copy every file of one checkpoint's policy "
                   "folder)")
        assert refused(folder) == message, name
        assert main(["--policy", str(folder)]) == 1
        assert capsys.readouterr().out.strip() == f"FAIL policy: {message}"
