"""An original DiT4DiT run -> a policy folder that ``DiT4DiTPolicy.from_pretrained``, ``eval`` and
``serve`` use unchanged.

    python -m dit4dit_npu.convert dit4dit --checkpoint RUN/checkpoints/steps_N_pytorch_model.pt \\
        --config RUN/config.yaml [--stats RUN/dataset_statistics.json] --base-model COSMOS_DIR --out POLICY

In order, every check before anything is built or written (one ``ConversionError`` line each):
the config (DiT4DiT's ``config.yaml``, the keys its run read) is migrated to ours
(``config/migrate.py``) with DiT4DiT's code defaults where it has no value; the statistics are
those of the config's robot type; the checkpoint is a DiT4DiT state dict whose frozen text encoder
and VAE equal the base model's. Then the model is built from the config and every trainable
tensor must land on a parameter of the same shape (none left over, none missing), and the policy
folder is written atomically with the original's conventions as options: the conditioning latent
a posterior sample, timesteps rounded to the compute dtype, unseeded feature noise (model, in
policy.json's model section); its state/action encodings and image resize (PolicyIO, in
policy_io.json).
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dit4dit_npu.config import Config, ConfigError, from_dict, migrate, parse_overrides, read_yaml, validate
from dit4dit_npu.convert.checkpoint import (
    TRANSFORMER,
    ConversionError,
    OriginalCheckpoint,
    check_frozen,
    map_trainable,
    read_checkpoint,
    step_of,
)
from dit4dit_npu.convert.conventions import KEYS, action_mask, blame, choose_robot, decide, width
from dit4dit_npu.convert.embodiment import build_policy_io, latent_clip, read_statistics

log = logging.getLogger(__name__)

_MISSING = object()

# What DiT4DiT's code used when its config had no value (its config.yaml lists only keys it read,
# and a key read with a default is not written when absent).
ORIGINAL_DEFAULTS: dict[str, Any] = {
    "framework.cosmos25.conditional_frame_timestep": 0.001,
    "framework.cosmos25.extract_layer": 19,
    "framework.cosmos25.torch_dtype": "bfloat16",
    "framework.cosmos25.max_sequence_length": 512,
    "framework.cosmos25.flow_matching.time_distribution": "logit_normal",
    "framework.cosmos25.flow_matching.high_sigma_ratio": 0.05,
    "framework.cosmos25.flow_matching.high_sigma_min": 0.98,
    "trainer.repeated_diffusion_steps": 4,
}
# Keys of the original config that describe its training data, not the model: not carried over.
DATA_ONLY = ("datasets.vla_data.data_mix", "datasets.vla_data.data_root_dir", "datasets.vla_data.image_size")


def _get(raw: dict[str, Any], path: str) -> Any:
    node: Any = raw
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _pop(raw: dict[str, Any], path: str) -> Any:
    *parents, last = path.split(".")
    node = _get(raw, ".".join(parents)) if parents else raw
    return node.pop(last, _MISSING) if isinstance(node, dict) else _MISSING


def import_config(
    raw: dict[str, Any],
    ckpt: OriginalCheckpoint,
    base_model: str,
    overrides: Sequence[str],
    notices: list[str],
    conventions: dict[str, Any] | None = None,
    config_name: str = "config.yaml",
) -> Config:
    """DiT4DiT's config.yaml -> our Config with the original's conventions switched on
    (``conventions``: datasets.vla_data values, ``conventions.decide``)."""
    raw = copy.deepcopy(raw)
    for path in DATA_ONLY:
        _pop(raw, path)
    for path, value in ORIGINAL_DEFAULTS.items():
        if _get(raw, path) is _MISSING:
            migrate.apply_overrides(raw, [(path, value)])
            notices.append(f"{path}: {value} (DiT4DiT's code default; its config has no value)")
    for path, shape_dim, tensor in (
        ("framework.action_model.state_dim", 1, "action_model.state_encoder.layer1.weight"),
        ("framework.action_model.action_dim", 1, "action_model.action_encoder.layer1.weight"),
    ):
        if _get(raw, path) is _MISSING and tensor in ckpt.trainable:
            width = int(ckpt.trainable[tensor].shape[shape_dim])
            migrate.apply_overrides(raw, [(path, width)])
            notices.append(f"{path}: {width} (from the checkpoint's {tensor})")
    pairs = parse_overrides(list(overrides))
    migrate.apply_overrides(raw, head_sizes(raw, pairs, ckpt, config_name, notices) + pairs)
    migrate.apply_overrides(raw, [(f"datasets.vla_data.{k}", v) for k, v in (conventions or {}).items()])
    raw, changed = migrate.migrate(raw)
    notices.extend(changed)
    cfg = from_dict(Config, raw)
    c, d = cfg.framework.cosmos25, cfg.datasets.vla_data
    c.base_model = str(base_model)
    # the original's model conventions (docs/from_dit4dit.md): options its checkpoints were trained
    # with, off for our own runs
    c.condition_latent = "sample"
    c.round_timesteps = True
    c.feature_noise_seed = None  # DiT4DiT drew the feature-pass noise from the global RNG
    kept = latent_clip(d.clip_offsets)
    if len(kept) < len(d.clip_offsets):
        notices.append(
            f"datasets.vla_data.video_delta_indices: the last {len(d.clip_offsets) - len(kept)} "
            "subsampled frame(s) dropped (DiT4DiT's VAE ignored frames that do not fill a latent)"
        )
        d.video_delta_indices = d.video_delta_indices[: (len(kept) - 1) * d.action_video_freq_ratio + 1]
    cfg.trainer.enable_gradient_checkpointing = False
    validate(cfg)
    check_head(cfg, ckpt, config_name)
    return cfg


# --------------------------------------------------------------------------------------------
# The action head's sizes: what the checkpoint cannot prove
# --------------------------------------------------------------------------------------------

TYPE = "framework.action_model.action_model_type"
HEADS = "framework.action_model.diffusion_model_cfg.num_attention_heads"
HEAD_DIM = "framework.action_model.diffusion_model_cfg.attention_head_dim"
WIDTH = "framework.action_model.input_embedding_dim"
ORIGINAL_PRESETS = ("DiT-B", "DiT-L")  # DiT4DiT's DiTConfig table (the same sizes as ours)
ATTENTION = "action_model.model.transformer_blocks.0.attn1.to_q.weight"  # rows: heads x head dim
ENCODER = "action_model.action_encoder.layer1.weight"  # rows: the head's width


def head_sizes(
    raw: dict[str, Any], pairs: list[tuple[str, Any]], ckpt: OriginalCheckpoint, config_name: str, notices: list[str]
) -> list[tuple[str, Any]]:
    """Head count and head dim are not in the checkpoint (2 x 32 and 4 x 16 give the same tensor
    shapes): they are the config's (merged over its DiTConfig preset, as DiT4DiT did), never an
    override's that contradicts them. A type outside its table (an entry its user added) needs them
    stated; its width is the checkpoint's. -> the settings to apply before the overrides."""
    given = dict(pairs)
    for path in (HEADS, HEAD_DIM):
        stated = _get(raw, path)
        if stated is not _MISSING and stated is not None and path in given and given[path] != stated:
            raise ConversionError(
                f"{path}: the override says {given[path]} but {config_name} states {stated}, which the run trained with "
                "(the checkpoint cannot tell head counts apart): drop the override"
            )
    kind = given.get(TYPE, _get(raw, TYPE))
    if kind is _MISSING or kind in ORIGINAL_PRESETS:
        return []
    sizes = {p: given.get(p, _get(raw, p)) for p in (HEADS, HEAD_DIM)}
    unknown = [p for p, v in sizes.items() if v is _MISSING or v is None]
    if unknown:
        raise ConversionError(
            f"{config_name}: {TYPE} {kind!r} is not in DiT4DiT's size table (DiT-B, DiT-L) and the head count and head "
            f"dim are not in the checkpoint; pass {' and '.join(p + '=N' for p in unknown)}"
        )
    extra: list[tuple[str, Any]] = [(TYPE, "DiT-B")]
    if ENCODER in ckpt.trainable and WIDTH not in given:
        extra.append((WIDTH, int(ckpt.trainable[ENCODER].shape[0])))
    notices.append(
        f"{TYPE}: {kind!r} (an entry added to DiT4DiT's size table) -> explicit sizes: {sizes[HEADS]} heads x "
        f"{sizes[HEAD_DIM]}" + (f", width {extra[1][1]} (from the checkpoint's {ENCODER})" if len(extra) > 1 else "")
    )
    return extra + [(p, v) for p, v in sizes.items()]


def check_head(cfg: Config, ckpt: OriginalCheckpoint, config_name: str) -> None:
    """The sizes the checkpoint can check: heads x head dim is its attention width."""
    a = cfg.framework.action_model
    if ATTENTION in ckpt.trainable and a.num_heads * a.head_dim != ckpt.trainable[ATTENTION].shape[0]:
        raise ConversionError(
            f"{config_name}: {a.num_heads} heads x {a.head_dim} = {a.num_heads * a.head_dim}, but the checkpoint's "
            f"attention is {ckpt.trainable[ATTENTION].shape[0]} wide ({ATTENTION}): set {HEADS} and {HEAD_DIM}"
        )


def _check_widths(raw: dict[str, Any], hidden: int, config_name: str) -> None:
    for path in ("framework.cosmos25.vl_hidden_dim", "framework.action_model.diffusion_model_cfg.cross_attention_dim"):
        value = _get(raw, path)
        if value is not _MISSING and value is not None and int(value) != hidden:
            raise ConversionError(
                f"{config_name}: {path} is {value} but the base model's transformer is {hidden} wide "
                "(a config for another base model?)"
            )


def check_out_parent(out: Path) -> None:
    """``--out`` can be made: its nearest existing ancestor is a folder (checked before anything is
    read: the export comes last, after the minutes a full-size checkpoint takes)."""
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConversionError(f"--out {out}: {parent} is a file, not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ConversionError(f"--out {out}: {parent} is not writable")
            return


def convert_dit4dit(
    checkpoint: str | Path,
    config: str | Path,
    base_model: str | Path,
    out: str | Path,
    stats: str | Path | None = None,
    robot_type: str | None = None,
    tag: str | None = None,
    conventions: dict[str, Any] | None = None,
    overrides: Sequence[str] = (),
    instructions: Sequence[str] = (),
    allow_constant_dims: bool = False,
) -> tuple[Path, list[str]]:
    """-> (the policy folder, notices of what changed or was inferred). ``conventions``:
    datasets.vla_data values (``conventions.KEYS``) that win over the robot type's. Raises
    ConversionError (nothing written). ``allow_constant_dims``: convert statistics with min == max
    on dims the policy normalizes (a joint it would always command to one value), with a notice
    instead of the refusal."""
    from dit4dit_npu.models.prompt_cache import PromptCache
    from dit4dit_npu.policy.folder import POLICY_JSON, export_policy
    from dit4dit_npu.weights import base_model_folder, build_dit4dit, build_prompt_encoder, text_identity

    checkpoint, config, out = Path(checkpoint), Path(config), Path(out)
    stats_path = Path(stats) if stats is not None else checkpoint.parent.parent / "dataset_statistics.json"
    if out.exists() and not (out.is_dir() and ((out / POLICY_JSON).is_file() or not any(out.iterdir()))):
        raise ConversionError(f"--out {out} exists and is not a policy folder: choose a new folder")
    check_out_parent(out)
    if not checkpoint.is_file():  # before the statistics, whose default path is derived from it
        raise ConversionError(f"checkpoint not found: {checkpoint}")
    notices: list[str] = []
    try:
        raw = read_yaml(config)
    except ConfigError as e:
        raise ConversionError(str(e)) from None
    if not isinstance(raw.get("framework"), dict):  # an empty file reads as {}: every value a default
        what = "is empty" if not raw else "has no 'framework' section"
        raise ConversionError(f"{config} {what}: expected the config.yaml a DiT4DiT run wrote (framework, datasets, trainer)")
    data_mix = _get(raw, "datasets.vla_data.data_mix")
    stat_tag, entry = read_statistics(stats_path, tag)
    robot = choose_robot(robot_type, data_mix if data_mix is not _MISSING else None, stat_tag, entry, stats_path,
                         notices)
    ckpt = read_checkpoint(checkpoint)
    given = dict(conventions or {})
    try:
        given |= {k.split(".")[-1]: v for k, v in parse_overrides(list(overrides))
                  if k.startswith("datasets.vla_data.") and k.split(".")[-1] in KEYS}
    except ConfigError as e:
        raise ConversionError(str(e)) from None
    dims = robot.action_dim if robot else width(entry.get("action"))
    image_size = _get(raw, "datasets.vla_data.image_size")
    chosen = decide(robot, given, action_mask(entry, dims, str(stats_path)), None if image_size is _MISSING else
                    image_size, notices)
    try:
        cfg = import_config(raw, ckpt, str(base_model), overrides, notices, chosen, config.name)
        io = build_policy_io(robot, stat_tag, entry, cfg, str(stats_path), notices, allow_constant_dims)
        base = base_model_folder(cfg)
    except (ConfigError, migrate.MigrationError) as e:
        raise ConversionError(blame(e, conventions, config)) from None
    if cfg.framework.cosmos25.training == "action":  # its transformer was frozen: a base-model part
        ckpt.frozen["transformer"] = {
            k[len(TRANSFORMER) :]: ckpt.trainable.pop(k) for k in [k for k in ckpt.trainable if k.startswith(TRANSFORMER)]
        }
    check_frozen(ckpt, base)
    try:
        model = build_dit4dit(cfg, io.spec)
    except ConfigError as e:
        raise ConversionError(f"{config}: {e}") from None
    _check_widths(raw, model.backbone.hidden_size, config.name)
    expected = {k: v.shape for k, v in model.trainable_state_dict().items()}
    model.load_trainable_state_dict(map_trainable(ckpt, expected, config.name), strict=True)
    cache = PromptCache(text_identity(cfg), cfg.framework.cosmos25.max_sequence_length)
    if instructions:
        cache.build(list(instructions), build_prompt_encoder(cfg))
    trajectories = entry.get("num_trajectories")
    folder = export_policy(out, model, cfg, io, cache, split={}, dataset_paths=[], step=step_of(checkpoint),
                           statistics_tag=stat_tag,
                           num_trajectories=trajectories if isinstance(trajectories, int) else None)
    return folder, notices
