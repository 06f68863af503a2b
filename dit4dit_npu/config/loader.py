"""Loading a run config: YAML file + dotted overrides -> a validated ``Config``, with clear errors.

    cfg = load_config("configs/robotwin/dit4dit_robotwin.yaml", ["trainer.max_train_steps=10"])

Overrides come as `a.b=c` or DiT4DiT's `--a.b c`; values are parsed as YAML scalars/lists. An
unknown key fails with the closest valid name; a wrong type names the key, the value and the
expected type (``ConfigError``: one line, no traceback needed).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml

from dit4dit_npu.config import migrate
from dit4dit_npu.config.schema import Config


class ConfigError(ValueError):
    """A config problem with a one-line, user-facing message (no traceback needed)."""


# Keys earlier versions had: an old config fails on them with where the concept went (the table
# is part of the DiT4DiT migration table, dit4dit_keys.TABLE).
REMOVED_KEYS = {k: r.where for k, r in migrate.TABLE.items() if isinstance(r, migrate.Removed)}
log = logging.getLogger(__name__)


def load_config(
    path: str | Path | None,
    overrides: list[str] | None = None,
    on_notices: Callable[[list[str]], None] | None = None,
) -> Config:
    """YAML file (or defaults when None) + overrides -> validated Config.

    An original DiT4DiT config (and its launch-script flags) is migrated on the way
    (``migrate.py``); ``on_notices`` gets the list of what changed (default: one log warning)."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = read_yaml(path)
    raw = migrated(raw, parse_overrides(overrides or []), on_notices)
    cfg = from_dict(Config, raw)
    validate(cfg)
    return cfg


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"malformed YAML in {p}{where}: {getattr(e, 'problem', e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def parse_overrides(args: list[str]) -> list[tuple[str, Any]]:
    """`a.b=c` and `--a.b c` / `--a.b=c` -> [(key, yaml-parsed value)]."""
    out: list[tuple[str, Any]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            body = arg[2:]
            if "=" in body:
                key, text = body.split("=", 1)
            else:
                if i + 1 >= len(args):
                    raise ConfigError(f"override {arg} has no value (use --{body} VALUE or {body}=VALUE)")
                key, text = body, args[i + 1]
                i += 1
        elif "=" in arg:
            key, text = arg.split("=", 1)
        else:
            raise ConfigError(f"cannot parse override {arg!r}: expected key=value or --key value")
        try:
            value = yaml.safe_load(text) if text != "" else ""
        except yaml.YAMLError:
            value = text
        out.append((key.strip(), value))
        i += 1
    return out


def migrated(
    raw: dict[str, Any], overrides: list[tuple[str, Any]], on_notices: Callable[[list[str]], None] | None = None
) -> dict[str, Any]:
    """The migration hook: overrides applied, DiT4DiT keys mapped to ours, unknown keys refused."""
    try:
        migrate.apply_overrides(raw, overrides)
        raw, notices = migrate.migrate(raw)
    except migrate.MigrationError as e:
        raise ConfigError(str(e)) from None
    if notices:
        if on_notices is None:
            log.warning("DiT4DiT config migrated:\n  %s", "\n  ".join(notices))
        else:
            on_notices(notices)
    return raw


def from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass `cls` from a nested dict, rejecting unknown keys and wrong types."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in fields:
            if full in REMOVED_KEYS:
                raise ConfigError(f"config key {full!r} was removed: {REMOVED_KEYS[full]}")
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean {prefix}{close[0]}?" if close else f"; valid keys: {', '.join(fields)}"
            raise ConfigError(f"unknown config key {full!r}{hint}")
        kwargs[key] = _coerce(hints[key], value, full)
    return cls(**kwargs)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, prefix=key + ".")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(a, value, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: got {value!r}, expected {_type_name(tp)}")
    if origin is Literal:
        if isinstance(value, bool) and ("yes" if value else "no") in args:
            value = "yes" if value else "no"  # YAML 1.1 reads a bare no/yes as a bool
        if value not in args:
            raise ConfigError(f"{key}: got {value!r}, expected one of {list(args)}")
        return value
    if origin is list:
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: got {value!r}, expected a list of {_type_name(args[0])}")
        return [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: got {value!r}, expected a mapping of {_type_name(args[1])}")
        return {str(k): _coerce(args[1], v, f"{key}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: got {value!r}, expected bool (true/false)")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: got {value!r}, expected int")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: got {value!r}, expected float")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: got {value!r}, expected str")
    raise ConfigError(f"{key}: unsupported config type {tp}")


def validate(cfg: Config) -> None:
    """Cross-field and range checks that the type system cannot express: a value that would fail
    (or silently misbehave) hours into a run is refused at load, naming the key."""
    c = cfg.framework.cosmos25
    a = cfg.framework.action_model
    d = cfg.datasets.vla_data
    t = cfg.trainer

    def need(ok: bool, key: str, value: Any, expected: str) -> None:
        if not ok:
            raise ConfigError(f"{key}: got {value!r}, expected {expected}")

    def finite(x: float) -> bool:
        return x == x and x not in (float("inf"), float("-inf"))

    need(c.extract_layer >= 0, "framework.cosmos25.extract_layer", c.extract_layer, ">= 0")
    need(c.max_sequence_length >= 1, "framework.cosmos25.max_sequence_length", c.max_sequence_length, ">= 1")
    need(
        finite(c.conditional_frame_timestep) and 0 <= c.conditional_frame_timestep < 1,
        "framework.cosmos25.conditional_frame_timestep", c.conditional_frame_timestep, "in [0, 1)",
    )
    for key in ("max_state_dim", "max_action_dim"):
        if getattr(d, key) is not None and getattr(d, key) < 1:
            raise ConfigError(f"datasets.vla_data.{key}: got {getattr(d, key)}, expected >= 1 or null")
    if not d.video_delta_indices or d.video_delta_indices[0] != 0:
        raise ConfigError("datasets.vla_data.video_delta_indices: must start with 0 (the conditioning frame)")
    need(
        all(b > a_ for a_, b in zip(d.video_delta_indices, d.video_delta_indices[1:])),
        "datasets.vla_data.video_delta_indices", d.video_delta_indices, "strictly increasing frame offsets",
    )
    need(
        d.latent_cache is None or c.condition_latent == "mean", "datasets.vla_data.latent_cache", d.latent_cache,
        "null with framework.cosmos25.condition_latent='sample' (a latent cache stores posterior means)",
    )
    if d.action_video_freq_ratio < 1:
        raise ConfigError("datasets.vla_data.action_video_freq_ratio: expected >= 1")
    if len(d.image_size) != 2 or min(d.image_size) <= 0:
        raise ConfigError(f"datasets.vla_data.image_size: got {d.image_size}, expected [height, width]")
    if not d.camera_keys:
        raise ConfigError("datasets.vla_data.camera_keys: expected at least one camera")
    need(len(set(d.camera_keys)) == len(d.camera_keys), "datasets.vla_data.camera_keys", d.camera_keys, "no repeats")
    if not 0.0 <= d.val_fraction < 1.0:
        raise ConfigError(f"datasets.vla_data.val_fraction: got {d.val_fraction}, expected in [0, 1)")
    need(d.per_device_batch_size >= 1, "datasets.vla_data.per_device_batch_size", d.per_device_batch_size, ">= 1")
    need(d.num_workers >= 0, "datasets.vla_data.num_workers", d.num_workers, ">= 0 (0 = load in the main process)")
    for i, e in enumerate(d.data_mix):
        need(bool(e.path), f"datasets.vla_data.data_mix[{i}].path", e.path, "a dataset folder")
        need(finite(e.weight) and e.weight > 0, f"datasets.vla_data.data_mix[{i}].weight", e.weight, "a number > 0")
    if "base" not in t.learning_rate:
        raise ConfigError("trainer.learning_rate: needs a 'base' entry")
    for name, lr in t.learning_rate.items():
        need(finite(lr) and lr > 0, f"trainer.learning_rate.{name}", lr, "a number > 0")
    min_lr = t.scheduler_specific_kwargs.min_lr
    need(finite(min_lr) and min_lr >= 0, "trainer.scheduler_specific_kwargs.min_lr", min_lr, ">= 0")
    for name, v in (
        ("max_train_steps", t.max_train_steps),
        ("save_interval", t.save_interval),
        ("eval_interval", t.eval_interval),
        ("logging_frequency", t.logging_frequency),
        ("gradient_accumulation_steps", t.gradient_accumulation_steps),
        ("keep_last_checkpoints", t.keep_last_checkpoints),
    ):
        if v < 1:
            hint = " (turn evaluation off with trainer.eval_samples=0)" if name == "eval_interval" else ""
            raise ConfigError(f"trainer.{name}: got {v}, expected >= 1{hint}")
    need(t.num_warmup_steps >= 0, "trainer.num_warmup_steps", t.num_warmup_steps, ">= 0")
    need(t.eval_samples >= 0, "trainer.eval_samples", t.eval_samples, ">= 0 (0 = no evaluation)")
    need(finite(t.gradient_clipping) and t.gradient_clipping > 0, "trainer.gradient_clipping", t.gradient_clipping, "> 0")
    fv = t.loss_scale.future_video
    need(finite(fv) and fv >= 0, "trainer.loss_scale.future_video", fv, ">= 0")
    o = t.optimizer
    need(
        len(o.betas) == 2 and all(finite(b) and 0 <= b < 1 for b in o.betas), "trainer.optimizer.betas", o.betas,
        "[beta1, beta2], each in [0, 1)",
    )
    need(finite(o.eps) and o.eps > 0, "trainer.optimizer.eps", o.eps, "> 0")
    need(finite(o.weight_decay) and o.weight_decay >= 0, "trainer.optimizer.weight_decay", o.weight_decay, ">= 0")
    for key in ("vae_latents_mean", "vae_latents_std"):
        v = getattr(c.tiny, key)
        need(v is None or (len(v) == 16 and all(finite(x) for x in v)), f"framework.cosmos25.tiny.{key}", v,
             "16 numbers (one per latent channel), or null (= the real Wan2.1 VAE's)")
    std = c.tiny.vae_latents_std
    need(std is None or all(x > 0 for x in std), "framework.cosmos25.tiny.vae_latents_std", std, "all > 0")
    lora = c.lora
    need(lora.rank >= 0, "framework.cosmos25.lora.rank", lora.rank, ">= 0 (0 = off)")
    if lora.rank > 0:
        need(lora.alpha is None or (finite(lora.alpha) and lora.alpha > 0), "framework.cosmos25.lora.alpha",
             lora.alpha, "a number > 0, or null (= rank)")
        need(finite(lora.dropout) and 0 <= lora.dropout < 1, "framework.cosmos25.lora.dropout", lora.dropout, "in [0, 1)")
        need(bool(lora.target_modules) and all(lora.target_modules), "framework.cosmos25.lora.target_modules",
             lora.target_modules, "module names of the transformer, e.g. [to_q, to_k, to_v, to_out.0]")
        need(c.training != "action", "framework.cosmos25.lora.rank", lora.rank,
             "0 with training 'action' (the transformer is frozen there; LoRA needs joint or video)")
    ema = t.ema
    if ema.decay is not None:
        need(finite(ema.decay) and 0 < ema.decay < 1, "trainer.ema.decay", ema.decay, "in (0, 1), or null (= off)")
    need(ema.start_step >= 0, "trainer.ema.start_step", ema.start_step, ">= 0")
    need(ema.update_interval >= 1, "trainer.ema.update_interval", ema.update_interval, ">= 1")
    sim = t.sim_eval
    for name, v in (("episodes", sim.episodes), ("interval", sim.interval), ("max_steps", sim.max_steps),
                    ("workers", sim.workers)):
        need(v >= 1, f"trainer.sim_eval.{name}", v, ">= 1")
    need(sim.replan is None or sim.replan >= 1, "trainer.sim_eval.replan", sim.replan, ">= 1, or null (= whole chunk)")
    need(sim.seed >= 0, "trainer.sim_eval.seed", sim.seed, ">= 0")
    need(
        sim.size is None or (len(sim.size) == 2 and all(x >= 16 and x % 2 == 0 for x in sim.size)),
        "trainer.sim_eval.size", sim.size, "[height, width], each even and >= 16, or null (= the training size)",
    )
    if a.repeated_diffusion_steps < 1:
        raise ConfigError("framework.action_model.repeated_diffusion_steps: expected >= 1")
    need(a.future_action_window_size >= 0, "framework.action_model.future_action_window_size",
         a.future_action_window_size, ">= 0 (the chunk is window + 1 steps)")
    need(a.num_inference_timesteps >= 1, "framework.action_model.num_inference_timesteps", a.num_inference_timesteps, ">= 1")
    dropout = a.diffusion_model_cfg.dropout
    need(finite(dropout) and 0 <= dropout < 1, "framework.action_model.diffusion_model_cfg.dropout", dropout, "in [0, 1)")


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(dump_yaml(cfg))
