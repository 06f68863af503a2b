"""Run config -> the model-local records the modules take (``models/configs.py``).

The one place that knows both sides: the run config owns keys, defaults and checks
(``config/framework.py``); a module takes a plain record. A record's field is copied from the
run-config key of the same name unless resolved here, so a field added to a record without a key
of that name fails at the first build (tests/test_models_build.py), not silently.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from dit4dit_npu.config import (
    ActionModelConfig,
    Config,
    Cosmos25Config,
    FlowMatchingConfig,
    FrameworkConfig,
    LoraAdapterConfig,
    TinyCosmosConfig,
)
from dit4dit_npu.models.configs import (
    BackboneConfig,
    DiT4DiTConfig,
    DiTBodyConfig,
    HeadConfig,
    LoraConfig,
    TinySizes,
    VideoTimeConfig,
)

R = TypeVar("R")


def _by_name(record: type[R], section: Any, **resolved: Any) -> R:
    """``record`` with each field from ``resolved`` or, failing that, ``section``'s same-named key."""
    return record(**{
        f.name: resolved[f.name] if f.name in resolved else getattr(section, f.name)
        for f in dataclasses.fields(record)  # type: ignore[arg-type]
    })


def backbone_config(c: Cosmos25Config) -> BackboneConfig:
    """``framework.cosmos25`` -> ``CosmosBackbone``'s record."""
    return _by_name(BackboneConfig, c, flow_matching=video_time(c.flow_matching))


def video_time(fm: FlowMatchingConfig) -> VideoTimeConfig:
    return _by_name(VideoTimeConfig, fm)


def head_config(
    a: ActionModelConfig, state_noise_std: float | list[float] = 0.0, condition_on_noise_level: bool = False
) -> HeadConfig:
    """``framework.action_model`` (+ ``trainer.state_noise_std``, training only, and
    ``framework.cosmos25.one_pass.condition_head_on_noise_level``) -> the head's record, the DiT
    sizes resolved from the ``action_model_type`` preset."""
    return _by_name(
        HeadConfig, a, dim=a.dim, num_heads=a.num_heads, head_dim=a.head_dim, chunk_length=a.chunk_length,
        state_noise_std=state_noise_std, condition_on_noise_level=condition_on_noise_level,
        diffusion_model_cfg=_by_name(DiTBodyConfig, a.diffusion_model_cfg),
    )


def run_head_config(cfg: Config) -> HeadConfig:
    """The head's record for a run (its state noise from the trainer section)."""
    one_pass = cfg.framework.cosmos25.one_pass
    return head_config(cfg.framework.action_model, cfg.trainer.state_noise_std, one_pass.condition_head_on_noise_level)


def dit4dit_config(f: FrameworkConfig) -> DiT4DiTConfig:
    p = f.cosmos25.one_pass
    return _by_name(DiT4DiTConfig, f.cosmos25, one_pass=p.enabled, inference_noise_share=p.inference_noise_share)


def lora_adapter_config(lo: LoraAdapterConfig) -> LoraConfig:
    return _by_name(LoraConfig, lo, alpha=lo.scale_alpha)


def tiny_sizes(t: TinyCosmosConfig) -> TinySizes:
    return _by_name(TinySizes, t)
