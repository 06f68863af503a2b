"""Reliability of policies and eval: nothing non-finite reaches a robot, damaged or mixed policy
folders are refused naming the file, eval's bad arguments and failures are one line.

Every case damages a copy of a real exported policy folder (tests/policy_fixtures.py) on disk."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from policy_fixtures import observation_from_sample, reseal, shared_tiny_setup
from safetensors import safe_open
from safetensors.torch import save_file

from dit4dit_npu.eval import cli as eval_cli
from dit4dit_npu.eval import offline as ev
from dit4dit_npu.policy import (
    DiT4DiTPolicy,
    NonFiniteActionError,
    PolicyInputError,
    PolicyLoadError,
    StateOutOfRangeError,
    StateRangeWarning,
)
from dit4dit_npu.policy import policy as policy_module


@pytest.fixture(scope="module")
def setup():
    return shared_tiny_setup()


def copy_policy(setup, tmp_path: Path) -> Path:
    dst = tmp_path / "policy"
    shutil.copytree(setup.policy_dir, dst)
    return dst


def rewrite_weights(folder: Path, change) -> str:
    """Apply ``change(weights)`` to model.safetensors, keeping its metadata; returns a changed key."""
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        meta = f.metadata()
        weights = {k: f.get_tensor(k) for k in f.keys()}
    key = change(weights)
    save_file(weights, str(folder / "model.safetensors"), metadata=meta)
    reseal(folder)  # the hashes would refuse it first (test_policy_hashes.py): this tests what is behind them
    return key


def edit_json(path: Path, change) -> None:
    d = json.loads(path.read_text())
    change(d)
    path.write_text(json.dumps(d))
    reseal(path.parent)


def refused(folder: Path, message: str) -> None:
    with pytest.raises(PolicyLoadError) as e:
        DiT4DiTPolicy.from_pretrained(folder)
    assert str(e.value) == message


def error_lines(capsys) -> list[str]:
    """stderr without the tqdm progress bar ("eval: ..."): what is left must be the one error line."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [ln for ln in err.strip().splitlines() if not ln.startswith("eval:")]


def obs(setup, i: int = 0) -> dict:
    return observation_from_sample(setup.data.io.camera_keys, setup.data.val_dataset.raw_sample(i))


def test_nan_weight_is_refused_at_load(setup, tmp_path):
    folder = copy_policy(setup, tmp_path)

    def poison(w):
        key = sorted(k for k in w if k.startswith("action_model."))[0]
        w[key].view(-1)[0] = float("nan")
        return key

    key = rewrite_weights(folder, poison)
    refused(
        folder,
        f"{folder}/model.safetensors: tensor {key!r} has 1 NaN/inf value(s); refusing a policy whose actions would be non-finite",
    )


def test_nan_normalizer_stats_are_refused_at_load(setup, tmp_path):
    folder = copy_policy(setup, tmp_path)
    edit_json(folder / "policy_io.json", lambda d: d["stats"]["action"]["max"].__setitem__(3, float("nan")))
    refused(
        folder,
        f"{folder}/policy_io.json: action statistic 'max' is NaN/inf in dims [3]; refusing a policy whose actions "
        "would be non-finite or wrong",
    )


@pytest.mark.parametrize("edit, problem", [
    (lambda d: d["stats"]["action"]["min"].__setitem__(1, 1e6), "action statistic 'min' exceeds 'max' in dims [1]"),
    (lambda d: d["stats"]["state"]["q01"].__setitem__(0, 1e6), "state statistic 'q01' exceeds 'q99' in dims [0]"),
    (lambda d: d["stats"]["action"]["std"].__setitem__(2, -1.0), "action statistic 'std' is negative in dims [2]"),
])
def test_inverted_normalizer_stats_are_refused_at_load(setup, tmp_path, edit, problem):
    """Statistics a consistent but wrong writer produced (or an unhashed folder's edit): finite, so
    the NaN check passes them, but they would unnormalize to wrong actions without a word."""
    folder = copy_policy(setup, tmp_path)
    edit_json(folder / "policy_io.json", edit)
    refused(folder, f"{folder}/policy_io.json: {problem}; refusing a policy whose actions would be non-finite or wrong")


def test_non_finite_actions_never_leave_predict_action(setup):
    policy = DiT4DiTPolicy.from_pretrained(setup.policy_dir)
    o = obs(setup)
    assert np.isfinite(policy.predict_action(o, seed=0)).all()
    far = {**o, "state": np.full(policy.state_dim, 1e30)}  # the absurd state, allowed through
    with pytest.warns(StateRangeWarning, match="state far outside the training range"):
        with pytest.raises(NonFiniteActionError) as e:
            policy.predict_action(far, seed=0, allow_out_of_range=True)
    n = policy.chunk_length * policy.action_dim
    assert str(e.value) == (
        f"predict_action produced {n} NaN/inf value(s) of {n} (joints ['left_waist', 'left_shoulder', 'left_elbow', "
        "'left_forearm_roll', 'left_wrist_angle', 'left_wrist_rotate']); refusing to return them: the observation "
        "is far outside the training data, or the policy's weights/normalizer are damaged"
    )


def test_non_finite_actions_from_explicit_noise_name_the_noise_not_the_observation(setup):
    """An explicit ``noise=`` of 1e30 (finite, so the noise checks pass it) drives the sampler to
    NaN: the line names noise=, not a plausible observation or damaged weights."""
    policy = DiT4DiTPolicy.from_pretrained(setup.policy_dir)
    o = obs(setup)
    huge = {"action": np.full((1, policy.chunk_length, policy.io.spec.action_width), 1e30, np.float32)}
    with pytest.raises(NonFiniteActionError) as e:
        policy.predict_action(o, seed=0, noise=huge)
    line = str(e.value)
    assert "\n" not in line and "the noise= it was given (values up to 1e+30;" in line, line
    assert "outside the training data" not in line and "damaged" not in line
    assert line.endswith("or call without noise=")


def test_a_state_in_degrees_is_refused_naming_the_dims_or_allowed_with_a_warning(setup):
    """A state sent in degrees instead of radians got normal-looking actions (one log line
    per process). Refused by default, one line naming the dims, values and training ranges; allowed
    on request, the same line comes back to the caller as a StateRangeWarning."""
    policy = DiT4DiTPolicy.from_pretrained(setup.policy_dir)
    o = obs(setup)
    degrees = {**o, "state": np.degrees(o["state"])}
    stats = setup.data.io.stats["state"]
    far = policy_module.state_out_of_range(stats, degrees["state"])
    assert far  # some joints leave the range widened by a whole range on each side
    names = policy.manifest.data.state_names
    first = far[0]
    with pytest.raises(StateOutOfRangeError) as e:
        policy.predict_action(degrees, seed=0)
    line = str(e.value)
    assert "\n" not in line and line.startswith(
        f"state far outside the training range (beyond it by more than its width) in {names[first]} = "
        f"{degrees['state'][first]:.4g} (trained on [{stats.min[first]:.4g}, {stats.max[first]:.4g}])"
    ), line
    assert line.endswith("check the robot's units (degrees for radians?) and joint order; refused "
                         "(allow_out_of_range=True acts on it anyway)"), line
    with pytest.warns(StateRangeWarning) as w:
        actions = policy.predict_action(degrees, seed=0, allow_out_of_range=True)
    assert np.isfinite(actions).all() and str(w[0].message) == line.removesuffix(
        "; refused (allow_out_of_range=True acts on it anyway)")
    in_range = {**o, "state": (stats.min + stats.max) / 2 + 0.99 * (stats.max - stats.min) * 1.5}  # 2.98 half-ranges out
    policy.predict_action(in_range, seed=0)  # a whole training range of margin: not refused


@pytest.mark.parametrize("seed, message", [
    (1.5, "seed: expected an int in [0, 2**63), got float 1.5"),
    (2**70, f"seed: {2**70} is out of range, expected an int in [0, 2**63)"),
    (-1, "seed: -1 is out of range, expected an int in [0, 2**63)"),
    (True, "seed: expected an int in [0, 2**63), got bool True"),
])
def test_a_bad_seed_is_one_line(setup, seed, message):
    policy = DiT4DiTPolicy.from_pretrained(setup.policy_dir)
    with pytest.raises(PolicyInputError) as e:
        policy.predict_action(obs(setup), seed=seed)
    assert str(e.value) == message
    assert policy.predict_action(obs(setup), seed=np.int64(7)).shape == (policy.chunk_length, policy.action_dim)


def test_out_of_range_state_is_found_per_joint(setup):
    stats = setup.data.io.stats["state"]
    state = (stats.min + stats.max) / 2
    assert policy_module.state_out_of_range(stats, state) == []
    state = state.copy()
    state[[2, 9]] = stats.max[[2, 9]] + 1.5 * (stats.max - stats.min)[[2, 9]]  # 4 half-ranges out
    assert policy_module.state_out_of_range(stats, state) == [2, 9]


def test_damaged_safetensors_are_refused_naming_the_file(setup, tmp_path):
    for name in ("model.safetensors", "prompt_cache.safetensors"):
        folder = copy_policy(setup, tmp_path / name)
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: len(data) // 2])
        refused(folder, f"{folder / name} has {len(data) // 2} bytes, {len(data)} when the policy was written "
                "(truncated or replaced after export)")
        reseal(folder)  # a folder without hashes: the reader names it too
        with pytest.raises(PolicyLoadError) as e:
            DiT4DiTPolicy.from_pretrained(folder)
        assert str(e.value).startswith(f"{folder / name}: not a readable safetensors file (")


def test_files_of_another_run_are_refused(setup, tmp_path):
    import dataclasses

    from dit4dit_npu.transforms.policy_io import PolicyIO

    io = setup.data.io
    folder = copy_policy(setup, tmp_path / "width")  # policy_io.json of a run with padded actions
    d = dataclasses.replace(setup.cfg.datasets.vla_data, max_action_dim=16)
    padded = PolicyIO.from_config(
        dataclasses.replace(setup.cfg, datasets=dataclasses.replace(setup.cfg.datasets, vla_data=d)),
        io.stats["state"], io.stats["action"], warn=False,
    )
    padded.save(folder / "policy_io.json")
    reseal(folder)
    refused(
        folder,
        f"{folder}: policy_io.json's action width is 16 but the action head in model.safetensors takes 14 "
        "(action_model.action_encoder.W1.weight [128, 14]) (files of different runs mixed, or edited after export?)",
    )
    folder = copy_policy(setup, tmp_path / "chunk")  # the chunk length has one owner: policy_io.json
    edit_json(folder / "policy.json", lambda m: m["model"]["framework"]["action_model"].__setitem__(
        "future_action_window_size", 3))
    refused(
        folder,
        f"{folder}/policy.json: model.framework.action_model.future_action_window_size does not belong here: "
        "the chunk length is policy_io.json's chunk_length",
    )
    folder = copy_policy(setup, tmp_path / "step")  # weights of another checkpoint
    edit_json(folder / "policy.json", lambda d: d.__setitem__("step", 7))
    refused(
        folder,
        f"{folder} holds files of two checkpoints: {folder}/policy.json records step 7 but {folder}/model.safetensors "
        "holds the weights of step 0 (copy every file of one checkpoint's policy folder)",
    )


def test_manifest_problems_are_one_line_naming_the_key(setup, tmp_path):
    """policy.json is parsed with the run config's own types: a wrong or unknown key is named."""
    cases = [
        (lambda m: m["model"]["framework"]["cosmos25"].__setitem__("extract_layer", "two"),
         "model.framework.cosmos25.extract_layer: got 'two', expected int"),
        (lambda m: m["model"]["framework"]["cosmos25"].__setitem__("extract_layr", 2),
         "unknown key 'model.framework.cosmos25.extract_layr'; did you mean model.framework.cosmos25.extract_layer?"),
        (lambda m: m["model"].__setitem__("mixed_precision", "fp16"),
         "model.mixed_precision: got 'fp16', expected one of ['bf16', 'no']"),
        (lambda m: m["model"]["framework"]["cosmos25"].__setitem__("extract_layer", -1),
         "model.framework.cosmos25.extract_layer: got -1, expected >= 0"),
        (lambda m: m["data"].pop("action_key"), "missing ['data.action_key']"),
        (lambda m: m.pop("step"), "missing ['step']"),
    ]
    for i, (change, message) in enumerate(cases):
        folder = copy_policy(setup, tmp_path / str(i))
        edit_json(folder / "policy.json", change)
        refused(folder, f"{folder}/policy.json: {message}")


# -- eval ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flag, value, least",
    [("--max-frames", "0", 1), ("--batch-size", "0", 1), ("--stride", "-1", 1), ("--video-steps", "0", 1)],
)
def test_eval_arguments_are_validated_first(setup, tmp_path, capsys, flag, value, least):
    out = tmp_path / "out"
    assert eval_cli.main(["--policy", str(setup.policy_dir), "--out", str(out), flag, value]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {flag}: got {value}, expected an integer >= {least}"]
    assert not out.exists()


def test_eval_checks_its_output_folder_before_predicting(setup, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert eval_cli.main(["--policy", str(setup.policy_dir), "--out", str(blocker / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: --out: cannot write to {blocker}/out (Not a directory)"]


def test_eval_dataset_errors_are_one_line(setup, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(setup.data.dataset_paths[0], data)
    episodes = setup.data.split[str(setup.data.dataset_paths[0])]["val"]
    video = sorted(data.rglob(f"episode_{episodes[0]:06d}.mp4"))[0]
    video.write_bytes(video.read_bytes()[:300])  # truncated: opening it fails during prediction
    out = tmp_path / "out"
    args = ["--policy", str(setup.policy_dir), "--data", str(data), "--episode-indices", str(episodes[0]), "--out", str(out)]
    assert eval_cli.main(args) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and err[0].startswith(f"error: cannot open video {video} (truncated or corrupt mp4?)"), err
    assert not (out / "metrics.json").exists()


def test_eval_exits_non_zero_on_non_finite_actions_or_metrics(setup, tmp_path, capsys):
    folder = copy_policy(setup, tmp_path)

    def blow_up(w):  # finite weights whose actions overflow to inf: passes load, fails at predict
        key = sorted(k for k in w if k.startswith("action_model.action_decoder") and k.endswith("weight"))[-1]
        w[key] = w[key] * 1e38
        return key

    rewrite_weights(folder, blow_up)
    out = tmp_path / "out"
    assert eval_cli.main(["--policy", str(folder), "--out", str(out), "--max-frames", "4"]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and err[0].startswith("error: predict_action produced "), err
    assert not (out / "metrics.json").exists()
    with pytest.raises(ev.EvalError, match=r"^metric model.mse is not finite \(nan\)$"):
        ev.check_finite({"model": {"mse": float("nan"), "mae": 1.0}})
    with pytest.raises(ev.EvalError, match="metric model.mse_per_joint is not finite"):
        ev.check_finite({"model": {"mse": 1.0, "mse_per_joint": [1.0, float("inf")]}})


@pytest.mark.slow
def test_eval_on_a_full_disk_is_one_line_naming_its_folder(setup, tmp_path):
    """Real writes failing: eval runs under a file-size rlimit that its plots exceed (Python
    ignores SIGXFSZ: each write fails with EFBIG exactly as on a full disk)."""
    import os
    import resource
    import subprocess
    import sys

    limit = 80_000  # the two summary plots fit, a trajectory plot does not

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "dit4dit_npu.eval", "--policy", str(setup.policy_dir), "--out", str(out),
         "--max-frames", "4", "--video-samples", "1"],
        capture_output=True, text=True, timeout=300, preexec_fn=small_disk, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: --out {out}: no space left writing the results ([Errno 27] File too large); metrics.json was not written"
    )
    assert not (out / "metrics.json").exists()
