import subprocess
import sys
from pathlib import Path

import pytest
from train_runs import train_cli_here

from dit4dit_npu.config import Config, ConfigError, dump_yaml, load_config, parse_overrides

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "configs/robotwin/dit4dit_robotwin.yaml"
TINY = ROOT / "configs/robotwin/dit4dit_robotwin_tiny.yaml"


def test_real_and_tiny_configs_load():
    real = load_config(REAL)
    assert real.datasets.vla_data.max_action_dim is None  # no padding: the 14 robot dims
    assert real.framework.cosmos25.extract_layer == 17
    assert real.datasets.vla_data.video_delta_indices == list(range(8))
    assert real.framework.action_model.chunk_length == 8
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


def test_video_training_on_one_frame_clips_is_refused_at_load():
    # the video loss alone on a clip with no future frame has no graph: backward would fail at step 1
    with pytest.raises(ConfigError, match=r"datasets.vla_data.video_delta_indices: .*training='video'"):
        load_config(REAL, ["framework.cosmos25.training=video", "datasets.vla_data.video_delta_indices=[0]"])
    with pytest.raises(ConfigError, match="training='video'"):  # the ratio keeps only frame 0
        load_config(REAL, ["framework.cosmos25.training=video", "datasets.vla_data.video_delta_indices=[0, 4]",
                           "datasets.vla_data.action_video_freq_ratio=2"])
    load_config(REAL, ["framework.cosmos25.training=video", "datasets.vla_data.video_delta_indices=[0, 4, 8, 12, 16]"])
    load_config(REAL, ["framework.cosmos25.training=joint", "datasets.vla_data.video_delta_indices=[0]"])  # the tiny recipes'


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


def test_cli_dry_run_prints_resolved_config(capfd):
    # in this process: a dry run builds the model's module tree (seconds of imports in a new one);
    # the tests above run the command as a process
    r = train_cli_here(["--config", str(TINY), "--dry-run", "--trainer.max_train_steps", "9"], capfd)
    assert r.returncode == 0, r.stderr
    assert "max_train_steps: 9" in r.stdout
    assert "extract_layer: 2" in r.stdout


def test_cli_dry_run_checks_the_fitted_tiny_vae_file(tmp_path, capfd):
    # a missing, non-safetensors or other-sizes vae_weights passed the dry run (rc 0), failing only in training
    key = "framework.cosmos25.tiny.vae_weights"
    fitted = ROOT / "configs/aloha/tiny_vae_transfer_cube.safetensors"
    not_st = tmp_path / "notes.txt"
    not_st.write_text("not weights")
    for value, message in (
        (tmp_path / "missing.safetensors", "is not a readable safetensors file"),
        (not_st, "is not a readable safetensors file"),
        (fitted, "does not fit this tiny VAE (vae_base_dim=4)"),
    ):
        r = train_cli_here(["--config", str(TINY), "--dry-run", f"{key}={value}",
                            "framework.cosmos25.tiny.vae_base_dim=4"], capfd)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        [line] = r.stderr.strip().splitlines()[-1:]
        assert line.startswith(f"config error: {key}: {value}") and message in line, line
    r = train_cli_here(["--config", str(TINY), "--dry-run", f"{key}={fitted}"], capfd)
    assert r.returncode == 0, r.stderr


def test_cli_dry_run_takes_a_per_dim_state_noise_and_checks_its_length_where_it_can(capfd):
    # the raw state width comes from the data; the dry run's placeholder fits the list
    noise = "trainer.state_noise_std=[0, 0.5, 0.5]"
    assert train_cli_here(["--config", str(TINY), "--dry-run", noise], capfd).returncode == 0
    sincos = train_cli_here(["--config", str(TINY), "--dry-run", noise, "datasets.vla_data.state_norm=sincos"], capfd)
    assert sincos.returncode == 2 and "3 values, but the encoded state has 2 dims" in sincos.stderr  # sin/cos pairs
    padded = train_cli_here(["--config", str(TINY), "--dry-run", noise, "datasets.vla_data.max_state_dim=8"], capfd)
    assert padded.returncode == 2 and "3 values, but the encoded state has 8 dims" in padded.stderr


def test_state_noise_is_a_training_setting_and_its_old_spelling_still_reads_with_one_notice():
    notices: list = []
    cfg = load_config(TINY, ["framework.action_model.state_noise_std=[0, 0.5]"], on_notices=notices.extend)
    assert cfg.trainer.state_noise_std == [0, 0.5]
    assert not hasattr(cfg.framework.action_model, "state_noise_std")  # not the model's (nor the manifest's)
    assert notices == ["framework.action_model.state_noise_std: moved to trainer.state_noise_std "
                       "(a training-only setting; read as trainer.state_noise_std: [0, 0.5])"]
    same = load_config(TINY, ["trainer.state_noise_std=0.5", "framework.action_model.state_noise_std=0.5"],
                       on_notices=lambda _: None)
    assert same.trainer.state_noise_std == 0.5
    with pytest.raises(ConfigError, match="framework.action_model.state_noise_std .* and trainer.state_noise_std .* "
                                          "differ: give only trainer.state_noise_std"):
        load_config(TINY, ["trainer.state_noise_std=0.5", "framework.action_model.state_noise_std=0.1"])


def test_the_chunk_length_stated_twice_must_agree():
    """chunk_length is one number; DiT4DiT's future_action_window_size (one less) still reads, and
    both given with different chunks is one line, not a silent choice of one."""
    cfg = load_config(TINY, ["framework.action_model.chunk_length=4", "framework.action_model.future_action_window_size=3"],
                      on_notices=lambda _: None)
    assert cfg.framework.action_model.chunk_length == 4
    with pytest.raises(ConfigError, match=r"framework.action_model.future_action_window_size \(4 as a chunk length\) and "
                                          r"framework.action_model.chunk_length \(8\) differ: give only"):
        load_config(TINY, ["framework.action_model.chunk_length=8", "framework.action_model.future_action_window_size=3"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("datasets.vla_data.per_device_batch_size=0", "datasets.vla_data.per_device_batch_size: got 0, expected >= 1"),
        ("datasets.vla_data.num_workers=-1", "datasets.vla_data.num_workers: got -1, expected >= 0 (0 = load in the main process)"),
        ("trainer.eval_interval=0", "trainer.eval_interval: got 0, expected >= 1 (turn evaluation off with trainer.eval_samples=0)"),
        ("trainer.learning_rate={base: 0.0}", "trainer.learning_rate.base: got 0.0, expected a number > 0"),
        ("trainer.learning_rate={base: 1e-4, action_model: .nan}", "trainer.learning_rate.action_model: got nan, expected a number > 0"),
        ("trainer.learning_rate={base: -1e-4}", "trainer.learning_rate.base: got -0.0001, expected a number > 0"),
        ("trainer.scheduler_specific_kwargs.min_lr=-1", "trainer.scheduler_specific_kwargs.min_lr: got -1.0, expected >= 0"),
        ("trainer.num_warmup_steps=-5", "trainer.num_warmup_steps: got -5, expected >= 0"),
        ("trainer.eval_samples=-1", "trainer.eval_samples: got -1, expected >= 0 (0 = no evaluation)"),
        ("trainer.gradient_clipping=0", "trainer.gradient_clipping: got 0.0, expected > 0"),
        ("trainer.optimizer.betas=[0.9, 1.5]", "trainer.optimizer.betas: got [0.9, 1.5], expected [beta1, beta2], each in [0, 1)"),
        ("trainer.optimizer.eps=0", "trainer.optimizer.eps: got 0.0, expected > 0"),
        ("trainer.loss_scale.future_video=.inf", "trainer.loss_scale.future_video: got inf, expected >= 0"),
        ("datasets.vla_data.data_mix=[{path: a, weight: 0}]", "datasets.vla_data.data_mix[0].weight: got 0.0, expected a number > 0"),
        ("datasets.vla_data.video_delta_indices=[0, 2, 2]", "datasets.vla_data.video_delta_indices: got [0, 2, 2], expected strictly increasing frame offsets"),
        ("framework.action_model.num_inference_timesteps=0", "framework.action_model.num_inference_timesteps: got 0, expected >= 1"),
        ("framework.action_model.chunk_length=0", "framework.action_model.chunk_length: got 0, expected >= 1 (actions per chunk)"),
        ("framework.action_model.diffusion_model_cfg.dropout=1.0", "framework.action_model.diffusion_model_cfg.dropout: got 1.0, expected in [0, 1)"),
    ],
)
def test_out_of_range_values_are_refused_at_load(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, [override])
    assert str(e.value) == message


def test_config_errors_exit_2_before_anything_runs(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "dit4dit_npu.train", "--config", str(TINY), "trainer.eval_interval=0", f"run_root_dir={tmp_path}"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "config error: trainer.eval_interval: got 0, expected >= 1 (turn evaluation off with trainer.eval_samples=0)"
    ]
    assert list(tmp_path.iterdir()) == []
