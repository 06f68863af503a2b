"""DiT4DiT's config keys and module paths, and what each becomes here (the migration table).

Read by ``migrate.py`` (configs) and ``dit4dit_npu/convert`` (checkpoint keys). Each key of an
original config is ``Moved`` (same meaning, our name, value converted where its form differs),
``Fixed`` (one behaviour here: its value is accepted with a notice, another is an error),
``Ignored`` (DiT4DiT itself never read it) or ``Removed`` (a key of an earlier version of this
project; an error saying where the concept went).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dit4dit_npu.config.original_data import NAMED_MIXTURES
from dit4dit_npu.errors import DiT4DiTError


class MigrationError(DiT4DiTError, ValueError):
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


# The way back (an export in DiT4DiT's format): our module paths -> its; original_path inverts
# module_path on every path of our trained model (checked by the export).
ORIGINAL_RENAMES: list[tuple[str, str]] = [
    (r"^backbone\.transformer(?=\.|$)", "backbone_interface.extractor.transformer"),
    (r"^action_model\.model\.timestep_embedder(?=\.|$)", "action_model.model.timestep_encoder.timestep_embedder"),
    (r"^action_model\.model\.blocks(?=\.|$)", "action_model.model.transformer_blocks"),
    (r"^action_model\.(state_encoder|action_decoder)\.0(?=\.|$)", r"action_model.\1.layer1"),
    (r"^action_model\.(state_encoder|action_decoder)\.2(?=\.|$)", r"action_model.\1.layer2"),
    (r"^action_model\.action_encoder\.W([123])(?=\.|$)", r"action_model.action_encoder.layer\1"),
]


def original_path(path: str) -> str:
    """Our module (or parameter) path -> DiT4DiT's."""
    for pattern, repl in ORIGINAL_RENAMES:
        path = re.sub(pattern, repl, path)
    return path


# --------------------------------------------------------------------------------------------
# Value conversions
# --------------------------------------------------------------------------------------------


def _freeze_list(value: Any) -> list[str]:
    """DiT4DiT: one comma-separated string; ours: a list. Nothing (null, false) freezes nothing;
    any other value (a number, a mapping) is refused, not read as "nothing"."""
    if isinstance(value, list):
        items = [str(v) for v in value]
    elif isinstance(value, str):
        items = [p.strip() for p in value.split(",") if p.strip()]
    elif value is None or value is False:
        items = []
    else:
        raise MigrationError(
            f"trainer.freeze_modules: got {value!r:.60}, expected a list of module paths "
            "(or DiT4DiT's comma-separated string)"
        )
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


def _window_to_chunk(value: Any) -> int:
    """DiT4DiT's (and this project's earlier) future_action_window_size -> the chunk length: the
    one +1 of the project's configs."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise MigrationError(f"framework.action_model.future_action_window_size: got {value!r}, expected int "
                             "(the chunk length minus one)")
    return value + 1


UNUSED = "unused in DiT4DiT too"
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
    "framework.cosmos25.device": Ignored("the device layer (dit4dit_npu.device) places the model"),
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
    "framework.action_model.action_horizon": Fixed(None, "the chunk is framework.action_model.chunk_length here"),
    "framework.action_model.future_action_window_size": Moved(
        "framework.action_model.chunk_length", _window_to_chunk,
        "DiT4DiT's window is the chunk minus its first step",
    ),
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
# (future_action_window_size also: earlier configs of this project have it; it is not a sign of
# a DiT4DiT config.)
SAME = {"datasets.vla_data.data_mix", "trainer.freeze_modules", "framework.action_model.future_action_window_size"}
