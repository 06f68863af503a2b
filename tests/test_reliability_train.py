"""Reliability of training: resume always finds a whole checkpoint (verified by content: a
file damaged in place is found by its hash, non-finite weights or EMA once loaded), a full disk or
a kill -9 never costs a complete checkpoint, a diverged state is never saved, changed data is
refused, each fault is one clear line.

Training runs on the shared demo data (tests/train_runs.py), without DeepSpeed (it is not what
these tests are about), with an EMA (so checkpoints hold ema.safetensors) and one step at a time;
damage is done to real files. A run is a real process where the process is what is tested (a
file-size limit, a kill -9); the others call the trainer's console-script function in this process.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from train_runs import RUN, TINY, train_here

from dit4dit_npu.config import ConfigError, load_config
from dit4dit_npu.files import hash_files
from dit4dit_npu.train import checkpoint as ckpt_io
from dit4dit_npu.train import resume
from dit4dit_npu.train.errors import TrainingError
from dit4dit_npu.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "DIT4DIT_DEVICE": "cpu", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def data_root(demo_root) -> Path:
    return demo_root


def overrides(runs: Path, data_root: Path, **extra) -> list[str]:
    base = {
        "run_root_dir": runs, "datasets.vla_data.data_root_dir": data_root,
        "datasets.vla_data.generate_demo_if_missing": "false", "datasets.vla_data.per_device_batch_size": 2,
        "trainer.deepspeed_config": "null", "trainer.max_train_steps": 3, "trainer.save_interval": 1,
        "trainer.logging_frequency": 1, "trainer.eval_interval": 100, "trainer.num_warmup_steps": 1,
        "trainer.keep_last_checkpoints": 10, "trainer.ema.decay": 0.9,
    }
    return [f"{k}={v}" for k, v in {**base, **extra}.items()]


def train(args: list[str], **popen) -> subprocess.CompletedProcess:
    """A real training process."""
    return subprocess.run(
        [sys.executable, "-m", "dit4dit_npu.train", "--config", str(TINY), *args],
        env=ENV, capture_output=True, text=True, cwd=ROOT, timeout=300, **popen,
    )


@pytest.fixture(scope="module")
def base_runs(tmp_path_factory, data_root) -> Path:
    """A 3-step run with a checkpoint at every step; tests damage copies of it."""
    runs = tmp_path_factory.mktemp("base") / "runs"
    assert train_here(overrides(runs, data_root)).returncode == 0
    return runs


def copy_runs(base_runs: Path, tmp_path: Path) -> tuple[Path, Path]:
    runs = tmp_path / "runs"
    shutil.copytree(base_runs, runs)
    return runs, runs / RUN / "checkpoints"


def files(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    return r.stderr.strip().splitlines()[-1]


def all_whole(ckpts: Path) -> list[int]:
    """Steps of the step_* folders, each of which must be a whole checkpoint."""
    folders = ckpt_io.step_folders(ckpts.parent)
    assert [(p.name, resume.checkpoint_problem(p)) for _, p in folders] == [(p.name, None) for _, p in folders]
    return [s for s, _ in folders]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["total_loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "total_loss" in r}


# -- resume from damaged files --------------------------------------------------------------------


def test_resume_falls_back_past_damaged_checkpoints_exactly(base_runs, tmp_path, data_root, capfd):
    runs, ck = copy_runs(base_runs, tmp_path)
    run = runs / RUN
    state = ck / "step_000003/trainer_state.pt"
    size = state.stat().st_size
    os.truncate(state, size // 2)
    (ck / "step_000002/state/random_states_0.pkl").unlink()
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "action_lo')  # a kill in the middle of an append
    os.truncate(run / "prompt_cache.safetensors", 100)
    damaged = {name: files(ck / name) for name in ("step_000002", "step_000003")}

    r = train_here(overrides(runs, data_root, **{"trainer.max_train_steps": 4, "trainer.resume": "auto"}), capfd)
    assert r.returncode == 0, r.stderr[-3000:]
    out = (r.stdout + r.stderr).splitlines()
    for line in (
        f"resume: {state} is truncated or damaged ({size // 2} bytes, {size} when saved); moved step_000003 to "
        "damaged-step_000003",
        f"resume: {ck}/step_000002/state/random_states_0.pkl is missing (the RNG state: the run would not continue "
        "exactly); moved step_000002 to damaged-step_000002",
        f"resume: falling back to {ck}/step_000001",
        f"dropped 1 unreadable (torn) line(s) of {run}/metrics.jsonl",
        f"resumed from {ck}/step_000001 at step 1",
    ):
        assert line in out, line
    # step 1 is the end of the warmup on a 3-step and on a 4-step schedule alike: nothing to warn of
    assert not [ln for ln in out if "moves from" in ln], out
    assert any(re.fullmatch(rf"{run}/prompt_cache.safetensors: not a readable safetensors file \(.*\); rebuilding "
                            "the prompt cache", ln) for ln in out), out
    for name, before in damaged.items():  # set aside, not a byte lost
        after = files(ck / f"damaged-{name}")
        assert after == {k: v for k, v in before.items() if k in after} and len(before) - len(after) <= 1
    assert all_whole(ck) == [1, 2, 3, 4]
    resumed, original = losses(run), losses(base_runs / RUN)
    assert sorted(resumed) == [1, 2, 3, 4] and all(resumed[s] == original[s] for s in (1, 2, 3))  # exact
    from dit4dit_npu.weights.prompt_cache import load_prompt_cache

    assert len(load_prompt_cache(run / "prompt_cache.safetensors")) > 0  # rebuilt


@pytest.mark.parametrize(
    "damage, expected",
    [
        ("truncate trainer_state.pt", r"{c}/trainer_state.pt is truncated or damaged \(\d+ bytes, \d+ when saved\)"),
        ("truncate state/model.safetensors", r"{c}/state/model.safetensors is truncated or damaged \(\d+ bytes, \d+ when saved\)"),
        ("truncate state/optimizer.bin", r"{c}/state/optimizer.bin is truncated or damaged \(\d+ bytes, \d+ when saved\)"),
        ("delete fingerprint.json", r"{c}/fingerprint.json is missing"),
        ("delete state/random_states_0.pkl",
         r"{c}/state/random_states_0.pkl is missing \(the RNG state: the run would not continue exactly\)"),
        *[(f"flip {rel}", rf"{{c}}/{re.escape(rel)} does not match the content hash recorded when it was saved "
           r"\(damaged in place: same size, other bytes\)")
          for rel in ("state/model.safetensors", "state/optimizer.bin", "state/random_states_0.pkl", "ema.safetensors",
                      "trainer_state.pt", "policy/model.safetensors")],
        ("legacy scramble trainer_state.pt", r"{c}/trainer_state.pt is unreadable \(.+\)"),
        ("legacy delete fingerprint.json", r"{c}/fingerprint.json is missing"),
        ("legacy delete state/random_states_0.pkl",
         r"{c}/state/random_states_0.pkl is missing \(the RNG state: the run would not continue exactly\)"),
        ("legacy scramble state/random_states_0.pkl",
         r"{c}/state/random_states_0.pkl is unreadable \(\w+; the RNG state: the run would not continue exactly\)"),
    ],
)
def test_each_damaged_file_is_named_and_skipped(base_runs, tmp_path, damage, expected):
    """One damaged file in the newest checkpoint: named, and the one before is chosen. "flip": one
    byte changed in place (same size: only the content hash can tell). "legacy": a checkpoint
    without a manifest (older versions), checked by reading its files."""
    ck = tmp_path / RUN / "checkpoints"
    for name in ("step_000002", "step_000003"):
        shutil.copytree(base_runs / RUN / "checkpoints" / name, ck / name)
    c = ck / "step_000003"
    *legacy, verb, rel = damage.split()
    if legacy:
        (c / ckpt_io.MANIFEST).unlink()
    if verb == "truncate":
        os.truncate(c / rel, (c / rel).stat().st_size - 1)
    elif verb == "delete":
        (c / rel).unlink()
    elif verb == "flip":  # one byte in the middle
        data = bytearray((c / rel).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (c / rel).write_bytes(bytes(data))
    else:  # same size, other bytes
        (c / rel).write_bytes(bytes(reversed((c / rel).read_bytes())))
    point = resume.choose(tmp_path / RUN)
    assert point.path == ck / "step_000002"
    [(path, problem)] = point.damaged
    assert path == c and re.fullmatch(expected.format(c=re.escape(str(c))), problem), problem


def two_steps(base_runs: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Copies of steps 2 and 3 of the base run: (the checkpoints folder, step 3)."""
    ck = tmp_path / RUN / "checkpoints"
    for name in ("step_000002", "step_000003"):
        shutil.copytree(base_runs / RUN / "checkpoints" / name, ck / name)
    return ck, ck / "step_000003"


@pytest.mark.parametrize("form", ["none", "sizes only"])
def test_a_checkpoint_without_content_hashes_resumes_with_one_notice(base_runs, tmp_path, form):
    """A checkpoint without manifest.json, or with the older sizes-only one, was
    resumed silently (a flipped byte in its model state: an inexact run, rc 0). It is still
    resumed (its other checks made), with one line saying it is unverified."""
    ck, c = two_steps(base_runs, tmp_path)
    manifest = c / ckpt_io.MANIFEST
    if form == "none":
        manifest.unlink()
        notice = (f"resume: {c} has no manifest.json (saved by an older version): its files' sizes and content cannot "
                  "be verified; resuming it unverified")
    else:
        files = json.loads(manifest.read_text())["files"]
        manifest.write_text(json.dumps({"files": {rel: v["size"] for rel, v in files.items()}}))
        notice = (f"resume: {manifest} records sizes only (saved by an older version): a file damaged in place cannot "
                  f"be found; resuming {c} with its sizes checked, its content unverified")
    assert resume.choose(tmp_path / RUN) == resume.ResumePoint(c, [], notice)
    cfg = load_config(TINY, [f"trainer.resume={c}"])
    assert resume.find_resume(cfg) == resume.ResumePoint(c, [], notice)


def test_a_whole_checkpoint_resumes_without_a_notice(base_runs, tmp_path):
    ck, c = two_steps(base_runs, tmp_path)
    manifest = json.loads((c / ckpt_io.MANIFEST).read_text())
    assert list(manifest)[-1] == "manifest_sha256"
    assert resume.choose(tmp_path / RUN) == resume.ResumePoint(c, [], None)
    # the policy's files: the hashes its export recorded, taken over, are the files' own
    policy = json.loads((c / "policy/policy.json").read_text())["content"]["files"]
    real = hash_files([c / "policy" / rel for rel in policy])
    assert {rel: manifest["files"][f"policy/{rel}"]["sha256"] for rel in policy} == {
        rel: real[c / "policy" / rel] for rel in policy}


def test_damage_to_the_manifest_is_named_as_such_and_its_step_is_kept(base_runs, tmp_path):
    """A flipped byte in manifest.json was reported as damage of the file whose hash it hit
    (state/latest) and the intact step was set aside. The manifest carries its own hash: its
    damage is named, no file is blamed, and the step resumes unverified with that notice."""
    ck, c = two_steps(base_runs, tmp_path)
    manifest = c / ckpt_io.MANIFEST
    text = manifest.read_text()
    d = json.loads(text)
    digest = d["files"]["state/model.safetensors"]["sha256"]
    flipped = digest[:10] + ("0" if digest[10] != "0" else "1") + digest[11:]  # one hex digit: still valid JSON
    manifest.write_text(text.replace(digest, flipped))
    point = resume.choose(tmp_path / RUN)
    assert point == resume.ResumePoint(c, [], (
        f"resume: {manifest} is damaged (it does not match its own hash, manifest_sha256), so the files of {c} cannot "
        "be verified against it; resuming it unverified"))
    manifest.write_text(text[: len(text) // 2])  # torn: not JSON at all
    point = resume.choose(tmp_path / RUN)
    assert point.path == c and point.damaged == [] and point.notice.startswith(
        f"resume: {manifest} is damaged (unreadable: JSONDecodeError: ")
    assert sorted(p.name for p in ck.iterdir()) == ["step_000002", "step_000003"]  # nothing set aside
    # A manifest of the version before (hashes, none of its own) cannot tell: both are named.
    manifest.write_text(json.dumps({k: v for k, v in {**d, "files": {**d["files"], "state/model.safetensors": {
        **d["files"]["state/model.safetensors"], "sha256": flipped}}}.items() if k != "manifest_sha256"}))
    [(path, problem)] = resume.choose(tmp_path / RUN).damaged
    assert path == c and problem == (
        f"{c}/state/model.safetensors does not match the content hash recorded when it was saved (damaged in place: "
        "same size, other bytes) (or its entry in manifest.json)")


def test_no_whole_checkpoint_or_a_damaged_explicit_one_is_one_line(base_runs, tmp_path):
    ck = tmp_path / RUN / "checkpoints"
    shutil.copytree(base_runs / RUN / "checkpoints" / "step_000001", ck / "step_000001")
    (ck / "step_000001/fingerprint.json").unlink()
    with pytest.raises(TrainingError) as e:
        resume.choose(tmp_path / RUN)
    assert str(e.value) == (
        f"no complete checkpoint to resume in {ck}: step_000001: {ck}/step_000001/fingerprint.json is missing "
        "(move them away to start the run fresh)"
    )
    cfg = load_config(TINY, [f"trainer.resume={ck / 'step_000001'}"])
    with pytest.raises(ConfigError) as e:
        resume.find_resume(cfg)
    assert str(e.value) == (
        f"trainer.resume: {ck}/step_000001 cannot be resumed from: {ck}/step_000001/fingerprint.json is missing"
    )


# -- saving: full disk, kill -9 during save / prune / commit ---------------------------------------


@pytest.mark.slow
def test_disk_full_during_save_is_one_line_and_loses_nothing(base_runs, tmp_path, data_root):
    """A real write failure from the real writers: the training process runs under a file-size
    rlimit (RLIMIT_FSIZE, 8 MB) that its 9.5 MB optimizer shard exceeds, so torch.save fails
    exactly as on a full disk ("unexpected pos"; Python ignores SIGXFSZ, the write gets EFBIG)."""
    runs, ck = copy_runs(base_runs, tmp_path)
    before = files(ck)
    limit = 8 * 2**20

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = train(overrides(runs, data_root, **{"trainer.max_train_steps": 4, "trainer.resume": "auto"}),
              preexec_fn=small_disk)
    tmp = ck / ".tmp-step_000004"
    assert re.fullmatch(
        rf"error: checkpoint step 4 not saved: no space left writing {re.escape(str(tmp))} \(.+\); removed the "
        rf"partial folder, the latest checkpoint is still {re.escape(str(ck / 'step_000003'))}",
        one_line_error(r),
    ), r.stderr[-2000:]
    assert not tmp.exists() and files(ck) == before  # nothing lost, nothing half-written left
    assert all_whole(ck) == [1, 2, 3]


def wait_then_kill(p: subprocess.Popen, appeared, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while p.poll() is None and time.monotonic() < deadline:
        if appeared():
            os.kill(p.pid, signal.SIGKILL)
            break
        time.sleep(0.001)
    p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL, "the process ended before it could be killed at the right moment"


@pytest.mark.slow
def test_kill_during_save_keeps_every_checkpoint_whole(base_runs, tmp_path, data_root, capfd):
    runs, ck = copy_runs(base_runs, tmp_path)
    before = files(ck)
    args = overrides(runs, data_root, **{"trainer.max_train_steps": 5, "trainer.resume": "auto"})
    cmd = [sys.executable, "-m", "dit4dit_npu.train", "--config", str(TINY), *args]
    with open(tmp_path / "log", "w") as log:
        p = subprocess.Popen(cmd, env=ENV, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        wait_then_kill(p, lambda: any(ck.glob(".tmp-step_*")))  # killed in the middle of a save
    steps = all_whole(ck)
    assert {k: v for k, v in files(ck).items() if k in before} == before  # the old ones are untouched
    stale = sorted(ck.glob(".tmp-step_*"))
    r = train_here(args, capfd)  # restart: the partial folder is cleaned, the run continues from the newest whole one
    assert r.returncode == 0, r.stderr[-3000:]
    for s in stale:
        assert f"removed stale partial folder {s}" in r.stderr
    assert f"resumed from {ck}/step_{steps[-1]:06d} at step {steps[-1]}" in r.stdout + r.stderr
    assert all_whole(ck) == list(range(1, 6)) and not list(ck.glob(".*"))


@pytest.mark.slow
def test_kill_during_prune_leaves_no_half_deleted_checkpoint(base_runs, tmp_path):
    runs, ck = copy_runs(base_runs, tmp_path)
    pad = ck / "step_000001/state/pad"  # a checkpoint slow to delete, like a real tens-of-GB one
    pad.mkdir()
    for i in range(20_000):
        (pad / str(i)).touch()
    newest = files(ck / "step_000003")
    code = "import sys, pathlib; from dit4dit_npu.train.checkpoint import prune; prune(pathlib.Path(sys.argv[1]), 1)"
    p = subprocess.Popen([sys.executable, "-c", code, str(runs / RUN)], env=ENV, cwd=ROOT)
    wait_then_kill(p, lambda: (ck / ".deleting-step_000001").exists())
    assert (ck / ".deleting-step_000001").exists()  # killed half-way through deleting it ...
    remaining = all_whole(ck)  # ... yet every step_* left is whole
    assert 3 in remaining and files(ck / "step_000003") == newest
    assert ckpt_io.clean_stale(runs / RUN) == [f"removed stale partial folder {ck}/.deleting-step_000001"]
    assert not (ck / ".deleting-step_000001").exists()


def test_a_kill_inside_a_replacing_commit_keeps_one_copy(base_runs, tmp_path):
    """``commit`` replacing step_3: the state a kill between its two renames leaves (the old copy
    moved aside, the new one not yet in place) is repaired at the next start."""
    runs, ck = copy_runs(base_runs, tmp_path)
    whole = files(ck / "step_000003")
    shutil.copytree(ck / "step_000002", ck / ".tmp-step_000003")  # a new save of step 3 ...
    os.replace(ck / "step_000003", ck / ".old-step_000003")  # ... killed right after the first rename
    assert [s for s, _ in ckpt_io.step_folders(runs / RUN)] == [1, 2]
    assert ckpt_io.clean_stale(runs / RUN) == [
        f"restored {ck}/step_000003 from .old-step_000003 (a run was killed while replacing it)",
        f"removed stale partial folder {ck}/.tmp-step_000003",
    ]
    assert files(ck / "step_000003") == whole and all_whole(ck) == [1, 2, 3]
    shutil.copytree(ck / "step_000002", ck / ".tmp-step_000003")
    ckpt_io.commit(ck / ".tmp-step_000003", ck / "step_000003")  # an uninterrupted replace
    assert files(ck / "step_000003") == files(ck / "step_000002") and not list(ck.glob(".*"))


# -- changed data, worker errors --------------------------------------------------------------


def test_resume_on_changed_data_is_refused(base_runs, tmp_path, data_root, capfd):
    runs, ck = copy_runs(base_runs, tmp_path)
    before = files(runs)
    changed = tmp_path / "data" / "robotwin_demo"
    shutil.copytree(data_root / "robotwin_demo", changed)
    saved = ckpt_io.read_fingerprint(ck / "step_000003")["data"]
    episode = saved["split"][0]["train"][0]
    path = changed / f"data/chunk-000/episode_{episode:06d}.parquet"
    table = pq.read_table(path)
    actions = np.array(table.column("action").to_pylist(), dtype=np.float32)
    actions[5, 3] = 5.0  # one edited value: a new maximum of joint 3
    col = table.column_names.index("action")
    pq.write_table(table.set_column(col, "action", pa.array(list(actions), pa.list_(pa.float32()))), path)

    r = train_here(overrides(runs, tmp_path / "data", **{"trainer.max_train_steps": 4, "trainer.resume": "auto"}), capfd)
    old = saved["policy_io"]["stats"]["action"]["max"][3]
    assert one_line_error(r) == (
        f"error: the training data changed since checkpoint {ck}/step_000003: action statistics differ (max: dim 3 "
        f"was {old:.6g}, now 5); resume with the data it was trained on, or start a new run (another run_id)"
    )
    assert files(runs) == before  # refused before anything was written (config.yaml included)

    cfg = load_config(TINY, overrides(runs, data_root, seed=7, **{"datasets.vla_data.val_fraction": 0.25}))
    with pytest.raises(ConfigError, match=r"another config: datasets.vla_data.val_fraction: checkpoint 0.2 vs "
                                          r"config 0.25; seed: checkpoint 42 vs config 7"):
        resume.check_config(ck / "step_000003", cfg)
    split = [{"train": saved["split"][0]["train"][1:], "val": saved["split"][0]["val"] + [episode]}]
    with pytest.raises(TrainingError, match=rf"data_mix\[0\] train episodes differ \(new: \[\], gone: \[{episode}\]\)"):
        resume.check_data(ck / "step_000003", {**saved, "split": split})


@pytest.mark.slow  # over 4 s of one core: the full tier (the fast tier keeps to 3 minutes)
def test_dataloader_worker_errors_come_back_as_one_line(tmp_path):
    """A real forked DataLoader worker decodes a video truncated after the dataset was opened."""
    from policy_fixtures import tiny_config

    from dit4dit_npu.batch import Batch
    from dit4dit_npu.data import DatasetError, build_training_data
    from dit4dit_npu.train.stream import BatchStream

    data = build_training_data(tiny_config(tmp_path))
    for video in (tmp_path / "data").rglob("*.mp4"):
        video.write_bytes(video.read_bytes()[:200])
    stream = BatchStream(data.train_dataset, data.sampler, 2, 1, 0, Batch.collate)
    with pytest.raises(DatasetError) as e:
        stream.next()
    msg = str(e.value)
    assert re.fullmatch(r"cannot open video .+\.mp4 \(truncated or corrupt mp4\?\): .+", msg) and "\n" not in msg


@pytest.mark.slow  # over 4 s of one core: the full tier (the fast tier keeps to 3 minutes)
def test_a_start_refused_after_the_folder_check_leaves_no_run_folder(tmp_path, data_root, capfd):
    """A fresh run refused once its folder exists (here: a latent cache that is not one) takes
    the folder it created away again; a folder that was there before stays, with its content."""
    garbage = tmp_path / "not_a_cache"
    garbage.mkdir()
    bad = {"datasets.vla_data.latent_cache": garbage}
    r = train_here(overrides(tmp_path / "runs", data_root, **bad), capfd)
    assert r.returncode != 0 and "not a latent cache" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "runs" / RUN).exists()

    mine = tmp_path / "runs2" / RUN
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    r = train_here(overrides(tmp_path / "runs2", data_root, **bad), capfd)
    assert r.returncode != 0
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


# -- checkpoints verified by content ---------------------------------------------------------------


def rewrite_tensors(path: Path, change) -> str:
    """Apply ``change(tensors) -> key`` to a safetensors file (its metadata kept); returns the key."""
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    key = change(tensors)
    save_file(tensors, str(path), metadata=meta)
    return key


def nan_in_a_head_weight(tensors: dict[str, torch.Tensor]) -> str:
    key = sorted(k for k in tensors if k.startswith("action_model.") and k.endswith(".weight"))[0]
    tensors[key].view(-1)[0] = float("nan")
    return key


@pytest.mark.slow
def test_non_finite_weights_or_ema_once_loaded_set_the_checkpoint_aside(base_runs, tmp_path, data_root, capfd):
    """Checkpoints holding NaN whose manifests agree with their bytes (saved so by a version that did
    not check): only loading tells. Step 3's EMA and step 2's trained weights: each is named and set
    aside, and the run continues exactly from step 1."""
    runs, ck = copy_runs(base_runs, tmp_path)
    ema_key = rewrite_tensors(ck / "step_000003/ema.safetensors", nan_in_a_head_weight)
    weight_key = rewrite_tensors(ck / "step_000002/state/model.safetensors", nan_in_a_head_weight)
    for step in (2, 3):
        ckpt_io.write_manifest(ck / f"step_{step:06d}")
    assert all_whole(ck) == [1, 2, 3]  # whole on disk
    r = train_here(overrides(runs, data_root, **{"trainer.max_train_steps": 4, "trainer.resume": "auto"}), capfd)
    assert r.returncode == 0, r.stderr[-3000:]
    out = (r.stdout + r.stderr).splitlines()
    for line in (
        f"resume: {ck}/step_000003 holds non-finite values in the EMA (1 tensor(s), e.g. {ema_key!r}) (a checkpoint "
        "of a diverged run); moved step_000003 to damaged-step_000003",
        f"resume: falling back to {ck}/step_000002",
        f"resume: {ck}/step_000002 holds non-finite values in the trained weights (1 tensor(s), e.g. {weight_key!r}) "
        "(a checkpoint of a diverged run); moved step_000002 to damaged-step_000002",
        f"resume: falling back to {ck}/step_000001",
        f"resumed from {ck}/step_000001 at step 1",
    ):
        assert line in out, (line, out[-30:])
    assert all_whole(ck) == [1, 2, 3, 4]
    resumed, original = losses(runs / RUN), losses(base_runs / RUN)
    assert all(resumed[s] == original[s] for s in (1, 2, 3))  # the loads it fell back past left no trace


@pytest.mark.slow
def test_a_file_that_fails_to_load_sets_the_checkpoint_aside(base_runs, tmp_path, data_root, capfd):
    """Checkpoints of an older version (no manifest, so no hashes) with a file damaged in place:
    step 3's weights, step 2's RNG state. Only loading tells; before, the first was a traceback and
    the second was skipped by accelerate (one info log line: the run continued inexactly). Each is
    named and set aside, and the run continues exactly from step 1."""
    runs, ck = copy_runs(base_runs, tmp_path)
    for step, rel in ((3, "state/model.safetensors"), (2, "state/random_states_0.pkl")):
        c = ck / f"step_{step:06d}"
        (c / ckpt_io.MANIFEST).unlink()
        (c / rel).write_bytes(bytes(reversed((c / rel).read_bytes())))
    assert resume.checkpoint_problem(ck / "step_000003") is None  # whole as far as an unhashed one can tell
    r = train_here(overrides(runs, data_root, **{"trainer.max_train_steps": 4, "trainer.resume": "auto"}), capfd)
    assert r.returncode == 0, r.stderr[-3000:]
    out, c = (r.stdout + r.stderr).splitlines(), re.escape(str(ck))
    for pattern in (
        rf"resume: {c}/step_000003 has no manifest.json \(saved by an older version\): its files' sizes and content "
        "cannot be verified; resuming it unverified",  # the notice, before loading finds the damage
        rf"resume: {c}/step_000003 fails to load \(.+\); moved step_000003 to damaged-step_000003",
        rf"resume: {c}/step_000002/state/random_states_0.pkl is unreadable \(UnpicklingError; the RNG state: the run "
        "would not continue exactly\\); moved step_000002 to damaged-step_000002",
        rf"resume: falling back to {c}/step_000001",
        rf"resumed from {c}/step_000001 at step 1",
    ):
        assert any(re.fullmatch(pattern, line) for line in out), (pattern, out[-30:])
    assert "Traceback" not in r.stderr
    resumed, original = losses(runs / RUN), losses(base_runs / RUN)
    assert sorted(resumed) == [1, 2, 3, 4] and all(resumed[s] == original[s] for s in (1, 2, 3))


@pytest.mark.slow
def test_a_diverged_state_is_never_saved_nor_pruned_for(base_runs, tmp_path, data_root, capfd):
    """Step 3's optimizer state holds NaN (its manifest agreeing): the weights load finite and the
    first step's loss is finite, but that step's update turns a weight, and so its EMA, to NaN. The
    save refuses, naming the checkpoint; before, it saved the diverged state and pruning (keep 1)
    then deleted step 3, the last healthy checkpoint."""
    runs, ck = copy_runs(base_runs, tmp_path)
    optimizer = torch.load(ck / "step_000003/state/optimizer.bin", weights_only=False)
    next(iter(optimizer["state"].values()))["exp_avg"].fill_(float("nan"))
    torch.save(optimizer, ck / "step_000003/state/optimizer.bin")
    ckpt_io.write_manifest(ck / "step_000003")
    before = files(ck)
    r = train_here(overrides(runs, data_root, **{"trainer.max_train_steps": 4, "trainer.resume": "auto",
                                            "trainer.keep_last_checkpoints": 1}), capfd)
    assert re.fullmatch(
        r"error: checkpoint step 4 not saved: non-finite values in the trained weights \(1 tensor\(s\), e\.g\. '.+'\) "
        r"and in the EMA \(1 tensor\(s\), e\.g\. '.+'\) \(within the first steps after resuming from "
        + re.escape(f"{ck}/step_000003: that checkpoint is the likelier cause (a state that loads but diverges at "
                    f"once); move it aside (e.g. to {ck}/damaged-step_000003) to resume from the one before); the "
                    f"latest checkpoint is still {ck}/step_000003"),
        one_line_error(r),
    ), r.stderr[-2000:]
    assert files(ck) == before and not list(ck.glob(".tmp-*"))


@pytest.mark.slow
def test_a_non_finite_loss_right_after_a_resume_names_the_checkpoint(base_runs, tmp_path, data_root, capfd):
    """Finite weights that diverge at once (scaled x1e30, manifest agreeing): the stop names the
    checkpoint it resumed from instead of suggesting a lower learning rate; nothing is changed."""
    runs, ck = copy_runs(base_runs, tmp_path)

    def blow_up(tensors):
        for k, t in tensors.items():
            if k.startswith("action_model.") and t.is_floating_point():
                t.mul_(1e30)
        return ""

    rewrite_tensors(ck / "step_000003/state/model.safetensors", blow_up)
    ckpt_io.write_manifest(ck / "step_000003")
    before = files(ck)
    r = train_here(overrides(runs, data_root, **{"trainer.max_train_steps": 4, "trainer.resume": "auto"}), capfd)
    assert one_line_error(r) == (
        f"error: non-finite loss at or before step 4, within the first steps after resuming from {ck}/step_000003: "
        "that checkpoint is the likelier cause (a state that loads but diverges at once); move it aside (e.g. to "
        f"{ck}/damaged-step_000003) to resume from the one before; stopping without saving (no checkpoint was changed)"
    )
    assert files(ck) == before


def test_pruning_never_removes_the_checkpoint_just_saved(base_runs, tmp_path):
    """A run resumed from an earlier checkpoint than its folder's newest (trainer.resume=PATH) saves
    step 2 while step 3 exists: keeping 1 by step number alone would delete the one just saved and
    checked, and keep the unverified step 3."""
    ck = tmp_path / RUN / "checkpoints"
    for name in ("step_000001", "step_000002", "step_000003"):
        shutil.copytree(base_runs / RUN / "checkpoints" / name, ck / name)
    ckpt_io.prune(tmp_path / RUN, 1, protect=ck / "step_000002")
    assert [s for s, _ in ckpt_io.step_folders(tmp_path / RUN)] == [2, 3]
    ckpt_io.prune(tmp_path / RUN, 1)
    assert [s for s, _ in ckpt_io.step_folders(tmp_path / RUN)] == [3]
