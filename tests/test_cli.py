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
from train_runs import train_here

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, which pytest itself requires there
    import tomli as tomllib

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
        "dit4dit-data-encode-latents", "dit4dit-convert", "dit4dit-device", "dit4dit-doctor", "dit4dit-sim-demos",
        "dit4dit-sim-eval", "dit4dit-memory-plan", "dit4dit-data-latent-stats", "dit4dit-sim-success-curve",
        "dit4dit-fit-tiny-vae", "dit4dit-make-base", "dit4dit-grad-split",
    }


def test_argparse_programs_live_in_cli_modules_only() -> None:
    """A library module keeps only a two-line ``__main__`` block; its flags are its package's cli
    module's (sim.demos, sim.eval and train.success_curve held their own parsers, and their console
    scripts pointed at the library modules)."""
    cli = ("cli", "ops_cli", "__main__")
    assert {s: t for s, t in SCRIPTS.items() if t.split(":")[0].rsplit(".", 1)[1] not in cli} == {}
    parsers = sorted(str(f.relative_to(ROOT)) for f in (ROOT / "dit4dit_npu").rglob("*.py")
                     if f.stem not in cli and "ArgumentParser(" in f.read_text())
    assert parsers == []


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
    assert h["trainer.max_train_steps"] == 1000 and h["run_id"] == "dit4dit_robotwin_tiny"
    assert h["datasets.vla_data.image_size"] == "[32, 32]" and h["trainer.learning_rate.action_model"] == 1e-3
    assert all(isinstance(v, bool | int | float | str) for v in h.values())


@pytest.mark.slow
def test_training_prints_run_folder_and_device_and_sends_config_to_trackers(tmp_path: Path, monkeypatch, capfd) -> None:
    """A 2-step run (in this process) with TensorBoard and wandb (offline): what each one received, read back."""
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
    monkeypatch.setenv("WANDB_MODE", "offline")
    r = train_here(overrides, capfd)
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


# --------------------------------------------------------------------------------------------
# One wrapper (dit4dit_npu.console): a user error is one line on stderr and exit code 2
# --------------------------------------------------------------------------------------------

# Two bad inputs per command: what to pass ({tmp}: a fresh empty folder) and the whole stderr line.
NOPE = "/nonexistent-dit4dit"
BAD_INPUT = {
    "dit4dit-train": [
        (["--config", f"{NOPE}/run.yaml"], f"config error: config file not found: {NOPE}/run.yaml"),
        (["--config", str(TINY), "trainer.max_train_steps=0"], "config error: trainer.max_train_steps: got 0, expected >= 1"),
    ],
    "dit4dit-eval": [
        (["--policy", NOPE], f"error: policy folder not found: {NOPE}"),
        (["--policy", "{tmp}", "--max-frames", "0"], "error: --max-frames: got 0, expected an integer >= 1"),
    ],
    "dit4dit-serve": [
        (["--policy", NOPE], f"error: policy folder not found: {NOPE}"),
        (["--policy", "{tmp}"], "error: {tmp} is not a policy folder: no policy.json in it, in {tmp}/policy or "
         "under {tmp}/checkpoints (an exported policy has policy.json, model.safetensors, "
         "policy_io.json, prompt_cache.safetensors)"),
    ],
    "dit4dit-data-inspect": [
        ([NOPE], f"error: dataset folder not found: {NOPE}"),
        (["{tmp}"], "error: missing {tmp}/meta/info.json"),
    ],
    "dit4dit-data-demo": [
        (["--out", "{tmp}/demo", "--fps", "0"], "error: fps must be >= 1, got 0"),
        (["--out", "{tmp}/demo", "--episodes", "1", "--length", "10", "--codec", "nope"],
         "error: video codec 'nope': not available in this PyAV/FFmpeg build (e.g. libx264)"),
    ],
    "dit4dit-data-encode-latents": [
        (["--config", f"{NOPE}/run.yaml"], f"config error: config file not found: {NOPE}/run.yaml"),
        (["--config", str(TINY)], "config error: no cache folder: pass --out DIR or set datasets.vla_data.latent_cache"),
    ],
    "dit4dit-convert": [
        (["dit4dit", "--checkpoint", f"{NOPE}/steps_1_pytorch_model.pt", "--config", f"{NOPE}/config.yaml",
          "--base-model", NOPE, "--out", "{tmp}/policy"], f"error: checkpoint not found: {NOPE}/steps_1_pytorch_model.pt"),
        (["dit4dit", "--checkpoint", f"{NOPE}/steps_1_pytorch_model.pt", "--config", f"{NOPE}/config.yaml",
          "--base-model", NOPE, "--out", str(ROOT)], f"error: --out {ROOT} exists and is not a policy folder: choose a new folder"),
    ],
    "dit4dit-device": [
        (["env", "--ranks", "0"], "error: --ranks='0': expected a positive integer (ranks per node)"),
        (["env", "--ranks", "x"], "error: --ranks='x': expected a positive integer (ranks per node)"),
    ],
    "dit4dit-doctor": [
        (["--num-processes", "0"], "error: --num-processes: expected a positive integer, got 0"),
        (["trainer.max_train_steps=3"], "error: config overrides (trainer.max_train_steps=3) need --config"),
    ],
    "dit4dit-sim-eval": [
        (["--scripted", "hold", "--task", "fold", "--out", "{tmp}/eval"],
         "error: unknown task 'fold'; expected one of ['insertion', 'transfer_cube'] or metaworld/<task> (e.g. "
         "metaworld/reach-v3)"),
        (["--scripted", "hold", "--episodes", "0", "--out", "{tmp}/eval"], "error: --episodes: expected >= 1, got 0"),
    ],
    "dit4dit-memory-plan": [
        (["--config", f"{NOPE}/run.yaml"], f"config error: config file not found: {NOPE}/run.yaml"),
        (["--world-size", "0"], "error: --world-size: expected a positive integer, got 0"),
    ],
    "dit4dit-data-latent-stats": [
        (["--config", f"{NOPE}/run.yaml"], f"config error: config file not found: {NOPE}/run.yaml"),
        (["--config", str(TINY), "--samples", "0"], "error: --samples: expected a positive integer, got 0"),
    ],
    "dit4dit-sim-success-curve": [
        (["--run", "{tmp}"], "error: --run: no checkpoints/step_*/policy under {tmp}"),
        (["--run", "{tmp}", "--episodes", "0"], "error: --episodes: expected a positive integer, got 0"),
    ],
    "dit4dit-fit-tiny-vae": [
        (["--config", str(TINY), "--out", "{tmp}/vae.pt"], "error: --out: expected a .safetensors file, got {tmp}/vae.pt"),
        (["--config", str(TINY), "--out", "{tmp}/vae.safetensors", "--steps", "0"],
         "error: --steps: expected an int >= 1, got 0"),
    ],
    "dit4dit-grad-split": [
        (["--run", "{tmp}"], "error: --run {tmp}: no config.yaml there (expected a training run folder)"),
        (["--run", "{tmp}", "--batches", "0"], "error: --batches: expected a positive integer, got 0"),
    ],
    "dit4dit-make-base": [
        (["--size", "tiny", "--out", str(ROOT)], f"error: --out {ROOT}: exists and is not an empty folder (delete it or name another)"),
        (["--size", "medium", "--out", "{tmp}/base", "--layers", "0"], "error: --layers: got 0, expected >= 1"),
    ],
    "dit4dit-sim-demos": [
        (["--task", "fold", "--out", "{tmp}/demos"], "error: unknown task 'fold'; expected one of ['insertion', 'transfer_cube']"),
        (["--size", "big", "--out", "{tmp}/demos"], "error: --size: expected HxW such as 240x320, got 'big'"),
    ],
}


def test_every_console_script_has_bad_input_cases() -> None:
    assert set(BAD_INPUT) == set(SCRIPTS)


@pytest.mark.parametrize(
    "target, args, line",
    [(SCRIPTS[s], a, line) for s in sorted(BAD_INPUT) for a, line in BAD_INPUT[s]],
)
def test_bad_input_is_one_line_and_exit_code_2(target: str, args: list[str], line: str, tmp_path: Path, capsys) -> None:
    """In-process, through the same function the console script calls; nothing is written."""
    module, func = target.split(":")
    main = getattr(importlib.import_module(module), func)
    assert main([a.replace("{tmp}", str(tmp_path)) for a in args]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [line.replace("{tmp}", str(tmp_path))]
    assert list(tmp_path.iterdir()) == []


def _main(script: str):
    module, func = SCRIPTS[script].split(":")
    return getattr(importlib.import_module(module), func)


def test_device_error_from_the_environment_is_one_line(monkeypatch, capsys) -> None:
    from dit4dit_npu import device

    monkeypatch.setenv("DIT4DIT_DEVICE", "tpu")
    device.reset_cache()
    try:
        assert _main("dit4dit-device")([]) == 2
    finally:
        device.reset_cache()
    assert capsys.readouterr().err.splitlines() == ["error: DIT4DIT_DEVICE='tpu': expected one of npu, cuda, cpu"]


def test_the_wrapper_folds_user_errors_into_one_line_and_lets_bugs_through(capsys) -> None:
    import errno

    from dit4dit_client import ServerError

    from dit4dit_npu.config import ConfigError
    from dit4dit_npu.console import run
    from dit4dit_npu.data import DatasetError

    def fail(e: BaseException):
        def command():
            raise e

        return command

    assert run(lambda: None) == 0 and run(lambda: 3) == 3
    assert run(fail(DatasetError("bad\n  episode  3"))) == 2
    assert capsys.readouterr().err == "error: bad episode 3\n"
    assert run(fail(ConfigError("a.b: got 1"))) == 2
    assert capsys.readouterr().err == "config error: a.b: got 1\n"
    assert run(fail(ServerError("policy server refused: bad\n state"))) == 2
    assert capsys.readouterr().err == "error: policy server refused: bad state\n"
    # torch re-raises a DataLoader worker's error as the same type with the worker's traceback
    worker = DatasetError("Caught DatasetError in DataLoader worker process 0.\nOriginal Traceback (most recent "
                          "call last):\n  File ...\ndit4dit_npu.data.errors.DatasetError: cannot open video v.mp4")
    assert run(fail(worker)) == 2
    assert capsys.readouterr().err == "error: cannot open video v.mp4\n"
    assert run(fail(OSError(errno.ENOSPC, "No space left on device"))) == 2
    assert capsys.readouterr().err == "error: no space left: [Errno 28] No space left on device\n"
    assert run(fail(KeyboardInterrupt())) == 130
    assert capsys.readouterr().err == ""
    for bug in (OSError(errno.EACCES, "Permission denied"), ValueError("a bug"), RuntimeError("a bug")):
        with pytest.raises(type(bug)):
            run(fail(bug))


def test_every_user_error_class_is_a_dit4dit_error_and_keeps_its_builtin_base() -> None:
    import pkgutil

    import dit4dit_npu
    from dit4dit_npu.errors import DiT4DiTError

    for m in pkgutil.walk_packages(dit4dit_npu.__path__, "dit4dit_npu."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)

    def subclasses(c: type) -> set[type]:
        return {c, *(s for d in c.__subclasses__() for s in subclasses(d))}

    found = {c.__name__ for c in subclasses(DiT4DiTError) if c.__module__.startswith("dit4dit_npu")}
    assert found >= {
        "MigrationError", "ConfigError", "PolicyIOError", "NonFiniteActionError", "PolicyInputError", "RequestError",
        "ServeError", "PolicyLoadError", "ConversionError", "BatchError", "SimError", "GuidanceError",
        "EpisodeError", "TrainingError", "ManifestError", "PromptCacheError", "NoiseError", "FrameInputError",
        "DatasetError", "EvalError", "DeviceError",
    }
    for c in subclasses(DiT4DiTError) - {DiT4DiTError}:
        assert issubclass(c, ValueError | RuntimeError), c  # `except ValueError` callers keep working
    # the client package installs without this one: its own base, which the CLI wrapper also takes
    from dit4dit_client import ClientError, ServerError, WireFormatError

    assert {ServerError, WireFormatError} <= subclasses(ClientError)
    for c in subclasses(ClientError) - {ClientError}:
        assert issubclass(c, ValueError | RuntimeError), c


@pytest.mark.parametrize(
    "script, argv, old, new, error",
    [
        ("dit4dit-eval", ["--checkpoint", NOPE], "--checkpoint", "--policy", f"policy folder not found: {NOPE}"),
        ("dit4dit-serve", ["--checkpoint", NOPE], "--checkpoint", "--policy", f"policy folder not found: {NOPE}"),
        ("dit4dit-eval", ["--policy", NOPE, "--output", "{tmp}/o"], "--output", "--out", f"policy folder not found: {NOPE}"),
        ("dit4dit-eval", ["--policy", NOPE, "--episodes", "1", "2"], "--episodes", "--episode-indices",
         f"policy folder not found: {NOPE}"),
        ("dit4dit-sim-eval", ["--scripted", "hold", "--task", "fold", "--output", "{tmp}/o"], "--output", "--out",
         "unknown task 'fold'; expected one of ['insertion', 'transfer_cube'] or metaworld/<task> (e.g. "
         "metaworld/reach-v3)"),
    ],
)
def test_a_renamed_flag_keeps_its_old_spelling_hidden_with_one_notice(
    script: str, argv: list[str], old: str, new: str, error: str, tmp_path: Path, capsys
) -> None:
    """One name per concept (--policy: a policy folder; --out: the folder a command writes); users'
    scripts with the former name keep working, told once, and --help shows only the new name."""
    main = _main(script)
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out.split()
    assert new in shown and old not in shown
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"notice: {old} is deprecated, use {new}", f"error: {error}"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", ["dit4dit-eval", "dit4dit-serve", "dit4dit-sim-eval"])
def test_a_required_flag_with_a_former_name_is_still_required(script: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        _main(script)(["--scripted", "hold"] if script == "dit4dit-sim-eval" else [])
    assert e.value.code == 2
    flag = "--out" if script == "dit4dit-sim-eval" else "--policy"
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"error: the following arguments are required: {flag}")


def test_demo_size_and_its_former_halves(tmp_path: Path, capsys) -> None:
    main = _main("dit4dit-data-demo")
    base = ["--out", str(tmp_path / "d"), "--episodes", "1", "--length", "10"]
    assert main([*base, "--size", "32x15"]) == 2
    assert capsys.readouterr().err.strip() == "error: image_size must be even and >= 16, got (32, 15)"
    assert main([*base, "--width", "15"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "notice: --height/--width are deprecated, use --size HxW", "error: image_size must be even and >= 16, got (32, 15)"
    ]
    assert not (tmp_path / "d").exists()


def test_our_warnings_are_one_line_and_others_keep_pythons_form(capsys) -> None:
    """A DiT4DiTWarning (a folder loaded unverified, an input acted on out of range) raised under
    an entry point is one ``warning: ...`` line; a library's warning is left to Python's display."""
    import warnings

    from dit4dit_npu.console import entry_point
    from dit4dit_npu.errors import DiT4DiTWarning

    @entry_point
    def main(argv=None) -> int:
        warnings.warn("policy format_version 3 records no content hashes,\n  so its files load unverified",
                      DiT4DiTWarning, stacklevel=1)
        warnings.warn("a library's own warning", UserWarning, stacklevel=1)
        return 0

    assert main([]) == 0
    err = capsys.readouterr().err.splitlines()
    # (the library's warning goes to Python's own display: under pytest, its warning recorder)
    assert err == ["warning: policy format_version 3 records no content hashes, so its files load unverified"]

