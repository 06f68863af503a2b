"""The one adapter from the run config to the models, and the one place that loads weights.

    model = build_dit4dit(cfg, spec)      # spec: the BatchSpec PolicyIO promises (widths, lengths)

``framework.cosmos25.base_model`` is a local Cosmos-Predict2.5-2B diffusers folder (transformer/,
vae/, text_encoder/, tokenizer/, scheduler/, model_index.json; loaded with ``local_files_only``,
nothing is ever downloaded) or ``tiny``. ``tiny`` is not a shortcut: the tiny random pipeline
(``tiny.py``, a pure function of ``framework.cosmos25.tiny``) is saved once with
``save_pretrained`` into a folder laid out like the real one, cached under
``$DIT4DIT_TINY_CACHE`` (default ``~/.cache/dit4dit_npu/tiny``) by a hash of its sizes, and then
loaded by exactly the code that loads the real folder. An exported policy refers to its base by
this same string.

Modules only know their model-local configs (``BackboneConfig``, ``ActionHeadConfig``,
``DiT4DiTConfig``) and raise ``ModelConfigError`` naming a model-local field; here each field is
filled from its run-config key, and such errors are re-raised as ``ConfigError`` naming that key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from dit4dit_npu import device as dev
from dit4dit_npu.batch import BatchSpec
from dit4dit_npu.config import Config, ConfigError
from dit4dit_npu.files import atomic_folder
from dit4dit_npu.models import tiny
from dit4dit_npu.models.action_head import PRESETS, ActionHeadConfig, FlowMatchingActionHead
from dit4dit_npu.models.cosmos import BackboneConfig, CosmosBackbone
from dit4dit_npu.models.dit4dit import DiT4DiT, DiT4DiTConfig
from dit4dit_npu.models.errors import ModelConfigError
from dit4dit_npu.models.lora import LoraSettings, add_lora
from dit4dit_npu.models.text import PromptEncoder

TINY = "tiny"
TINY_CACHE_ENV = "DIT4DIT_TINY_CACHE"
# component folder -> file that must exist in it
COMPONENTS = {
    "transformer": "config.json",
    "vae": "config.json",
    "scheduler": "scheduler_config.json",
    "text_encoder": "config.json",
    "tokenizer": "tokenizer_config.json",
}
BACKBONE_PARTS = ("transformer", "vae", "scheduler")
TEXT_PARTS = ("text_encoder", "tokenizer")

# Run-config key behind each model-local field a module may complain about.
RUN_KEYS = {
    "extract_layer": "framework.cosmos25.extract_layer",
    "training": "framework.cosmos25.training",
    "frame_size": "datasets.vla_data.image_size (x the view layout)",
    "state_width": "datasets.vla_data.max_state_dim",
    "action_width": "datasets.vla_data.max_action_dim",
    "chunk_length": "framework.action_model.future_action_window_size",
    "max_seq_len": "framework.action_model.max_seq_len",
    "repeated_diffusion_steps": "framework.action_model.repeated_diffusion_steps",
    "attention_head_dim": "framework.cosmos25.tiny.attention_head_dim",
    "text_hidden_size": "framework.cosmos25.tiny.text_hidden_size",
    "lora_target_modules": "framework.cosmos25.lora.target_modules",
}


@contextlib.contextmanager
def _as_config_error() -> Iterator[None]:
    try:
        yield
    except ModelConfigError as e:
        raise ConfigError(f"{RUN_KEYS.get(e.field, e.field)}: {e.detail}") from None


# --------------------------------------------------------------------------------------------
# Run config -> model-local configs
# --------------------------------------------------------------------------------------------


def backbone_config(cfg: Config) -> BackboneConfig:
    c = cfg.framework.cosmos25
    return BackboneConfig(
        extract_layer=c.extract_layer,
        conditional_frame_timestep=c.conditional_frame_timestep,
        time_distribution=c.flow_matching.time_distribution,
        high_sigma_ratio=c.flow_matching.high_sigma_ratio,
        high_sigma_min=c.flow_matching.high_sigma_min,
        feature_noise_seed=c.feature_noise_seed,
        attention_backend=c.attention_backend,
        gradient_checkpointing=cfg.trainer.enable_gradient_checkpointing,
        condition_latent=c.condition_latent,
        round_timesteps=c.round_timesteps,
    )


def action_head_config(cfg: Config, spec: BatchSpec) -> ActionHeadConfig:
    """Widths from the batch spec, everything else from ``framework.action_model`` (the
    ``action_model_type`` preset, then its explicit overrides)."""
    a = cfg.framework.action_model
    d = a.diffusion_model_cfg
    if spec.chunk_length != a.chunk_length:
        raise ConfigError(
            f"framework.action_model.future_action_window_size: the head predicts {a.chunk_length} steps "
            f"but the batches bring chunks of {spec.chunk_length}"
        )
    dim, heads, head_dim = PRESETS[a.action_model_type]
    return ActionHeadConfig(
        state_width=spec.state_width,
        action_width=spec.action_width,
        chunk_length=spec.chunk_length,
        dim=a.input_embedding_dim or dim,
        num_heads=d.num_attention_heads or heads,
        head_dim=d.attention_head_dim or head_dim,
        num_layers=d.num_layers,
        output_dim=d.output_dim,
        dropout=d.dropout,
        final_dropout=d.final_dropout,
        interleave_self_attention=d.interleave_self_attention,
        hidden_size=a.hidden_size,
        add_pos_embed=a.add_pos_embed,
        max_seq_len=a.max_seq_len,
        noise_beta_alpha=a.noise_beta_alpha,
        noise_beta_beta=a.noise_beta_beta,
        noise_s=a.noise_s,
        num_timestep_buckets=a.num_timestep_buckets,
        num_inference_timesteps=a.num_inference_timesteps,
        repeated_diffusion_steps=a.repeated_diffusion_steps,
    )


def dit4dit_config(cfg: Config) -> DiT4DiTConfig:
    c = cfg.framework.cosmos25
    return DiT4DiTConfig(
        training=c.training,
        backprop_action_to_backbone=c.backprop_action_to_backbone,
        autocast=cfg.trainer.mixed_precision == "bf16",
    )


def lora_settings(cfg: Config) -> LoraSettings | None:
    """The LoRA adapters of ``framework.cosmos25.lora``; None when off (rank 0)."""
    lo = cfg.framework.cosmos25.lora
    if lo.rank == 0:
        return None
    alpha = lo.alpha if lo.alpha is not None else float(lo.rank)
    return LoraSettings(lo.rank, alpha, lo.dropout, tuple(lo.target_modules))


def tiny_sizes(cfg: Config) -> tiny.TinySizes:
    return tiny.TinySizes(**dataclasses.asdict(cfg.framework.cosmos25.tiny))


# --------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------


def build_backbone(cfg: Config) -> CosmosBackbone:
    from diffusers import CosmosTransformer3DModel, UniPCMultistepScheduler

    p = base_model_folder(cfg, BACKBONE_PARTS)
    lora = lora_settings(cfg)
    # fp32 master weights for the trained transformer; autocast/DeepSpeed handle bf16 compute.
    # Under LoRA the base transformer is frozen like the VAE (half the memory on accelerators);
    # the adapters are fp32.
    dtype = torch.float32 if lora is None else _frozen_dtype(cfg)
    transformer = load_weights(CosmosTransformer3DModel, p, "transformer", dtype)
    vae = build_vae(cfg)
    scheduler = _load(UniPCMultistepScheduler, p, "scheduler")
    with _as_config_error():
        if lora is not None:
            add_lora(transformer, lora)
        return CosmosBackbone(transformer, vae, scheduler, backbone_config(cfg))


def build_vae(cfg: Config) -> torch.nn.Module:
    """The frozen Wan VAE alone (eval mode), in the dtype training runs it in: what the latent
    cache encoder needs, without the 2B transformer."""
    from diffusers import AutoencoderKLWan

    vae = load_weights(AutoencoderKLWan, base_model_folder(cfg, ("vae",)), "vae", _frozen_dtype(cfg))
    return vae.eval().requires_grad_(False)


def build_action_head(cfg: Config, spec: BatchSpec, cross_attention_dim: int) -> FlowMatchingActionHead:
    head_cfg = action_head_config(cfg, spec)
    with _as_config_error():
        # seeded from the run seed, without touching the caller's RNG: same config -> same init
        return tiny.seeded(cfg.seed + 3, lambda: FlowMatchingActionHead(head_cfg, cross_attention_dim))


def build_dit4dit(cfg: Config, spec: BatchSpec) -> DiT4DiT:
    """The model for batches that fit ``spec`` (widths, chunk and clip length, frame size)."""
    backbone = build_backbone(cfg)
    head = None
    if cfg.framework.cosmos25.training != "video":
        head = build_action_head(cfg, spec, backbone.hidden_size)
    with _as_config_error():
        return DiT4DiT(backbone, head, dit4dit_config(cfg), spec)


def build_skeleton(cfg: Config, spec: BatchSpec) -> DiT4DiT:
    """The model's module tree on the meta device: built from the base folder's configs (or the
    tiny sizes) without reading or allocating a weight, so ``--dry-run`` runs every check the
    real build runs (base folder, extract_layer, frame size, head sizes) and the module paths of
    learning rates and freeze_modules resolve against the real tree, in a second."""
    from diffusers import AutoencoderKLWan, CosmosTransformer3DModel, UniPCMultistepScheduler

    c = cfg.framework.cosmos25
    with _as_config_error():
        if c.base_model == TINY:
            sizes = tiny_sizes(cfg)
            with torch.device("meta"):
                transformer, vae = tiny.build_transformer(sizes), tiny.build_vae(sizes)
            scheduler = tiny.build_scheduler()
        else:
            p = check_base_model(c.base_model, BACKBONE_PARTS)
            with torch.device("meta"):
                transformer = _from_config(CosmosTransformer3DModel, p, "transformer")
                vae = _from_config(AutoencoderKLWan, p, "vae")
            scheduler = _load(UniPCMultistepScheduler, p, "scheduler")
        if (lora := lora_settings(cfg)) is not None:
            with torch.device("meta"):
                add_lora(transformer, lora)
        backbone = CosmosBackbone(transformer, vae, scheduler, backbone_config(cfg))  # reads sigma: not on meta
        head = None
        if c.training != "video":
            with torch.device("meta"):
                head = FlowMatchingActionHead(action_head_config(cfg, spec), backbone.hidden_size)
        return DiT4DiT(backbone, head, dit4dit_config(cfg), spec)


def _from_config(cls: Any, path: Path, component: str) -> Any:
    try:
        return cls.from_config(cls.load_config(str(path / component), local_files_only=True))
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"framework.cosmos25.base_model: cannot read {path / component} config: {e}") from None


def build_prompt_encoder(cfg: Config) -> PromptEncoder:
    """Tokenizer + the Qwen2.5-VL *language model* only: the vision tower and lm_head are dropped
    right after loading (the pipeline never uses them, SPEC B1)."""
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    c = cfg.framework.cosmos25
    p = base_model_folder(cfg, TEXT_PARTS)
    tok = _load(AutoTokenizer, p, "tokenizer")
    full = load_weights(Qwen2_5_VLForConditionalGeneration, p, "text_encoder", _frozen_dtype(cfg))
    language_model = full.model.language_model
    del full  # frees the vision tower and lm_head
    return PromptEncoder(tok, language_model, c.max_sequence_length, identity=text_identity(cfg))


def text_identity(cfg: Config) -> str:
    """Names the text encoder weights, so a prompt cache of another model is refused."""
    c = cfg.framework.cosmos25
    if c.base_model == TINY:  # path- and version-independent, as the tiny weights are
        t = c.tiny
        return f"tiny:text{t.text_hidden_size}x{t.text_num_layers}h{t.text_num_heads}:seed{t.seed}"
    return f"cosmos25:{_folder_hash(check_base_model(c.base_model, TEXT_PARTS), TEXT_PARTS)}"


def vae_identity(cfg: Config) -> str:
    """Names the VAE weights and the dtype they run in, so latents cached by another VAE (or in
    another precision, which changes them) are refused (``data/latents.py``)."""
    c = cfg.framework.cosmos25
    dtype = str(_frozen_dtype(cfg)).removeprefix("torch.")
    if c.base_model == TINY:  # a pure function of its sizes and seed, as text_identity
        t = c.tiny
        return f"tiny:vae{t.vae_base_dim}:seed{t.seed}:{dtype}"
    return f"cosmos25:{_folder_hash(check_base_model(c.base_model, ('vae',)), ('vae',))}:{dtype}"


def _folder_hash(p: Path, components: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for comp in components:  # configs + tokenizer content + weight file sizes: cheap, path-independent
        for f in sorted((p / comp).iterdir()):
            if f.suffix in (".json", ".txt", ".model", ".jinja"):
                h.update(f.name.encode() + f.read_bytes())
            elif f.is_file():
                h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# Weights on disk
# --------------------------------------------------------------------------------------------


def base_model_folder(cfg: Config, parts: tuple[str, ...] = tuple(COMPONENTS)) -> Path:
    """The diffusers folder to load: ``base_model`` itself, or the cached tiny folder."""
    c = cfg.framework.cosmos25
    if c.base_model == TINY:
        return tiny_base_model(tiny_sizes(cfg))
    return check_base_model(c.base_model, parts)


def check_base_model(path: str | Path, parts: tuple[str, ...] = tuple(COMPONENTS)) -> Path:
    """The folder and every needed component exist, else one error naming what is missing."""
    p = Path(path).expanduser()
    expect = ", ".join(f"{c}/" for c in COMPONENTS)
    if not p.is_dir():
        raise ConfigError(
            f"framework.cosmos25.base_model: {str(path)!r} is neither 'tiny' nor a folder (expected a local "
            f"Cosmos-Predict2.5-2B diffusers folder with {expect}; nothing is downloaded)"
        )
    missing = [f"{c}/{f}" for c in parts if not (p / c / (f := COMPONENTS[c])).is_file()]
    if missing:
        raise ConfigError(
            f"framework.cosmos25.base_model: {p} is missing {', '.join(missing)} "
            f"(a Cosmos-Predict2.5-2B diffusers folder has {expect})"
        )
    return p


def _load(loader: Any, path: Path, component: str, **kwargs: Any) -> Any:
    try:
        return loader.from_pretrained(str(path / component), local_files_only=True, **kwargs)
    except (OSError, ValueError) as e:
        # the tiny folder is ours to rewrite: a damaged one (a disk filled mid-copy, an edit) is
        # fixed by deleting it, which the message says; a real Cosmos folder is the user's
        tiny = path.parent.resolve() == tiny_cache_root().resolve()
        hint = f" (the cached tiny model is damaged: delete {path}, the next run writes it again)" if tiny else ""
        raise ConfigError(f"framework.cosmos25.base_model: cannot load {path / component}: {e}{hint}") from None


def load_weights(loader: Any, path: Path, component: str, dtype: torch.dtype) -> Any:
    """``loader.from_pretrained`` in ``dtype``, with the keyword each library takes at our minimum
    versions: diffusers < 0.40 rejects ``dtype=`` (TypeError) but all take ``torch_dtype=``;
    transformers takes ``dtype=`` from 4.56 on and deprecates ``torch_dtype=`` in 5.x."""
    keyword = "torch_dtype" if loader.__module__.startswith("diffusers") else "dtype"
    return _load(loader, path, component, **{keyword: dtype})


def _frozen_dtype(cfg: Config) -> torch.dtype:
    """Frozen parts (VAE, text encoder) run in bf16 on accelerators, as the original; fp32 on CPU."""
    if dev.device_type() == dev.CPU or cfg.trainer.mixed_precision == "no":
        return torch.float32
    return dev.autocast_dtype()


def tiny_cache_root() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dit4dit_npu" / "tiny"
    return Path(os.environ.get(TINY_CACHE_ENV) or default).expanduser()


def tiny_base_model(sizes: tiny.TinySizes) -> Path:
    """The tiny pipeline's diffusers folder, written on first use. Keyed by the sizes and the
    library versions (a tokenizer saved by transformers 5 is unreadable by 4.x); written to a
    temp folder and renamed, so concurrent ranks never see half a folder."""
    import diffusers
    import transformers

    ident = {"sizes": dataclasses.asdict(sizes), "diffusers": diffusers.__version__, "transformers": transformers.__version__}
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    root = tiny_cache_root()
    folder = root / f"cosmos25-tiny-{key}"
    if (folder / "model_index.json").is_file():
        return folder
    if dev.local_rank() != 0:
        # One writer per node, its local rank 0, so a cache on node-local storage works on every
        # node; where the nodes share the cache, their writers race safely (atomic_folder below).
        return _wait_for_folder(folder)
    try:
        with atomic_folder(folder, replace=False) as tmp:
            with _as_config_error():
                _write_from_any_rank(sizes, tmp)
            check_base_model(tmp)  # never publish an incomplete folder
    except FileExistsError:
        if not (folder / "model_index.json").is_file():  # not just another process winning the race
            raise
    except OSError as e:
        raise ConfigError(
            f"framework.cosmos25.base_model=tiny: cannot write the tiny model cache {root} ({e.strerror or e}); "
            f"set {TINY_CACHE_ENV} to a writable folder"
        ) from None
    return folder


def _write_from_any_rank(sizes: tiny.TinySizes, path: Path) -> None:
    """``write_tiny_base_model``, also from a node's local rank 0 that is not global rank 0:
    transformers' save_pretrained writes weights only on global rank 0 of an initialized process
    group (an empty text_encoder/ elsewhere), so such a rank writes from a fresh process, which
    has no process group."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank()):
        write_tiny_base_model(sizes, path)
        return
    child = multiprocessing.get_context("spawn").Process(target=write_tiny_base_model, args=(sizes, path))
    child.start()
    child.join()
    if child.exitcode != 0:
        raise ConfigError(f"framework.cosmos25.base_model=tiny: writing {path} failed (exit code {child.exitcode})")


def _wait_for_folder(folder: Path, timeout_s: float = 600.0) -> Path:
    deadline = time.monotonic() + timeout_s
    while not (folder / "model_index.json").is_file():
        if time.monotonic() > deadline:
            raise ConfigError(
                f"framework.cosmos25.base_model=tiny: this node's local rank 0 did not write {folder} within "
                f"{timeout_s:.0f} s"
            )
        time.sleep(0.2)
    return folder


def save_tiny_base_model(cfg: Config, path: str | Path) -> Path:
    """Write the tiny base model of ``cfg`` as a diffusers folder at ``path``; returns it."""
    with _as_config_error():
        return write_tiny_base_model(tiny_sizes(cfg), Path(path))


class _NoSafetyChecker:
    """The pipeline insists on a safety checker (cosmos_guardrail, not a dependency); saving
    records it as absent, as the real folder's model_index.json does."""

    def to(self, *args: Any, **kwargs: Any) -> _NoSafetyChecker:
        return self

    def check_text_safety(self, prompt: str) -> bool:
        return True

    def check_video_safety(self, video: Any) -> Any:
        return video


def write_tiny_base_model(sizes: tiny.TinySizes, path: Path) -> Path:
    """``Cosmos2_5_PredictBasePipeline(tiny modules).save_pretrained(path)``."""
    from diffusers import Cosmos2_5_PredictBasePipeline

    tok = tiny.build_tokenizer()
    pipe = Cosmos2_5_PredictBasePipeline(
        text_encoder=tiny.build_text_encoder(sizes, tok),
        tokenizer=tok,
        transformer=tiny.build_transformer(sizes),
        vae=tiny.build_vae(sizes),
        scheduler=tiny.build_scheduler(),
        safety_checker=_NoSafetyChecker(),
    )
    with _quiet_saving():
        pipe.save_pretrained(str(path))
    return path


@contextlib.contextmanager
def _quiet_saving() -> Iterator[None]:
    """No progress bars and no "safety_checker cannot be saved" warning for a tiny, expected write."""
    from transformers.utils import logging as hf_logging

    pipeline_log = logging.getLogger("diffusers.pipelines.pipeline_utils")
    level, bars = pipeline_log.level, hf_logging.is_progress_bar_enabled()
    pipeline_log.setLevel(logging.ERROR)
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        pipeline_log.setLevel(level)
        if bars:
            hf_logging.enable_progress_bar()
