"""Original DiT4DiT configs (YAML + launch-script flags) -> this project's schema, in one pass.

``loader.load_config`` calls ``apply_overrides`` and ``migrate`` between reading the YAML and
typing it. Every key of the raw config is looked up in ``TABLE``:

- ``Moved``: the same meaning under our name (the value converted where its form differs:
  comma-separated ``freeze_modules``, a named ``data_mix``, module paths), one notice each;
- ``Fixed``: something that has one value here (``framework.name: DiT4DiT``): that value is
  accepted with a notice, any other is an error saying what this project does instead;
- ``Ignored``: a key DiT4DiT itself never read: dropped with "ignored (unused in DiT4DiT too)";
- ``Removed``: a key of an earlier version of this project: an error saying where it went.

Every other key that is not in the schema is an error, all of them in one message, with a
"did you mean" only when one valid key is really close. The learning-rate table takes dotted
module paths as keys in YAML and on the command line alike (``--trainer.learning_rate.backbone.
transformer 2e-5``); DiT4DiT's module paths are renamed to ours (``module_path``), which is also
the renaming the checkpoint import uses (``dit4dit_npu/convert``).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dit4dit_npu.config.original_data import NAMED_MIXTURES, ROBOT_TYPES
from dit4dit_npu.config.schema import Config


class MigrationError(ValueError):
    """Raised as the loader's ConfigError (a subclass of ValueError there)."""


@dataclass(frozen=True)
class Moved:
    to: str
    convert: Callable[[Any], Any] | None = None
    note: str = ""


@dataclass(frozen=True)
class Fixed:
    values: tuple[Any, ...]
    note: str


@dataclass(frozen=True)
class Ignored:
    note: str = ""


@dataclass(frozen=True)
class Removed:
    where: str


# --------------------------------------------------------------------------------------------
# Module paths: DiT4DiT's model tree -> ours (learning rates, freeze_modules, checkpoint keys)
# --------------------------------------------------------------------------------------------

FROZEN_HERE = {
    "backbone_interface.extractor.text_encoder": "the text encoder is not part of the trained model here "
    "(prompt embeddings are computed once and cached)",
    "backbone_interface.extractor.vae": "the VAE is always frozen here",
}
# (pattern, replacement) on dotted paths, applied in order; the action-head names differ only in
# how the same layers are named (layerN / transformer_blocks / timestep_encoder wrapper).
MODULE_RENAMES: list[tuple[str, str]] = [
    (r"^backbone_interface(\.extractor)?(\.transformer)?(?=\.|$)", "backbone.transformer"),
    (r"^action_model\.model\.timestep_encoder(\.timestep_embedder)?(?=\.|$)", "action_model.model.timestep_embedder"),
    (r"^action_model\.model\.transformer_blocks(?=\.|$)", "action_model.model.blocks"),
    (r"^action_model\.(state_encoder|action_decoder)\.layer1(?=\.|$)", r"action_model.\1.0"),
    (r"^action_model\.(state_encoder|action_decoder)\.layer2(?=\.|$)", r"action_model.\1.2"),
    (r"^action_model\.action_encoder\.layer([123])(?=\.|$)", r"action_model.action_encoder.W\1"),
]


def module_path(path: str) -> str | None:
    """A DiT4DiT module (or parameter) path -> ours; None for the parts frozen/absent here
    (``FROZEN_HERE``). Paths that are already ours come back unchanged."""
    if any(path == p or path.startswith(p + ".") for p in FROZEN_HERE):
        return None
    for pattern, repl in MODULE_RENAMES:
        path = re.sub(pattern, repl, path)
    return path


# --------------------------------------------------------------------------------------------
# Value conversions
# --------------------------------------------------------------------------------------------


def _freeze_list(value: Any) -> list[str]:
    """DiT4DiT: one comma-separated string (a non-string meant "nothing")."""
    if isinstance(value, list):
        items = [str(v) for v in value]
    elif isinstance(value, str):
        items = [p.strip() for p in value.split(",") if p.strip()]
    else:
        items = []
    return items


def _mixture(value: Any) -> Any:
    if not isinstance(value, str):
        return value  # already a list of {path, weight}: ours
    if value not in NAMED_MIXTURES:
        raise MigrationError(
            f"datasets.vla_data.data_mix: {value!r} is not a DiT4DiT mixture this project knows "
            f"({', '.join(sorted(NAMED_MIXTURES))}); list the datasets instead, e.g. "
            "[{path: <folder under data_root_dir>, weight: 1.0}, ...]"
        )
    return [{"path": p, "weight": w} for p, w in NAMED_MIXTURES[value][1]]


def _dtype_to_precision(value: Any) -> str:
    if str(value) in ("float32", "torch.float32", "fp32"):
        return "no"
    if str(value) in ("bfloat16", "torch.bfloat16", "bf16"):
        return "bf16"
    raise MigrationError(f"framework.cosmos25.torch_dtype: got {value!r}, expected bfloat16 or float32")


_UNUSED = "unused in DiT4DiT too"
_REFERENCE = "the reference-faithful paths are built in bench/reference.py, not switched on in the model"

TABLE: dict[str, Moved | Fixed | Ignored | Removed] = {
    # ---- top level
    "is_debug": Ignored(),
    "output_dir": Ignored("set at run time there; the run folder here is run_root_dir/run_id"),
    # ---- framework
    "framework.name": Fixed(("DiT4DiT",), "the framework is always DiT4DiT"),
    "framework.cosmos25.future_loss_type": Fixed(("flow_matching",), "the video loss is always latent flow matching"),
    "framework.cosmos25.future_num_inference_steps": Ignored("no effect with flow_matching"),
    "framework.cosmos25.attn_implementation": Ignored("framework.cosmos25.attention_backend chooses here"),
    "framework.cosmos25.vl_hidden_dim": Fixed(None, "read from the Cosmos transformer's config here"),
    "framework.cosmos25.model_id_or_path": Moved("framework.cosmos25.base_model", note="it took precedence there"),
    "framework.cosmos25.torch_dtype": Moved("trainer.mixed_precision", _dtype_to_precision),
    "framework.cosmos25.revision": Ignored("a local folder is loaded as it is"),
    "framework.cosmos25.local_files_only": Fixed((True,), "nothing is ever downloaded"),
    "framework.cosmos25.trainable": Ignored(),
    "framework.cosmos25.device": Ignored("device.py places the model"),
    "framework.cosmos25.view_layout": Removed("moved to datasets.vla_data.view_layout"),
    "framework.cosmos25.reference_text_encoder_per_step": Removed(_REFERENCE),
    "framework.cosmos25.reference_full_depth_feature_pass": Removed(_REFERENCE),
    "framework.cosmos25.reference_separate_condition_encode": Removed(_REFERENCE),
    "framework.action_model.action_dim": Moved(
        "datasets.vla_data.max_action_dim", note="the head's width is the padded action width"
    ),
    "framework.action_model.state_dim": Moved(
        "datasets.vla_data.max_state_dim", note="the head's width is the padded encoded-state width"
    ),
    "framework.action_model.action_horizon": Fixed(None, "the chunk is future_action_window_size + 1 here"),
    "framework.action_model.past_action_window_size": Ignored(),
    "framework.action_model.num_target_vision_tokens": Ignored(),
    "framework.action_model.diffusion_model_cfg.cross_attention_dim": Fixed(
        None, "the head reads the Cosmos transformer's width here"
    ),
    "framework.action_model.diffusion_model_cfg.norm_type": Fixed(("ada_norm",), "the head's norm is always ada_norm"),
    "framework.action_model.diffusion_model_cfg.positional_embeddings": Fixed(
        (None,), "the DiT blocks never add positional embeddings here"
    ),
    "framework.action_model.diffusion_model_cfg.input_embedding_dim": Moved("framework.action_model.input_embedding_dim"),
    # ---- datasets
    "datasets.vla_data.dataset_py": Fixed(("lerobot_datasets",), "LeRobot folders are the only format"),
    "datasets.vla_data.video_backend": Fixed(
        ("decord", "torchvision_av", "av", "pyav"), "videos are always decoded with PyAV here"
    ),
    "datasets.vla_data.lerobot_version": Ignored("each dataset's version is read from its meta/info.json here"),
    "datasets.vla_data.include_state": Ignored(),
    "datasets.vla_data.action_type": Ignored(),
    "datasets.vla_data.default_image_resolution": Ignored(),
    "datasets.vla_data.load_all_data_for_training": Ignored(),
    "datasets.vla_data.obs": Ignored(),
    "datasets.vla_data.delete_pause_frame": Ignored(),
    "datasets.vla_data.data_mix": Moved("datasets.vla_data.data_mix", _mixture),
    # ---- trainer
    "trainer.epochs": Ignored("trainer.max_train_steps ends training"),
    "trainer.repeated_diffusion_steps": Moved("framework.action_model.repeated_diffusion_steps"),
    "trainer.max_grad_norm": Ignored("it clipped with trainer.gradient_clipping"),
    "trainer.warmup_ratio": Ignored("trainer.num_warmup_steps sets the warmup"),
    "trainer.weight_decay": Ignored("trainer.optimizer.weight_decay is AdamW's"),
    "trainer.optimizer.name": Fixed(("AdamW", "adamw"), "AdamW is the only optimizer"),
    "trainer.is_resume": Fixed((False,), "set trainer.resume: auto (or a checkpoint folder) to resume"),
    "trainer.resume_epoch": Ignored(),
    "trainer.resume_step": Ignored(),
    "trainer.enable_mixed_precision_training": Ignored("trainer.mixed_precision sets it here"),
    "trainer.pretrained_checkpoint": Fixed(
        (None, ""), "import a DiT4DiT checkpoint with `python -m dit4dit_npu.convert dit4dit`"
    ),
    "trainer.reload_modules": Fixed((None, ""), "import a DiT4DiT checkpoint with `python -m dit4dit_npu.convert dit4dit`"),
    "trainer.framework.cosmos25.conditional_frame_timestep": Ignored(
        "the launch scripts' path is wrong; the key is framework.cosmos25.conditional_frame_timestep"
    ),
    "trainer.freeze_modules": Moved("trainer.freeze_modules", _freeze_list),
}
# Our keys that DiT4DiT had too but never read: in a DiT4DiT config they keep that meaning.
IGNORED_IN_ORIGINAL = {
    "framework.action_model.repeated_diffusion_steps": "it used trainer.repeated_diffusion_steps",
}
# Keys ours and DiT4DiT's share, with the same meaning: no notice.
SAME = {"datasets.vla_data.data_mix", "trainer.freeze_modules"}


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
    args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
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
    for path, value in flat:
        rule = TABLE.get(path)
        if original and path in IGNORED_IN_ORIGINAL:
            notices.append(f"{path}: ignored ({_UNUSED}: {IGNORED_IN_ORIGINAL[path]})")
        elif isinstance(rule, Removed):
            raise MigrationError(f"config key {path!r} was removed: {rule.where}")
        elif isinstance(rule, Ignored):
            notices.append(f"{path}: ignored ({_UNUSED}{': ' + rule.note if rule.note else ''})")
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
    if unknown:
        listed = ", ".join(f"{p!r}{_hint(p, valid)}" for p in unknown)
        raise MigrationError(
            f"unknown config key{'s' if len(unknown) > 1 else ''} {listed}; the README section "
            "'Coming from DiT4DiT' maps DiT4DiT's keys"
        )
    for src, dst, value in moved:
        if ours.get(dst) is not None and src != dst and ours[dst] != value:
            if dst.startswith("datasets.vla_data.max_"):
                raise MigrationError(
                    f"{src} ({_fmt(value)}) and {dst} ({_fmt(ours[dst])}) differ; DiT4DiT needs them equal"
                )
            notices.append(f"{dst}: {_fmt(value)} from {src} replaces {_fmt(ours[dst])}")
        ours[dst] = value
    horizon = fixed.get("framework.action_model.action_horizon")
    fws = ours.get("framework.action_model.future_action_window_size", 7)
    if horizon is not None and horizon != fws + 1:
        raise MigrationError(
            f"framework.action_model.action_horizon ({horizon}) != future_action_window_size + 1 ({fws + 1}): "
            "DiT4DiT draws action_horizon steps of noise but predicts future_action_window_size + 1"
        )
    _migrate_learning_rates(ours, notices)
    _migrate_freeze(ours, notices)
    _data_keys_for_mixture(raw, ours, notices)
    out: dict[str, Any] = {}
    for path, value in ours.items():
        _set(out, path, value)
    return out, notices


def _migrate_learning_rates(ours: dict[str, Any], notices: list[str]) -> None:
    key = "trainer.learning_rate"
    table = ours.get(key)
    if not isinstance(table, dict):
        return
    flat = _flat_names(table)
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
    name = raw.get("datasets", {}).get("vla_data", {}).get("data_mix") if isinstance(raw.get("datasets"), dict) else None
    if not isinstance(name, str) or name not in NAMED_MIXTURES:
        return
    robot = ROBOT_TYPES[NAMED_MIXTURES[name][0]]
    for key, value in robot.data_keys.items():
        path = f"datasets.vla_data.{key}"
        if path not in ours:
            ours[path] = value
            notices.append(f"{path}: {_fmt(value)} (the cameras/encoding of DiT4DiT's {name!r} robot type)")
