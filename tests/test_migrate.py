"""Original DiT4DiT configs and launch flags load as they are, with one list of what changed."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from train_runs import train_cli_here

from dit4dit_npu.config import ConfigError, load_config
from dit4dit_npu.config.dit4dit_keys import module_path

ROOT = Path(__file__).resolve().parents[1]

# The key set of DiT4DiT's config/libero/dit4dit_libero.yaml (robocasa and real-robot have the same).
LIBERO_YAML = """
run_id: dit4dit
run_root_dir: results/Checkpoints
seed: 42
trackers: [jsonl, wandb]
wandb_entity: your_wandb_entity
wandb_project: DiT4DiT
is_debug: false
framework:
  name: DiT4DiT
  cosmos25:
    future_num_inference_steps: 1
    future_loss_type: flow_matching
    extract_layer: 17
    base_model: /path/to/Cosmos-Predict2.5-2B
    attn_implementation: flash_attention_2
    vl_hidden_dim: 2048
    training: joint
    flow_matching: {time_distribution: logit_normal, high_sigma_ratio: 0.05, high_sigma_min: 0.98}
    conditional_frame_timestep: 0.0001
  action_model:
    action_model_type: DiT-B
    hidden_size: 2560
    add_pos_embed: True
    max_seq_len: 1024
    action_dim: 8
    state_dim: 16
    future_action_window_size: 7
    action_horizon: 8
    past_action_window_size: 0
    repeated_diffusion_steps: 8
    noise_beta_alpha: 1.5
    noise_beta_beta: 1.0
    noise_s: 0.999
    num_timestep_buckets: 1000
    num_inference_timesteps: 4
    num_target_vision_tokens: 32
    diffusion_model_cfg: {cross_attention_dim: 2048, dropout: 0.2, final_dropout: true,
      interleave_self_attention: true, norm_type: "ada_norm", num_layers: 16, output_dim: 2560,
      positional_embeddings: null}
datasets:
  vla_data:
    dataset_py: lerobot_datasets
    data_root_dir: /path/to/dataset/libero
    data_mix: libero_all
    include_state: true
    action_type: joint_position
    default_image_resolution: [3, 224, 224]
    per_device_batch_size: 16
    load_all_data_for_training: true
    obs: ["image_0"]
    image_size: [224,224]
    delete_pause_frame: false
    video_delta_indices: [0,1,2,3,4,5,6,7,8]
    max_state_dim: 16
    max_action_dim: 8
    action_video_freq_ratio: 2
    video_backend: torchvision_av
trainer:
  epochs: 100
  max_train_steps: 100000
  num_warmup_steps: 5000
  save_interval: 5000
  eval_interval: 100
  learning_rate: {base: 1e-05, backbone_interface: 1.0e-05, action_model: 1.0e-04}
  lr_scheduler_type: cosine_with_min_lr
  scheduler_specific_kwargs: {min_lr: 5.0e-07}
  freeze_modules: ''
  repeated_diffusion_steps: 4
  max_grad_norm: 1.0
  warmup_ratio: 0.1
  weight_decay: 0.0
  logging_frequency: 10
  gradient_clipping: 1.0
  gradient_accumulation_steps: 1
  optimizer: {name: AdamW, betas: [0.9, 0.95], eps: 1.0e-08, weight_decay: 1.0e-08}
  is_resume: false
  resume_epoch: null
  resume_step: null
  enable_gradient_checkpointing: true
  enable_mixed_precision_training: true
"""

# run_libero.sh's flags (paths are placeholders there too)
LAUNCH_FLAGS = """--framework.name DiT4DiT --framework.cosmos25.base_model tiny
--framework.action_model.action_model_type DiT-B --datasets.vla_data.data_root_dir /data/libero
--datasets.vla_data.data_mix libero_all --datasets.vla_data.per_device_batch_size 4
--trainer.freeze_modules backbone_interface.extractor.text_encoder,backbone_interface.extractor.vae
--trainer.max_train_steps 80000 --trainer.save_interval 40000 --trainer.logging_frequency 10
--trainer.eval_interval 100 --trainer.learning_rate.backbone_interface 1e-5
--trainer.learning_rate.action_model 1e-4 --trainer.num_warmup_steps 5000
--framework.cosmos25.extract_layer 2 --framework.cosmos25.flow_matching.time_distribution uniform
--framework.cosmos25.flow_matching.high_sigma_ratio null --framework.cosmos25.flow_matching.high_sigma_min null
--trainer.framework.cosmos25.conditional_frame_timestep 0.0001 --datasets.vla_data.action_video_freq_ratio 2
--run_root_dir ./playground/Checkpoints_libero --run_id dit4dit_libero_all --wandb_project DiT4DiT_libero
--wandb_entity your_wandb_entity""".split()


@pytest.fixture
def libero_yaml(tmp_path) -> Path:
    p = tmp_path / "dit4dit_libero.yaml"
    p.write_text(LIBERO_YAML)
    return p


def test_original_yaml_and_flags_load_with_one_list_of_changes(libero_yaml):
    notices: list[list[str]] = []
    cfg = load_config(libero_yaml, LAUNCH_FLAGS, on_notices=notices.append)
    assert len(notices) == 1  # one list, printed once
    text = "\n".join(notices[0])
    assert "trainer.repeated_diffusion_steps: 4 -> framework.action_model.repeated_diffusion_steps: 4" in text
    assert "framework.action_model.repeated_diffusion_steps: ignored (unused in DiT4DiT too" in text
    assert "trainer.max_grad_norm: ignored (unused in DiT4DiT too" in text
    assert "datasets.vla_data.video_backend: 'torchvision_av' dropped" in text
    a, c, d, t = cfg.framework.action_model, cfg.framework.cosmos25, cfg.datasets.vla_data, cfg.trainer
    assert a.repeated_diffusion_steps == 4  # the trainer's, as DiT4DiT read it (not action_model's 8)
    assert (d.max_action_dim, d.max_state_dim) == (8, 16)
    assert t.learning_rate == {"base": 1e-5, "backbone.transformer": 1e-5, "action_model": 1e-4}
    assert t.freeze_modules == []  # text encoder and VAE are never trained here
    assert [e.path for e in d.data_mix][0] == "libero_object_no_noops_1.0.0_lerobot" and len(d.data_mix) == 4
    assert d.camera_keys == ["observation.images.image", "observation.images.wrist_image"]
    assert d.state_norm == "sincos"
    assert (c.flow_matching.time_distribution, c.flow_matching.high_sigma_ratio) == ("uniform", None)
    assert (t.max_train_steps, d.per_device_batch_size, cfg.run_id) == (80000, 4, "dit4dit_libero_all")


def test_every_unknown_key_in_one_message_with_honest_hints(libero_yaml):
    with pytest.raises(ConfigError) as e:
        load_config(libero_yaml, ["trainer.max_train_stepz=3", "trainer.max_grad_normz=1", "foo.bar=2"])
    msg = str(e.value)
    assert "'trainer.max_train_stepz' (did you mean trainer.max_train_steps?)" in msg
    assert "'trainer.max_grad_normz'," in msg and "'foo.bar'" in msg  # nothing close: no hint
    assert "did you mean trainer.max_train_steps?), 'trainer.max_grad_normz', 'foo.bar'" in msg


def test_dotted_learning_rate_keys_in_yaml_and_on_the_command_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("trainer:\n  learning_rate:\n    base: 1.0e-5\n    backbone:\n      transformer: 3.0e-5\n")
    assert load_config(p).trainer.learning_rate == {"base": 1e-5, "backbone.transformer": 3e-5}
    cfg = load_config(p, ["--trainer.learning_rate.backbone.transformer", "2e-5",
                          "trainer.learning_rate.action_model.model=4e-4"])
    assert cfg.trainer.learning_rate == {"base": 1e-5, "backbone.transformer": 2e-5, "action_model.model": 4e-4}


def test_values_with_another_meaning_are_errors(libero_yaml):
    with pytest.raises(ConfigError, match="framework.name: 'VLA' is not supported .*DiT4DiT configs have 'DiT4DiT'"):
        load_config(libero_yaml, ["framework.name=VLA"])
    with pytest.raises(ConfigError, match="data_mix: 'bridge' is not a DiT4DiT mixture this project knows"):
        load_config(libero_yaml, ["datasets.vla_data.data_mix=bridge"])
    with pytest.raises(ConfigError, match=r"action_horizon \(16\) != future_action_window_size \+ 1 \(8\)"):
        load_config(libero_yaml, ["framework.action_model.action_horizon=16"])
    with pytest.raises(ConfigError, match="action_dim \\(14\\) and datasets.vla_data.max_action_dim \\(8\\) differ"):
        load_config(libero_yaml, ["framework.action_model.action_dim=14"])


def test_module_paths():
    assert module_path("backbone_interface") == "backbone.transformer"
    assert module_path("backbone_interface.extractor.transformer.transformer_blocks.3") == \
        "backbone.transformer.transformer_blocks.3"
    assert module_path("action_model.model.transformer_blocks.2.attn1") == "action_model.model.blocks.2.attn1"
    assert module_path("action_model.action_encoder.layer2.weight") == "action_model.action_encoder.W2.weight"
    assert module_path("action_model.state_encoder.layer2.bias") == "action_model.state_encoder.2.bias"
    assert module_path("backbone_interface.extractor.vae") is None
    assert module_path("backbone.transformer") == "backbone.transformer"  # ours stays


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "dit4dit_npu.train", *args], capture_output=True, text=True, cwd=ROOT)


def test_cli_migrate_config_writes_our_schema(libero_yaml, tmp_path):
    out = tmp_path / "ours.yaml"
    r = _cli("--config_yaml", str(libero_yaml), *LAUNCH_FLAGS, "--migrate-config", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("config migrated (")
    notices: list = []
    again = load_config(out, on_notices=notices.append)
    assert notices == []  # already ours: nothing to migrate
    assert again == load_config(libero_yaml, LAUNCH_FLAGS, on_notices=lambda _: None)
    assert "framework:" in out.read_text() and "backbone_interface" not in out.read_text()


def test_cli_dry_run_fails_on_what_the_model_build_would(libero_yaml, capfd):
    # in this process (a dry run builds the model's module tree: seconds of imports in a new one);
    # test_cli_migrate_config_writes_our_schema runs the command as a process
    r = train_cli_here(["--config_yaml", str(libero_yaml), *LAUNCH_FLAGS, "--trainer.learning_rate.action_modle",
                        "1e-4", "--dry-run"], capfd)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "config error: trainer.learning_rate.action_modle: 'action_modle' names no module of the model; "
        "did you mean 'action_model'?"
    )
    from dit4dit_npu.train.cli import check_model_build  # what --dry-run runs, in-process

    cfg = load_config(libero_yaml, [*LAUNCH_FLAGS, "--framework.cosmos25.extract_layer", "17"], lambda _: None)
    with pytest.raises(ConfigError, match="extract_layer: got 17, expected 0..3"):
        check_model_build(cfg)
    r = train_cli_here(["--config_yaml", str(libero_yaml), *LAUNCH_FLAGS, "--dry-run"], capfd)
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["trainer"]["learning_rate"]["backbone.transformer"] == 1e-5


def test_values_of_the_wrong_type_are_one_line_not_a_crash(libero_yaml):
    # a quoted window reached `fws + 1` in the migration: TypeError instead of the schema's line
    with pytest.raises(ConfigError, match="framework.action_model.future_action_window_size: got '7', expected int"):
        load_config(libero_yaml, ["framework.action_model.future_action_window_size='7'"])
    with pytest.raises(ConfigError, match=r"action_horizon: got '8', expected int \(future_action_window_size \+ 1 = 8\)"):
        load_config(libero_yaml, ["framework.action_model.action_horizon='8'"])


@pytest.mark.parametrize("empty", ["", " {}"])
def test_a_section_left_empty_sets_nothing(tmp_path, libero_yaml, empty):
    """`trainer:` with every key commented out is YAML null: a known section with no keys, not an
    unknown key (nor, under a DiT4DiT config, a crash)."""
    p = tmp_path / "c.yaml"
    p.write_text(f"run_id: mine\ntrainer:{empty}\n  # max_train_steps: 5\ndatasets:\n  vla_data:{empty}\n")
    cfg = load_config(p)
    assert cfg.run_id == "mine" and cfg.trainer == load_config(None).trainer
    head, rest = LIBERO_YAML.split("datasets:\n")
    original = tmp_path / "original.yaml"
    original.write_text(f"{head}datasets:\n  vla_data:{empty}\ntrainer:" + rest.split("\ntrainer:")[1])
    assert load_config(original).datasets.vla_data.max_action_dim == 8  # from framework.action_model.action_dim


def test_freeze_modules_of_another_kind_is_refused_not_read_as_nothing(libero_yaml):
    for value in ("5", "{backbone: true}", "true"):
        with pytest.raises(ConfigError, match="trainer.freeze_modules: got .*, expected a list of module paths"):
            load_config(libero_yaml, [f"trainer.freeze_modules={value}"])
    assert load_config(libero_yaml, ["trainer.freeze_modules=null"]).trainer.freeze_modules == []


def test_the_chunk_length_is_one_number_and_the_window_converts_at_the_boundary():
    """Ours: framework.action_model.chunk_length. DiT4DiT's (and this project's earlier)
    future_action_window_size is the chunk minus one: converted once, here, with a notice."""
    notices: list[list[str]] = []
    cfg = load_config(None, ["framework.action_model.future_action_window_size=15"], on_notices=notices.append)
    assert cfg.framework.action_model.chunk_length == 16
    assert notices == [["framework.action_model.future_action_window_size: 15 -> framework.action_model.chunk_length: "
                        "16 (DiT4DiT's window is the chunk minus its first step)"]]
    assert load_config(None, ["framework.action_model.chunk_length=16"]).framework.action_model.chunk_length == 16
