"""Which loss reaches which trainable module, read from the run config alone, so that a run that
would train a module by nothing (or nothing at all) is refused at its start, before any data work.

The trainer's total is ``action_loss + trainer.loss_scale.future_video * video_loss``
(``train/trainer.py``), and the model (``models/dit4dit.py``) sends each loss to:

- the action loss (weight 1): the action head, absent in ``training: video``; the video transformer
  too only in ``training: joint`` with ``framework.cosmos25.backprop_action_to_backbone`` (otherwise
  the features are computed without grad);
- the video loss: the video transformer (its LoRA adapters when on) in ``training: joint`` and
  ``video``, when the clip keeps a frame after the observation and ``future_video`` > 0.

A module that ``trainer.freeze_modules`` freezes whole (its path or a parent's) needs no loss. Such
a run otherwise starts, logs ``grad_norm 0.0`` for the module at every step, and saves it unchanged
(e.g. 5-frame clips with ``future_video: 0`` and detached features: the transformer stays at its
initialization while the head learns on its random features). ``trainer.allow_untrained_modules``
lets a user insist. The granularity is the modules the config names (``backbone.transformer``,
``action_model``): the transformer's blocks after ``extract_layer`` get no gradient whenever no
video loss runs, which is the one-frame recipes' known cost, not a refusal.
"""

from __future__ import annotations

from dit4dit_npu.config.schema import Config
from dit4dit_npu.errors import ConfigError

TRANSFORMER = "backbone.transformer"
ACTION_HEAD = "action_model"
INSIST = "trainer.allow_untrained_modules=true"


def frozen_whole(path: str, freeze_modules: list[str]) -> bool:
    """``path`` (a module) is frozen entirely: it, or a module above it, is in ``freeze_modules``."""
    return any(path == p or path.startswith(p + ".") for p in freeze_modules if p)


def trainable_modules(cfg: Config) -> list[str]:
    """The config's modules that have trainable parameters in this run."""
    c, frozen = cfg.framework.cosmos25, cfg.trainer.freeze_modules
    out = []
    if c.training != "action" and not frozen_whole(TRANSFORMER, frozen):
        out.append(TRANSFORMER)
    if c.training != "video" and not frozen_whole(ACTION_HEAD, frozen):
        out.append(ACTION_HEAD)
    return out


def _no_video_loss(cfg: Config) -> str | None:
    """Why the video loss trains nothing in this run (None: it does)."""
    c, d, weight = cfg.framework.cosmos25, cfg.datasets.vla_data, cfg.trainer.loss_scale.future_video
    if c.training == "action":
        return "framework.cosmos25.training='action' has no video loss"
    if len(d.clip_offsets) < 2:
        return (f"the clip has no frame after the observation (datasets.vla_data.video_delta_indices="
                f"{d.video_delta_indices}, action_video_freq_ratio={d.action_video_freq_ratio})")
    if weight == 0:
        return "the video loss is weighted 0 (trainer.loss_scale.future_video=0)"
    return None


def untrained_module(cfg: Config) -> str | None:
    """The first trainable module no loss reaches, said in one line with the settings that cause
    it and the ways out; None when every trainable module gets a loss."""
    c = cfg.framework.cosmos25
    if TRANSFORMER not in trainable_modules(cfg):
        return None  # the action head, whenever it trains, gets the action loss (weight 1)
    no_video = _no_video_loss(cfg)
    if no_video is None:
        return None
    if c.training == "video":
        return (f"{TRANSFORMER} gets no loss: framework.cosmos25.training='video' trains it by the video loss "
                f"alone, and {no_video}, so every loss weight of the objective is 0; weight it > 0, or insist "
                f"with {INSIST}")
    if c.backprop_action_to_backbone:
        return None
    return (f"{TRANSFORMER} gets no loss: {no_video}, and the action loss stops at its features "
            "(framework.cosmos25.backprop_action_to_backbone=false); let one of them reach it, freeze it "
            f"(framework.cosmos25.training=action, or trainer.freeze_modules=[{TRANSFORMER}]), or insist "
            f"with {INSIST}")


def check_every_module_trains(cfg: Config) -> None:
    """Refuse (``ConfigError``, one line) a run with nothing to train, or, unless
    ``trainer.allow_untrained_modules``, one where a trainable module gets no loss."""
    if not trainable_modules(cfg):
        raise ConfigError(
            f"nothing to train: trainer.freeze_modules={cfg.trainer.freeze_modules} freezes every module that "
            f"trains with framework.cosmos25.training={cfg.framework.cosmos25.training!r}"
        )
    problem = untrained_module(cfg)
    if problem is not None and not cfg.trainer.allow_untrained_modules:
        raise ConfigError(problem)
