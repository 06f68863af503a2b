"""A run that would train a module by nothing is refused at its start (config/objective.py): the
video transformer with no video loss and the action loss detached from its features, training
'video' with the video loss weighted 0, a run whose every module is frozen. One line, exit code 2,
under --dry-run too and before the run folder or any data is touched; trainer.allow_untrained_modules
lets a user insist. The shipped configs and recipes all train every module they leave trainable."""

from __future__ import annotations

from pathlib import Path

import pytest

from dit4dit_npu.config import ConfigError, load_config
from dit4dit_npu.config.objective import check_every_module_trains, trainable_modules, untrained_module
from dit4dit_npu.train.cli import main as train_main

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs/robotwin/dit4dit_robotwin_tiny.yaml"
REAL = ROOT / "configs/robotwin/dit4dit_robotwin.yaml"
ALOHA = ROOT / "configs/aloha/dit4dit_aloha_transfer_cube_tiny.yaml"
# the recipe's OBJECTIVE=joint clips: one future latent frame
FIVE_FRAMES = ["datasets.vla_data.video_delta_indices=[0, 4, 8, 12, 16]", "datasets.vla_data.action_video_freq_ratio=1"]
DETACHED = "framework.cosmos25.backprop_action_to_backbone=false"

REFUSED = [
    # OBJECTIVE=joint VIDEO_WEIGHT=0 BACKPROP=0 in the recipe: the head learns on random features
    ([*FIVE_FRAMES, DETACHED, "trainer.loss_scale.future_video=0"], "the video loss is weighted 0"),
    # video-only training with its one loss weighted 0: grad_norm 0.0 at every step
    ([*FIVE_FRAMES, "framework.cosmos25.training=video", "trainer.loss_scale.future_video=0"],
     "every loss weight of the objective is 0"),
    # one-frame clips (no future frame) and detached features
    ([DETACHED], "the clip has no frame after the observation"),
    # LoRA adapters on the transformer are trained by the same losses
    ([*FIVE_FRAMES, DETACHED, "trainer.loss_scale.future_video=0.0", "framework.cosmos25.lora.rank=4"],
     "weighted 0"),
]


@pytest.mark.parametrize(("overrides", "why"), REFUSED, ids=["joint-weight0", "video-weight0", "one-frame", "lora"])
def test_a_module_no_loss_reaches_is_refused_under_dry_run(tmp_path, capsys, overrides, why) -> None:
    runs = tmp_path / "runs"
    code = train_main(["--config", str(ALOHA), f"run_root_dir={runs}", *overrides, "--dry-run"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith("config error: backbone.transformer gets no loss") and why in lines[0], lines[0]
    assert "trainer.allow_untrained_modules=true" in lines[0]
    assert not runs.exists()


def test_a_training_run_is_refused_before_its_run_folder_or_data(tmp_path, capsys) -> None:
    runs = tmp_path / "runs"
    code = train_main(["--config", str(TINY), f"run_root_dir={runs}", f"datasets.vla_data.data_root_dir={tmp_path}",
                       "datasets.vla_data.generate_demo_if_missing=true", *FIVE_FRAMES, DETACHED,
                       "trainer.loss_scale.future_video=0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "backbone.transformer gets no loss" in err[0], err
    assert not runs.exists() and list(tmp_path.iterdir()) == []  # no demo data generated either


def test_allow_untrained_modules_lets_a_user_insist(capsys) -> None:
    code = train_main(["--config", str(ALOHA), *FIVE_FRAMES, DETACHED, "trainer.loss_scale.future_video=0",
                       "trainer.allow_untrained_modules=true", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and "allow_untrained_modules: true" in out


def test_nothing_to_train_is_refused_whatever_the_override() -> None:
    cfg = load_config(TINY, [*FIVE_FRAMES, "framework.cosmos25.training=video", "trainer.freeze_modules=[backbone]",
                             "trainer.allow_untrained_modules=true"])
    with pytest.raises(ConfigError, match=r"nothing to train: trainer.freeze_modules=\['backbone'\] freezes every"):
        check_every_module_trains(cfg)


@pytest.mark.parametrize("config, overrides", [
    (TINY, []),  # the embedded default: one-frame clips, the action loss into the backbone
    (ALOHA, []),  # the recipe's no_video objective
    (ALOHA, [*FIVE_FRAMES, "trainer.loss_scale.future_video=0.2"]),  # OBJECTIVE=joint's defaults
    (ALOHA, [*FIVE_FRAMES, DETACHED]),  # the paper's default: the video loss trains the backbone
    (ALOHA, [*FIVE_FRAMES, "trainer.loss_scale.future_video=0"]),  # weight 0, the action loss reaches it
    (REAL, []),
    (REAL, ["framework.cosmos25.training=action"]),  # frozen backbone: only the head trains
    (REAL, ["trainer.loss_scale.future_video=0", "trainer.freeze_modules=[backbone.transformer]"]),
    (REAL, ["trainer.loss_scale.future_video=0", "trainer.freeze_modules=[backbone]"]),
])
def test_runs_that_train_every_trainable_module_pass(config, overrides) -> None:
    cfg = load_config(config, overrides)
    assert untrained_module(cfg) is None
    check_every_module_trains(cfg)


def test_a_partly_frozen_transformer_still_needs_a_loss() -> None:
    cfg = load_config(REAL, ["trainer.loss_scale.future_video=0",
                             "trainer.freeze_modules=[backbone.transformer.transformer_blocks.0]"])
    assert trainable_modules(cfg) == ["backbone.transformer", "action_model"]
    assert "backbone.transformer gets no loss" in untrained_module(cfg)
