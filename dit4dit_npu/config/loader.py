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
from dit4dit_npu.errors import ConfigError, require
from dit4dit_npu.files import atomic_write_text

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
            log.warning("config migrated:\n  %s", "\n  ".join(notices))
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
    """Refuse at load a value that would fail (or silently misbehave) hours into a run, naming
    the key. Each section checks its own keys where it is declared (``check``); what is left here
    relates keys of different sections."""
    cfg.framework.check("framework")
    cfg.datasets.check("datasets")
    cfg.trainer.check("trainer")
    d, c = cfg.datasets.vla_data, cfg.framework.cosmos25
    require(
        d.latent_cache is None or c.condition_latent == "mean", "datasets.vla_data.latent_cache", d.latent_cache,
        "null with framework.cosmos25.condition_latent='sample' (a latent cache stores posterior means)",
    )
    # 'video' trains the backbone by the video loss alone, on the frames after the observation: a
    # one-frame clip has none, so its loss has no graph and backward would fail at the first step.
    require(
        c.training != "video" or len(d.clip_offsets) > 1, "datasets.vla_data.video_delta_indices", d.video_delta_indices,
        "future frames after 0 with framework.cosmos25.training='video' (e.g. [0, 4, 8, 12, 16]; every "
        "action_video_freq_ratio-th is kept)",
    )
    # Options of the joint step that need its video loss, hence a future frame.
    require(
        cfg.trainer.video_loss_interval == 1 or c.training == "joint", "trainer.video_loss_interval",
        cfg.trainer.video_loss_interval, "1 unless framework.cosmos25.training is 'joint' (the steps it skips "
        "would train nothing in 'video' mode; 'action' mode has no video loss)",
    )
    require(
        cfg.trainer.video_loss_span == [0.0, 1.0] or c.training == "joint", "trainer.video_loss_span",
        cfg.trainer.video_loss_span, "[0, 1] unless framework.cosmos25.training is 'joint' (only a joint step can "
        "skip its video loss)",
    )
    if c.one_pass.enabled or cfg.trainer.video_loss_interval > 1 or cfg.trainer.video_loss_span != [0.0, 1.0]:
        require(
            len(d.clip_offsets) > 1, "datasets.vla_data.video_delta_indices", d.video_delta_indices,
            "future frames after 0 with framework.cosmos25.one_pass.enabled, trainer.video_loss_interval > 1 or "
            "trainer.video_loss_span other than [0, 1] (all are options of the video loss, which needs a frame to predict)",
        )


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def save_config(cfg: Config, path: str | Path) -> None:
    atomic_write_text(path, dump_yaml(cfg))
