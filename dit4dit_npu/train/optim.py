"""Freezing, per-module learning-rate groups, AdamW and the LR schedule."""

from __future__ import annotations

import difflib

import torch
from torch import nn

from dit4dit_npu import device
from dit4dit_npu.config import ConfigError, TrainerConfig


def _module_paths(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_modules() if name]


def _absent(model: nn.Module, path: str) -> bool:
    """The path names a slot the model has but leaves empty in this configuration (the action
    head in ``training: video``): a valid key for another mode, not a typo."""
    parent, _, name = path.rpartition(".")
    try:
        owner = model.get_submodule(parent) if parent else model
    except AttributeError:
        return False
    return hasattr(owner, name) and getattr(owner, name) is None


def _resolve(model: nn.Module, path: str, key: str) -> nn.Module:
    try:
        return model.get_submodule(path)
    except AttributeError:
        close = difflib.get_close_matches(path, _module_paths(model), n=1, cutoff=0.4)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{key}: {path!r} names no module of the model{hint}") from None


def freeze_modules(model: nn.Module, paths: list[str]) -> list[str]:
    """requires_grad=False on each listed module (a mistyped path is an error, not ignored)."""
    for path in paths:
        for p in _resolve(model, path, "trainer.freeze_modules").parameters():
            p.requires_grad_(False)
    return paths


def param_groups(model: nn.Module, learning_rate: dict[str, float]) -> list[dict]:
    """One group per dotted module path in `learning_rate`, the rest in `base`.

    A parameter belongs to the most specific (longest) matching path, so `backbone` and
    `backbone.transformer` can both be given. Frozen parameters are left out entirely.
    Empty groups are dropped (DeepSpeed rejects them) but every path must still resolve, except
    one whose module this training mode leaves out (the action head in video-only training).
    """
    paths = sorted((k for k in learning_rate if k != "base" and not _absent(model, k)), key=len, reverse=True)
    owner: dict[int, str] = {}
    for path in paths:
        for p in _resolve(model, path, f"trainer.learning_rate.{path}").parameters():
            owner.setdefault(id(p), path)
    groups: dict[str, list[nn.Parameter]] = {name: [] for name in ["base", *paths]}
    for p in model.parameters():
        if p.requires_grad:
            groups[owner.get(id(p), "base")].append(p)
    return [
        {"params": ps, "lr": learning_rate[name], "name": name} for name, ps in groups.items() if ps
    ]


def build_optimizer(model: nn.Module, cfg: TrainerConfig) -> torch.optim.Optimizer:
    groups = param_groups(model, cfg.learning_rate)
    if not groups:
        raise ConfigError("nothing to train: every parameter is frozen (check trainer.freeze_modules)")
    o = cfg.optimizer
    kwargs = {"fused": True} if device.supports_fused_adamw() else {"foreach": True}
    return torch.optim.AdamW(
        groups, lr=cfg.learning_rate["base"], betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay, **kwargs
    )


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainerConfig):
    from transformers import get_scheduler

    kwargs = None
    if cfg.lr_scheduler_type == "cosine_with_min_lr":
        # As the original: min_lr / base lr is one rate applied to every group, so each group
        # decays to the same fraction of its own peak.
        kwargs = {"min_lr_rate": cfg.scheduler_specific_kwargs.min_lr / cfg.learning_rate["base"]}
    return get_scheduler(
        cfg.lr_scheduler_type,
        optimizer,
        num_warmup_steps=cfg.num_warmup_steps,
        num_training_steps=cfg.max_train_steps,
        scheduler_specific_kwargs=kwargs,
    )


def schedule_position(step: int, seconds: float, max_steps: int, limit_s: float) -> float:
    """Where the LR schedule stands under ``trainer.lr_schedule_clock=train_time``, after ``step``
    optimizer updates and ``seconds`` of training: the step count, or the share of the time budget
    spent as a share of ``max_steps`` (a "virtual step") when that is further, never past
    ``max_steps``. Why: with a budget (``trainer.max_train_time_s``), a run whose steps cost more
    stops part-way along a schedule that spans ``max_steps``, its LR still high, while a run of
    cheaper steps anneals: an unfair equal-time comparison. On this position the warmup and the
    decay end at whichever bound comes first, the budget or ``max_steps``."""
    return min(float(max_steps), max(float(step), max_steps * seconds / limit_s))


def place_schedule(scheduler, position: float) -> None:
    """Set every group's LR to the schedule's value at ``position`` (fractional steps allowed:
    transformers' warmup and decay are functions of a real step). The scheduler keeps counting
    optimizer steps (its ``last_epoch``, what a resume continues from); its ``_last_lr`` is what it
    saves as the LR in use, so a checkpoint records the LR that was set here."""
    lrs = [base * f(position) for base, f in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = lrs


def group_lrs(optimizer: torch.optim.Optimizer) -> dict[str, float]:
    return {f"lr/{g.get('name', i)}": float(g["lr"]) for i, g in enumerate(optimizer.param_groups)}
