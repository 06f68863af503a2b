"""Original DiT4DiT configs (YAML + launch-script flags) -> this project's schema, in one pass.

``loader.load_config`` calls ``apply_overrides`` and ``migrate`` between reading the YAML and
typing it. Every key of the raw config is looked up in ``dit4dit_keys.TABLE``:

- ``Moved``: the same meaning under our name (the value converted where its form differs:
  comma-separated ``freeze_modules``, a named ``data_mix``, module paths), one notice each;
- ``Fixed``: something that has one value here (``framework.name: DiT4DiT``): that value is
  accepted with a notice, any other is an error saying what this project does instead;
- ``Ignored``: a key DiT4DiT itself never read: dropped with "ignored (unused in DiT4DiT too)";
- ``Removed``: a key of an earlier version of this project: an error saying where it went.

A key this project itself renamed (``RENAMED``) is read under its new name with one notice, so
configs written before keep working; giving both spellings with different values is an error.

Every other key that is not in the schema is an error, all of them in one message, with a
"did you mean" only when one valid key is really close. The learning-rate table takes dotted
module paths as keys in YAML and on the command line alike (``--trainer.learning_rate.backbone.
transformer 2e-5``); DiT4DiT's module paths are renamed to ours (``module_path``), which is also
the renaming the checkpoint import uses (``dit4dit_npu/convert``).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

from dit4dit_npu.config.dit4dit_keys import (
    FROZEN_HERE,
    IGNORED_IN_ORIGINAL,
    SAME,
    TABLE,
    UNUSED,
    Fixed,
    Ignored,
    MigrationError,
    Moved,
    Removed,
    module_path,
)
from dit4dit_npu.config.original_data import NAMED_MIXTURES, ROBOT_TYPES
from dit4dit_npu.config.schema import Config

__all__ = ["RENAMED", "TABLE", "MigrationError", "Removed", "apply_overrides", "migrate", "module_path"]

# Keys of this project that moved: old spelling -> new. Not DiT4DiT's (``dit4dit_keys.TABLE``), so
# an old spelling does not make a config look like a DiT4DiT one.
RENAMED = {
    # training-only augmentation: the trainer's, not the model's (nor the policy folder's)
    "framework.action_model.state_noise_std": "trainer.state_noise_std",
}


# --------------------------------------------------------------------------------------------
# Schema walking
# --------------------------------------------------------------------------------------------


def _schema_field(path: str) -> Any:
    """The schema type at a dotted path; None if there is no such field."""
    tp: Any = Config
    for part in path.split("."):
        if not dataclasses.is_dataclass(tp):
            return None
        hints = typing.get_type_hints(tp)
        if part not in hints:
            return None
        tp = hints[part]
    return tp


def _is_section(tp: Any) -> bool:
    return dataclasses.is_dataclass(tp)


def _is_mapping(tp: Any) -> bool:
    """A dict-typed leaf (learning_rate, val_episodes): keys are names, not schema."""
    union = typing.get_origin(tp) in (typing.Union, types.UnionType)  # dict | None; a bare dict[K, V] is not one
    args = [a for a in typing.get_args(tp) if a is not type(None)] if union else [tp]
    return any(typing.get_origin(a) is dict for a in args)


def _leaf_paths(tp: Any = Config, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(tp):
        sub = typing.get_type_hints(tp)[f.name]
        path = prefix + f.name
        out.extend(_leaf_paths(sub, path + ".") if _is_section(sub) else [path])
    return out


def _flatten(d: dict[str, Any], prefix: str, out: list[tuple[str, Any]]) -> None:
    for k, v in d.items():
        path = f"{prefix}{k}"
        tp = _schema_field(path)
        if (v is None or v == {}) and tp is not None and _is_section(tp):
            continue  # a section with every key commented out (YAML null) or `{}`: nothing to set
        if isinstance(v, dict) and v and (tp is None or _is_section(tp)) and path not in TABLE:
            _flatten(v, path + ".", out)
        else:
            out.append((path, v))


def _set(d: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    for part in parts[:-1]:
        if not isinstance(d.get(part), dict):
            d[part] = {}
        d = d[part]
    d[parts[-1]] = value


def _flat_names(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{backbone: {transformer: 1e-5}} -> {"backbone.transformer": 1e-5} (dotted module names)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        out.update(_flat_names(v, name + ".") if isinstance(v, dict) else {name: v})
    return out


def apply_overrides(raw: dict[str, Any], pairs: list[tuple[str, Any]]) -> None:
    """Set each ``a.b.c = value`` in ``raw``. Below a name-keyed mapping (the learning-rate
    table) the rest of the path is one dotted key, so module paths work on the command line."""
    for key, value in pairs:
        parts = key.split(".")
        for i in range(1, len(parts)):
            head = ".".join(parts[:i])
            if _is_mapping(_schema_field(head)) or head in ("trainer.learning_rate",):
                node = raw
                for part in parts[:i]:
                    if not isinstance(node.get(part), dict):
                        node[part] = {}
                    node = node[part]
                node[".".join(parts[i:])] = value
                break
        else:
            _set(raw, key, value)


# --------------------------------------------------------------------------------------------
# The migration
# --------------------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if isinstance(v, list) and v and all(isinstance(e, dict) and "path" in e for e in v):  # a data_mix
        names = ", ".join(str(e["path"]) for e in v[:2]) + (", ..." if len(v) > 2 else "")
        return f"{len(v)} datasets ({names})"
    return repr(v) if isinstance(v, str) else str(v)


def _hint(path: str, valid: list[str]) -> str:
    """A "did you mean" only for a really close key of the same section."""
    parent = path.rpartition(".")[0]
    same = [p for p in valid if p.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(path, same, n=1, cutoff=0.85)
    return f" (did you mean {close[0]}?)" if close else ""


def _is_original(flat: list[tuple[str, Any]]) -> bool:
    """A DiT4DiT config: it has a key only DiT4DiT configs have."""
    return any(p in TABLE and p not in SAME and not isinstance(TABLE[p], Removed) for p, _ in flat)


def migrate(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """-> (raw config in our schema, notices: one line per change). Raises MigrationError
    (one line) for removed keys, unsupported values and unknown keys (all of them at once)."""
    flat: list[tuple[str, Any]] = []
    _flatten(raw, "", flat)
    original = _is_original(flat)
    valid = _leaf_paths()
    notices: list[str] = []
    unknown: list[str] = []
    ours: dict[str, Any] = {}
    moved: list[tuple[str, str, Any]] = []  # (from, to, value)
    fixed: dict[str, Any] = {}
    renamed = {RENAMED[p]: (p, v) for p, v in flat if p in RENAMED}
    for path, value in flat:
        rule = TABLE.get(path)
        if path in RENAMED:
            continue  # below, once the new spelling's own value is known
        if original and path in IGNORED_IN_ORIGINAL:
            notices.append(f"{path}: ignored ({UNUSED}: {IGNORED_IN_ORIGINAL[path]})")
        elif isinstance(rule, Removed):
            raise MigrationError(f"config key {path!r} was removed: {rule.where}")
        elif isinstance(rule, Ignored):
            notices.append(f"{path}: ignored ({UNUSED}{': ' + rule.note if rule.note else ''})")
        elif isinstance(rule, Fixed):
            if rule.values is not None and value not in rule.values:
                raise MigrationError(
                    f"{path}: {_fmt(value)} is not supported ({rule.note}; DiT4DiT configs have "
                    f"{' or '.join(_fmt(v) for v in rule.values)})"
                )
            fixed[path] = value
            notices.append(f"{path}: {_fmt(value)} dropped ({rule.note})")
        elif isinstance(rule, Moved):
            converted = rule.convert(value) if rule.convert else value
            moved.append((path, rule.to, converted))
            if path not in SAME or converted != value:
                note = f" ({rule.note})" if rule.note else ""
                notices.append(f"{path}: {_fmt(value)} -> {rule.to}: {_fmt(converted)}{note}")
        elif _schema_field(path) is not None and not _is_section(_schema_field(path)):
            ours[path] = value
        else:
            unknown.append(path)
    for dst, (src, value) in renamed.items():
        if dst in ours and ours[dst] != value:
            raise MigrationError(f"{src} ({_fmt(value)}) and {dst} ({_fmt(ours[dst])}) differ: give only {dst}")
        ours[dst] = value
        notices.append(f"{src}: moved to {dst} (a training-only setting; read as {dst}: {_fmt(value)})")
    if unknown:
        listed = ", ".join(f"{p!r}{_hint(p, valid)}" for p in unknown)
        raise MigrationError(
            f"unknown config key{'s' if len(unknown) > 1 else ''} {listed}; docs/from_dit4dit.md "
            "maps DiT4DiT's keys"
        )
    for src, dst, value in moved:
        if ours.get(dst) is not None and src != dst and ours[dst] != value:
            if dst.startswith("datasets.vla_data.max_"):
                raise MigrationError(
                    f"{src} ({_fmt(value)}) and {dst} ({_fmt(ours[dst])}) differ; DiT4DiT needs them equal"
                )
            if dst == "framework.action_model.chunk_length":  # one number, stated twice: refuse, as a renamed key
                raise MigrationError(
                    f"{src} ({_fmt(value)} as a chunk length) and {dst} ({_fmt(ours[dst])}) differ: give only {dst}"
                )
            notices.append(f"{dst}: {_fmt(value)} from {src} replaces {_fmt(ours[dst])}")
        ours[dst] = value
    horizon = fixed.get("framework.action_model.action_horizon")
    chunk = ours.get("framework.action_model.chunk_length", 8)
    # a non-int chunk is the schema's to report (with its key and type); only ints are compared
    if horizon is not None and isinstance(chunk, int) and not isinstance(chunk, bool):
        if not isinstance(horizon, int) or isinstance(horizon, bool):
            raise MigrationError(
                f"framework.action_model.action_horizon: got {_fmt(horizon)}, expected int "
                f"(future_action_window_size + 1 = {chunk})"
            )
        if horizon != chunk:
            raise MigrationError(
                f"framework.action_model.action_horizon ({horizon}) != future_action_window_size + 1 ({chunk}): "
                "DiT4DiT draws action_horizon steps of noise but predicts future_action_window_size + 1"
            )
    _migrate_learning_rates(ours, notices, original)
    _migrate_freeze(ours, notices)
    _data_keys_for_mixture(raw, ours, notices)
    out: dict[str, Any] = {}
    for path, value in ours.items():
        _set(out, path, value)
    return out, notices


def _migrate_learning_rates(ours: dict[str, Any], notices: list[str], original: bool) -> None:
    key = "trainer.learning_rate"
    table = ours.get(key)
    if not isinstance(table, dict):
        return
    flat = _flat_names(table)
    if original and "base" not in flat:
        flat["base"] = 1e-4
        notices.append(f"{key}.base: 0.0001 (DiT4DiT's default for parameters no other key names)")
    out: dict[str, Any] = {}
    renamed: dict[str, tuple[str, Any]] = {}
    for name, lr in flat.items():
        target = "base" if name == "base" else module_path(name)
        if target is None:
            notices.append(f"{key}.{name}: {_fmt(lr)} dropped ({_frozen_reason(name)})")
        elif target == name:
            out[name] = lr
        else:
            renamed[target] = (name, lr)
    for target, (name, lr) in renamed.items():
        if target in out and out[target] != lr:
            notices.append(f"{key}.{name}: {_fmt(lr)} -> {target}, which is given as {_fmt(out[target])}: that wins")
            continue
        out[target] = lr
        notices.append(f"{key}.{name}: {_fmt(lr)} -> {key}.{target}")
    ours[key] = out


def _migrate_freeze(ours: dict[str, Any], notices: list[str]) -> None:
    key = "trainer.freeze_modules"
    paths = ours.get(key)
    if not isinstance(paths, list):
        return
    out = []
    for p in paths:
        target = module_path(str(p))
        if target is None:
            notices.append(f"{key}: {p} dropped ({_frozen_reason(str(p))})")
        else:
            if target != p:
                notices.append(f"{key}: {p} -> {target}")
            out.append(target)
    ours[key] = list(dict.fromkeys(out))


def _frozen_reason(path: str) -> str:
    return next(r for p, r in FROZEN_HERE.items() if path == p or path.startswith(p + "."))


def _data_keys_for_mixture(raw: dict[str, Any], ours: dict[str, Any], notices: list[str]) -> None:
    """A named mixture also says which robot it is: its cameras and state encoding, unless set."""
    datasets = raw.get("datasets")
    vla = datasets.get("vla_data") if isinstance(datasets, dict) else None  # null when left empty
    name = vla.get("data_mix") if isinstance(vla, dict) else None
    if not isinstance(name, str) or name not in NAMED_MIXTURES:
        return
    robot = ROBOT_TYPES[NAMED_MIXTURES[name][0]]
    for key, value in robot.data_keys.items():
        path = f"datasets.vla_data.{key}"
        if path not in ours:
            ours[path] = value
            notices.append(f"{path}: {_fmt(value)} (the cameras/encoding of DiT4DiT's {name!r} robot type)")
