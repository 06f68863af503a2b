"""A policy folder -> a run folder in DiT4DiT's own format, for users whose evaluation harness is
the original's (its LIBERO / RoboTwin clients, its model server):

    python -m dit4dit_npu.convert to-dit4dit POLICY --out RUN
    RUN/checkpoints/steps_N_pytorch_model.pt   torch.save of its whole state dict: our trained
                                               tensors under its names, its frozen text encoder
                                               and VAE from the base model (as its trainer saved)
    RUN/config.yaml                            the keys its from_pretrained and clients read
    RUN/dataset_statistics.json                {tag: {action: {..., mask}, state, num_transitions,
                                               num_trajectories}}, per-dim lists in its model order

The inverse of the import (``dit4dit.py``): the key renaming is ``config.dit4dit_keys.
original_path`` (checked to invert the import's on every tensor), the statistics are PolicyIO's
put back in the model's order with the mask of the dims it min-max normalizes. What its code
cannot express is refused in one line (a LoRA policy, a head size its table lacks, actions that
are not min-max) or, where only its clients decide (clip, grippers), said in a notice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dit4dit_npu.config.dit4dit_keys import module_path, original_path
from dit4dit_npu.config.framework import PRESETS
from dit4dit_npu.convert.checkpoint import (
    HEAD,
    TEXT_ENCODER,
    TRANSFORMER,
    VAE,
    ConversionError,
    disk_to_memory,
    safetensors_files,
)
from dit4dit_npu.convert.dit4dit import ORIGINAL_PRESETS, check_out_parent
from dit4dit_npu.files import atomic_folder, is_out_of_space
from dit4dit_npu.transforms.feature_stats import STAT_FIELDS, FeatureStats
from dit4dit_npu.transforms.policy_io import PolicyIO
from dit4dit_npu.transforms.vector import Binarize, Clip, Normalize, Reorder

GENERIC_TAG = "new_embodiment"
PRECISION = {"bf16": "bfloat16", "no": "float32"}


def export_dit4dit(
    policy: str | Path, out: str | Path, tag: str | None = None, action_model_type: str | None = None
) -> tuple[Path, list[str]]:
    """-> (the run folder, notices). Raises ConversionError (PolicyLoadError for the policy folder:
    every file is checked against its whole content hash, and its statistics must be finite, as
    ``from_pretrained`` checks them) with nothing written."""
    from dit4dit_npu.policy.folder import find_policy_dir, read_io, read_manifest, read_policy_json
    from dit4dit_npu.policy.manifest import inference_config
    from dit4dit_npu.weights import base_model_folder

    out = Path(out)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):  # checked before the minutes of reading
        what = "exists and is not empty" if out.is_dir() else "is a file"
        raise ConversionError(f"--out {out} {what}: choose a new (or an empty) folder for the run")
    check_out_parent(out)
    path = find_policy_dir(policy)
    raw = read_policy_json(path, full_check=True)  # every file against its whole content hash
    io = read_io(path)  # finite statistics, as from_pretrained reads them
    manifest = read_manifest(path, raw, io)
    f = manifest.framework
    notices: list[str] = []
    if f.cosmos25.lora.enabled:
        raise ConversionError(f"{path}: a LoRA policy; DiT4DiT's checkpoint holds whole weights (merge it first)")
    if f.cosmos25.training == "video":
        raise ConversionError(f"{path}: a video-only policy has no action head; DiT4DiT's model needs one")
    one_pass = f.cosmos25.one_pass
    if one_pass.enabled and one_pass.condition_head_on_noise_level:
        raise ConversionError(f"{path}: its action head is conditioned on its features' noise level "
                              "(framework.cosmos25.one_pass); DiT4DiT's head has no such input")
    if one_pass.enabled and f.cosmos25.video_loss_future_frames is not None:
        raise ConversionError(f"{path}: its head reads features of 1 + video_loss_future_frames latent frames "
                              "(framework.cosmos25.one_pass); DiT4DiT's feature pass reads the whole clip's")
    cfg = inference_config(manifest.model)
    base = base_model_folder(cfg)
    kind = head_type(f.action_model, action_model_type, path, notices)
    stats = statistics(io, tag or manifest.data.statistics_tag or GENERIC_TAG, manifest.data.num_trajectories, path)
    notices += client_notices(io, f.cosmos25)

    state = {original_path(k): v for k, v in _tensors(path / "model.safetensors").items()}
    for key in state:
        if not key.startswith((TRANSFORMER, HEAD)) or module_path(key) is None:
            raise ConversionError(f"{path}: tensor {key} has no place in DiT4DiT's model")
    frozen = ["text_encoder", "vae"] + (["transformer"] if f.cosmos25.training == "action" else [])
    prefix = {"text_encoder": TEXT_ENCODER, "vae": VAE, "transformer": TRANSFORMER}
    for component in frozen:  # as its trainer saved them: every frozen tensor, under its in-memory names
        files = safetensors_files(base / component)
        if not files:
            raise ConversionError(f"base model {base}: no {component}/*.safetensors to write into the checkpoint")
        for file in files:
            for k, v in _tensors(file).items():
                state[prefix[component] + disk_to_memory(component, k)] = v
    width = transformer_width(base)
    config = run_config(cfg, io, kind, str(base.resolve()), width)
    try:
        with atomic_folder(out) as tmp:
            (tmp / "checkpoints").mkdir()
            torch.save(state, tmp / "checkpoints" / f"steps_{manifest.step}_pytorch_model.pt")
            (tmp / "config.yaml").write_text(_yaml(config))
            (tmp / "dataset_statistics.json").write_text(json.dumps(stats, indent=2))
    except OSError as e:  # a parent os.access passed but that refuses folders (/proc, a read-only mount)
        if is_out_of_space(e):
            raise
        raise ConversionError(f"--out {out}: cannot write the run folder there ({e.strerror or e})") from None
    return out, notices


def _tensors(file: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; a damaged one (a format 3 folder is not hashed) is one line."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as e:
        raise ConversionError(f"{file}: not a readable safetensors file ({e})") from None


def head_type(a: Any, given: str | None, path: Path, notices: list[str]) -> str:
    """Its DiTConfig entry: the one our sizes are (DiT-B, DiT-L), or the one the user names (an
    entry they added to its table, with these sizes: said in a notice, since DiT4DiT's own code
    cannot load the run until its table has it)."""
    sizes = (a.dim, a.num_heads, a.head_dim)
    if given is not None:
        if given in ORIGINAL_PRESETS and PRESETS[given] != sizes:
            raise ConversionError(f"--action-model-type {given}: its sizes are {PRESETS[given]}, this head's "
                                  f"(width, heads, head dim) {sizes}")
        if given not in ORIGINAL_PRESETS:
            notices.append(
                f"--action-model-type {given!r} is none of DiT4DiT's presets ({', '.join(ORIGINAL_PRESETS)}): the run "
                f"loads only where its DiTConfig has an entry {given!r} with (width, heads, head dim) {sizes}"
            )
        return given
    match = [k for k in ORIGINAL_PRESETS if PRESETS[k][0] == a.dim]
    if not match:
        raise ConversionError(
            f"{path}: the head's (width, heads, head dim) {sizes} is none of DiT4DiT's size table (DiT-B, DiT-L); "
            "add an entry to its DiTConfig and pass its name with --action-model-type"
        )
    return match[0]


def transformer_width(base: Path) -> int:
    c = json.loads((base / "transformer" / "config.json").read_text())
    return int(c["num_attention_heads"]) * int(c["attention_head_dim"])


def _model_order(stats: FeatureStats, pipe: Any) -> FeatureStats:
    step = pipe.find(Reorder)
    if step is None:
        return stats
    return FeatureStats(**{f: getattr(stats, f)[list(step.perm)] for f in STAT_FIELDS}, count=stats.count)


def _block(stats: FeatureStats) -> dict[str, list[float]]:
    return {f: getattr(stats, f).tolist() for f in ("mean", "std", "max", "min", "q01", "q99")}


def statistics(io: PolicyIO, tag: str, trajectories: int | None, path: Path) -> dict[str, Any]:
    """Its dataset_statistics.json: the statistics in its model order, the action mask = the dims
    min-max normalized (its clients un-normalize those, pass the others)."""
    steps = [s for s in io.action.steps if isinstance(s, Normalize)]
    if any(s.mode != "min_max" for s in steps):
        raise ConversionError(f"{path}: actions normalized {[s.mode for s in steps]}; DiT4DiT's clients "
                              "un-normalize min_max only")
    mask = np.zeros(io.action_dim, dtype=bool)
    for s in steps:
        mask |= s.selected
    reorder = io.action.find(Reorder)
    if reorder is not None:
        mask = mask[list(reorder.perm)]
    action = _model_order(io.stats["action"], io.action)
    return {tag: {
        "action": _block(action) | {"mask": [bool(m) for m in mask]},
        "state": _block(_model_order(io.stats["state"], io.state)),
        "num_transitions": int(action.count),
        "num_trajectories": int(trajectories) if trajectories is not None else 0,
    }}


def client_notices(io: PolicyIO, cosmos: Any) -> list[str]:
    """What DiT4DiT's code does its own way with this policy (its clients decide, not the files)."""
    out = []
    pipe = io.action
    if pipe.find(Clip) is None:
        out.append("its clients clip every predicted dim to [-1, 1] before un-normalizing; this policy did not "
                   "(datasets.vla_data.action_clip)")
    grippers = [s for s in pipe.steps if isinstance(s, Binarize) and not s.encode]
    if grippers:
        out.append(f"predicted dims {list(grippers[0].dims)} were binarized here; its clients decide their own grippers")
    for key, crop in io.camera_crops.items():
        out.append(f"{key} was cropped to {crop} ([top, left, height, width] of the frame) before the resize; "
                   "its clients must cut the same region out of that camera's frames")
    if cosmos.condition_latent != "sample" or cosmos.feature_noise_seed is not None:
        out.append("its model samples the conditioning latent and draws unseeded feature noise (this policy: "
                   f"condition_latent {cosmos.condition_latent}, feature_noise_seed {cosmos.feature_noise_seed})")
    return out


def run_config(cfg: Any, io: PolicyIO, kind: str, base: str, width: int) -> dict[str, Any]:
    """The keys of its config.yaml its model, from_pretrained and clients read, from ours."""
    c, a = cfg.framework.cosmos25, cfg.framework.action_model
    d = a.diffusion_model_cfg
    spec = io.spec
    fm = c.flow_matching
    return {
        "framework": {
            "name": "DiT4DiT",
            "cosmos25": {
                "base_model": base, "extract_layer": c.extract_layer, "training": c.training,
                "conditional_frame_timestep": c.conditional_frame_timestep, "future_loss_type": "flow_matching",
                "torch_dtype": PRECISION[cfg.trainer.mixed_precision], "vl_hidden_dim": width,
                "max_sequence_length": c.max_sequence_length,
                "flow_matching": {"time_distribution": fm.time_distribution, "high_sigma_ratio": fm.high_sigma_ratio,
                                  "high_sigma_min": fm.high_sigma_min},
            },
            "action_model": {
                "action_model_type": kind, "hidden_size": a.hidden_size, "add_pos_embed": a.add_pos_embed,
                "max_seq_len": a.max_seq_len, "action_dim": spec.action_width, "state_dim": spec.state_width,
                # its constructor reads past_action_window_size (chunk = past + 1 + future): ours has none
                "future_action_window_size": a.chunk_length - 1, "past_action_window_size": 0,
                "action_horizon": a.chunk_length,
                "noise_beta_alpha": a.noise_beta_alpha, "noise_beta_beta": a.noise_beta_beta, "noise_s": a.noise_s,
                "num_timestep_buckets": a.num_timestep_buckets, "num_inference_timesteps": a.num_inference_timesteps,
                "diffusion_model_cfg": {
                    "cross_attention_dim": width, "dropout": d.dropout, "final_dropout": d.final_dropout,
                    "interleave_self_attention": d.interleave_self_attention, "norm_type": "ada_norm",
                    "num_layers": d.num_layers, "output_dim": d.output_dim, "positional_embeddings": None,
                    # merged over its table entry: stated unless they are that preset's own
                    **({} if PRESETS.get(kind) == (a.dim, a.num_heads, a.head_dim) else
                       {"num_attention_heads": a.num_heads, "attention_head_dim": a.head_dim}),
                },
            },
        },
        "datasets": {"vla_data": {
            "image_size": list(io.image_size), "video_delta_indices": list(io.clip_offsets),
            "action_video_freq_ratio": 1, "max_state_dim": spec.state_width, "max_action_dim": spec.action_width,
        }},
        "trainer": {"repeated_diffusion_steps": a.repeated_diffusion_steps},
    }


def _yaml(config: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(config, sort_keys=False)
