import subprocess
import sys
from pathlib import Path

import pytest

from dit4dit_npu.config import Config, ConfigError, dump_yaml, load_config, parse_overrides

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "configs/robotwin/dit4dit_robotwin.yaml"
TINY = ROOT / "configs/robotwin/dit4dit_robotwin_tiny.yaml"


def test_real_and_tiny_configs_load():
    real = load_config(REAL)
    assert real.datasets.vla_data.max_action_dim is None  # no padding: the 14 robot dims
    assert real.framework.cosmos25.extract_layer == 17
    assert real.datasets.vla_data.video_delta_indices == list(range(8))
    assert real.framework.action_model.future_action_window_size == 7
    tiny = load_config(TINY)
    assert tiny.framework.cosmos25.base_model == "tiny"


def test_both_override_forms():
    cfg = load_config(REAL, ["trainer.max_train_steps=3", "--trainer.save_interval", "7", "--seed=5"])
    assert (cfg.trainer.max_train_steps, cfg.trainer.save_interval, cfg.seed) == (3, 7, 5)
    cfg = load_config(REAL, ["datasets.vla_data.image_size=[64,96]", "trainer.resume=auto"])
    assert cfg.datasets.vla_data.image_size == [64, 96]
    assert cfg.trainer.resume == "auto"


def test_unknown_key_suggests_closest():
    with pytest.raises(ConfigError, match=r"max_train_stepz.*did you mean trainer\.max_train_steps"):
        load_config(REAL, ["trainer.max_train_stepz=3"])


def test_wrong_type_names_key_value_and_type():
    with pytest.raises(ConfigError, match=r"trainer\.max_train_steps: got 'ten', expected int"):
        load_config(REAL, ["trainer.max_train_steps=ten"])
    with pytest.raises(ConfigError, match=r"framework\.cosmos25\.training: got 'both'"):
        load_config(REAL, ["framework.cosmos25.training=both"])


def test_missing_keys_take_defaults(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("run_id: x\n")
    cfg = load_config(p)
    assert cfg.trainer == Config().trainer


def test_float_strings_and_nulls(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("trainer:\n  learning_rate: {base: 1e-5}\n  resume: null\n")
    cfg = load_config(p)
    assert cfg.trainer.learning_rate == {"base": 1e-5}


def test_dump_roundtrip(tmp_path):
    cfg = load_config(REAL, ["seed=3"])
    p = tmp_path / "resolved.yaml"
    p.write_text(dump_yaml(cfg))
    assert load_config(p) == cfg


def test_cross_field_validation():
    with pytest.raises(ConfigError, match="video_delta_indices: must start with 0"):
        load_config(REAL, ["datasets.vla_data.video_delta_indices=[1,2]"])


@pytest.mark.parametrize(
    "key, where",
    [
        ("framework.cosmos25.view_layout=width", "datasets.vla_data.view_layout"),
        ("framework.cosmos25.reference_full_depth_feature_pass=true", "bench/reference.py"),
    ],
)
def test_removed_keys_say_where_the_concept_went(key, where):
    with pytest.raises(ConfigError, match=rf"config key '{key.split('=')[0]}' was removed: .*{where}"):
        load_config(REAL, [key])


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="no value"):
        parse_overrides(["--trainer.max_train_steps"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config", "nope.yaml"], "config file not found"),
        (["--config", str(REAL), "trainer.max_train_stepz=3"], "did you mean trainer.max_train_steps"),
        (["--config", str(REAL), "trainer.max_train_steps=x"], "expected int"),
    ],
)
def test_cli_errors_are_one_line(args, message, tmp_path):
    r = subprocess.run([sys.executable, "-m", "dit4dit_npu.train", *args], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_cli_malformed_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [unclosed\n")
    r = subprocess.run([sys.executable, "-m", "dit4dit_npu.train", "--config", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and "malformed YAML" in r.stderr and "Traceback" not in r.stderr


def test_cli_dry_run_prints_resolved_config():
    r = subprocess.run(
        [sys.executable, "-m", "dit4dit_npu.train", "--config", str(TINY), "--dry-run", "--trainer.max_train_steps", "9"],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert "max_train_steps: 9" in r.stdout
    assert "extract_layer: 2" in r.stdout
