"""The command line explains itself: every console script's --help, help text on every option,
trackers checked when the config loads, the run folder and device printed when training starts,
and the resolved config sent to TensorBoard and wandb."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs/robotwin/dit4dit_robotwin_tiny.yaml"
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
ENV = {**os.environ, "DIT4DIT_DEVICE": "cpu", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _call(target: str, args: list[str], prelude: str = "") -> subprocess.CompletedProcess:
    """Run a console script's target ``module:function`` in a fresh process, as the installed script does."""
    module, func = target.split(":")
    code = f"import sys\n{prelude}\nfrom {module} import {func}\nsys.exit({func}({args!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)


def test_every_entry_point_has_a_console_script() -> None:
    assert set(SCRIPTS) == {
        "dit4dit-train", "dit4dit-eval", "dit4dit-serve", "dit4dit-data-inspect", "dit4dit-data-demo",
        "dit4dit-data-encode-latents", "dit4dit-convert", "dit4dit-device",
    }


@pytest.mark.slow  # a process each (the options' help text is checked in-process below)
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_console_script_help_runs(script: str) -> None:
    r = _call(SCRIPTS[script], ["--help"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("usage:") and len(r.stdout.splitlines()) > 3, r.stdout


@pytest.mark.parametrize("script", sorted(set(SCRIPTS) - {"dit4dit-device"}))  # device: hand-written usage
def test_every_option_has_help_text(script: str, monkeypatch) -> None:
    """The parser each CLI builds (captured when it parses), every option with a help string."""
    captured: list[argparse.ArgumentParser] = []

    class Parsed(Exception):
        pass

    def capture(self, args=None, namespace=None):
        captured.append(self)
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    module, func = SCRIPTS[script].split(":")
    with pytest.raises(Parsed):
        getattr(importlib.import_module(module), func)([])
    actions = [a for a in captured[0]._actions if not isinstance(a, argparse._HelpAction)]
    assert actions
    missing = [a.option_strings or a.dest for a in actions if not (a.help or "").strip()]
    assert not missing, f"{script}: options without help: {missing}"


@pytest.mark.slow
def test_device_help_names_every_argument() -> None:
    out = _call(SCRIPTS["dit4dit-device"], ["--help"]).stdout
    assert all(word in out for word in ("env", "--ranks N", "--help"))


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb"])
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "train"])
def test_missing_tracker_is_one_line_at_config_load(tracker: str, dry_run: bool) -> None:
    """Before torch is even imported (training would otherwise fail after the data and model load)."""
    hide = f"sys.modules[{tracker!r}] = None  # not installed, whatever this host has\n"
    after = "\nassert 'torch' not in sys.modules, 'the check came after the heavy imports'"
    args = ["--config", str(TINY), f"trackers=[jsonl,{tracker}]", *(["--dry-run"] if dry_run else [])]
    module, func = SCRIPTS["dit4dit-train"].split(":")
    code = f"import sys\n{hide}from {module} import {func}\nrc = {func}({args!r}){after}\nsys.exit(rc)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"trackers: {tracker} not installed (pip install {tracker}" in lines[0], r.stderr


def test_flat_hparams_are_scalars_for_every_config_leaf() -> None:
    from dit4dit_npu.config import load_config
    from dit4dit_npu.train.metrics import flat_hparams

    h = flat_hparams(load_config(TINY))
    assert h["trainer.max_train_steps"] == 600 and h["run_id"] == "dit4dit_robotwin_tiny"
    assert h["datasets.vla_data.image_size"] == "[32, 32]" and h["trainer.learning_rate.action_model"] == 1e-3
    assert all(isinstance(v, bool | int | float | str) for v in h.values())


@pytest.mark.slow
def test_training_prints_run_folder_and_device_and_sends_config_to_trackers(tmp_path: Path) -> None:
    """A real 2-step run with TensorBoard and wandb (offline): what each one received, read back."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    from dit4dit_npu.data.demo import write_demo_dataset

    write_demo_dataset(tmp_path / "data" / "robotwin_demo", num_episodes=4, episode_length=24)
    overrides = [
        f"run_root_dir={tmp_path}/runs", f"datasets.vla_data.data_root_dir={tmp_path}/data", "run_id=cli",
        "trackers=[jsonl,tensorboard,wandb]", "trainer.max_train_steps=2", "trainer.save_interval=2",
        "trainer.eval_interval=100", "trainer.logging_frequency=1", "datasets.vla_data.per_device_batch_size=2",
    ]
    r = subprocess.run(
        [sys.executable, "-m", "dit4dit_npu.train", "--config", str(TINY), *overrides],
        capture_output=True, text=True, cwd=ROOT, env={**ENV, "WANDB_MODE": "offline"}, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = (tmp_path / "runs/cli").resolve()
    assert f"run folder: {run_dir} | device=cpu count=1 backend=gloo" in r.stdout + r.stderr

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "run_id: cli" in text and "max_train_steps: 2" in text
    start = plugin_data_pb2.HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    ).session_start_info
    assert start.hparams["trainer.max_train_steps"].number_value == 2
    assert start.hparams["trackers"].string_value == '["jsonl", "tensorboard", "wandb"]'
    assert [s.step for s in events.Scalars("total_loss")] == [1, 2]

    # wandb offline keeps the run in its binary record log: the config travels in it.
    record = next((run_dir / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()
    assert b"max_train_steps" in record and b"extract_layer" in record
