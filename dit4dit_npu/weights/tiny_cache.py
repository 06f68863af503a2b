"""The tiny base model as a diffusers folder: written once per sizes, shared by every run.

``framework.cosmos25.base_model: tiny`` is not a shortcut: the tiny random pipeline
(``models/tiny.py``, a pure function of ``framework.cosmos25.tiny``) is saved once with
``save_pretrained`` into a folder laid out like the real one, cached under
``$DIT4DIT_TINY_CACHE`` (default ``~/.cache/dit4dit_npu/tiny``) by a hash of its sizes, and then
loaded by exactly the code that loads the real folder (``base_model.py``).
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
from dit4dit_npu.config import Config, ConfigError, TinyCosmosConfig
from dit4dit_npu.files import atomic_folder
from dit4dit_npu.models import tiny
from dit4dit_npu.weights.finite import nonfinite
from dit4dit_npu.weights.layout import check_base_model
from dit4dit_npu.weights.model_config import tiny_sizes

TINY_CACHE_ENV = "DIT4DIT_TINY_CACHE"
RANK_WAIT_S = 600.0


def tiny_cache_root() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dit4dit_npu" / "tiny"
    return Path(os.environ.get(TINY_CACHE_ENV) or default).expanduser()


def in_tiny_cache(path: Path) -> bool:
    """A folder of the cache: ours to rewrite (a damaged one is fixed by deleting it)."""
    return path.parent.resolve() == tiny_cache_root().resolve()


def tiny_base_model(sizes: TinyCosmosConfig) -> Path:
    """The tiny pipeline's diffusers folder, written on first use. Keyed by the sizes and the
    library versions (a tokenizer saved by transformers 5 is unreadable by 4.x); written to a
    temp folder and renamed, so concurrent ranks never see half a folder."""
    import diffusers
    import transformers

    # fitted VAE weights are named by their content: the same file anywhere shares one folder, an
    # edited one gets a new folder
    named = {k: v for k, v in dataclasses.asdict(sizes).items() if k != "vae_weights"}
    fitted = vae_weights_hash(sizes)
    if fitted is not None:  # the random VAE's folders keep the key they had before the option
        named["vae_weights"] = fitted
    ident = {"sizes": named, "diffusers": diffusers.__version__, "transformers": transformers.__version__}
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


def _write_from_any_rank(sizes: TinyCosmosConfig, path: Path) -> None:
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


def _wait_for_folder(folder: Path, timeout_s: float = RANK_WAIT_S) -> Path:
    deadline = time.monotonic() + timeout_s
    while not (folder / "model_index.json").is_file():
        if time.monotonic() > deadline:
            raise ConfigError(
                f"framework.cosmos25.base_model=tiny: this node's local rank 0 did not write {folder} within "
                f"{timeout_s:.0f} s"
            )
        time.sleep(0.2)
    return folder


VAE_WEIGHTS_KEY = "framework.cosmos25.tiny.vae_weights"


def vae_weights_hash(sizes: TinyCosmosConfig) -> str | None:
    """The sha256 (16 hex digits) of the fitted tiny VAE weights file; None for the random VAE."""
    if sizes.vae_weights is None:
        return None
    try:
        return hashlib.sha256(Path(sizes.vae_weights).expanduser().read_bytes()).hexdigest()[:16]
    except OSError as e:
        raise ConfigError(f"{VAE_WEIGHTS_KEY}: cannot read {sizes.vae_weights} ({e.strerror or e})") from None


def load_vae_weights(vae: torch.nn.Module, path: str | Path) -> torch.nn.Module:
    """The fitted weights (``dit4dit-fit-tiny-vae``'s file) into the tiny VAE, every tensor of it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(Path(path).expanduser()))
    except (OSError, SafetensorError) as e:
        raise ConfigError(f"{VAE_WEIGHTS_KEY}: {path} is not a readable safetensors file ({e})") from None
    problem = nonfinite(state.items())
    if problem is not None:  # else every latent is NaN and the run stops blaming its learning rate
        raise ConfigError(f"{VAE_WEIGHTS_KEY}: {path}: {problem}; refusing a VAE whose latents would be non-finite")
    try:
        vae.load_state_dict(state, strict=True)
    except RuntimeError as e:  # missing/unexpected keys or other shapes: fitted for other sizes
        first = " ".join(str(e).split())[:300]
        raise ConfigError(
            f"{VAE_WEIGHTS_KEY}: {path} does not fit this tiny VAE (vae_base_dim={vae.config.base_dim}): {first}"
        ) from None
    return vae


def save_tiny_base_model(cfg: Config, path: str | Path) -> Path:
    """Write the tiny base model of ``cfg`` as a diffusers folder at ``path``; returns it."""
    return write_tiny_base_model(cfg.framework.cosmos25.tiny, Path(path))


class _NoSafetyChecker:
    """The pipeline insists on a safety checker (cosmos_guardrail, not a dependency); saving
    records it as absent, as the real folder's model_index.json does."""

    def to(self, *args: Any, **kwargs: Any) -> _NoSafetyChecker:
        return self

    def check_text_safety(self, prompt: str) -> bool:
        return True

    def check_video_safety(self, video: Any) -> Any:
        return video


def write_tiny_base_model(sizes: TinyCosmosConfig, path: Path) -> Path:
    """``Cosmos2_5_PredictBasePipeline(tiny modules).save_pretrained(path)``; the VAE with its
    fitted weights when ``sizes.vae_weights`` names them."""
    from diffusers import Cosmos2_5_PredictBasePipeline

    t = tiny_sizes(sizes)
    tok = tiny.build_tokenizer()
    pipe = Cosmos2_5_PredictBasePipeline(
        text_encoder=tiny.build_text_encoder(t, tok),
        tokenizer=tok,
        transformer=tiny.build_transformer(t),
        vae=tiny.build_vae(t) if sizes.vae_weights is None else load_vae_weights(tiny.build_vae(t), sizes.vae_weights),
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
