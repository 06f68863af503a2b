"""Loading the base model's parts from the folder ``framework.cosmos25.base_model`` names.

The folder is a local Cosmos-Predict2.5-2B diffusers folder (``layout.py``) or, for ``tiny``, the
cached tiny folder (``tiny_cache.py``): both load through the same code. Also here: the dtype
the frozen parts run in, and the identities that name the text encoder and VAE weights (a
prompt cache or latent cache made by other weights is refused).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from dit4dit_npu import device as dev
from dit4dit_npu.config import Config, ConfigError
from dit4dit_npu.weights.finite import module_tensors, nonfinite, nonfinite_file
from dit4dit_npu.weights.layout import COMPONENTS, TEXT_PARTS, check_base_model
from dit4dit_npu.weights.tiny_cache import in_tiny_cache, tiny_base_model, vae_weights_hash


def base_model_folder(cfg: Config, parts: tuple[str, ...] = tuple(COMPONENTS)) -> Path:
    """The diffusers folder to load: ``base_model`` itself, or the cached tiny folder."""
    c = cfg.framework.cosmos25
    if c.is_tiny:
        return tiny_base_model(c.tiny)
    return check_base_model(c.base_model, parts)


def load(loader: Any, path: Path, component: str, **kwargs: Any) -> Any:
    """``loader.from_pretrained(path/component)``, local files only; a failure is one line."""
    try:
        return loader.from_pretrained(str(path / component), local_files_only=True, **kwargs)
    except (OSError, ValueError) as e:
        # the tiny folder is ours to rewrite: a damaged one (a disk filled mid-copy, an edit) is
        # fixed by deleting it, which the message says; a real Cosmos folder is the user's
        hint = f" (the cached tiny model is damaged: delete {path}, the next run writes it again)" if in_tiny_cache(path) else ""
        raise ConfigError(f"framework.cosmos25.base_model: cannot load {path / component}: {e}{hint}") from None


def load_weights(loader: Any, path: Path, component: str, dtype: torch.dtype) -> Any:
    """``loader.from_pretrained`` in ``dtype``, with the keyword each library takes at our minimum
    versions: diffusers < 0.40 rejects ``dtype=`` (TypeError) but all take ``torch_dtype=``;
    transformers takes ``dtype=`` from 4.56 on and deprecates ``torch_dtype=`` in 5.x."""
    keyword = "torch_dtype" if loader.__module__.startswith("diffusers") else "dtype"
    module = load(loader, path, component, **{keyword: dtype})
    check_finite(module, path / component)
    return module


def check_finite(module: torch.nn.Module, folder: Path) -> None:
    """Weights with NaN/inf are refused at load, naming the file that holds them (``finite.py``)."""
    problem = nonfinite(module_tensors(module))
    if problem is None:
        return
    found = nonfinite_file(folder)
    where, problem = found if found is not None else (folder, problem)  # (a file in another format)
    hint = f" (delete {folder.parent}, the next run writes it again)" if in_tiny_cache(folder.parent) else ""
    raise ConfigError(f"framework.cosmos25.base_model: {where}: {problem}; refusing weights that make every step "
                      f"non-finite{hint}")


def from_config(cls: Any, path: Path, component: str) -> Any:
    """The component built from its config alone (no weights read): a meta-device skeleton."""
    try:
        return cls.from_config(cls.load_config(str(path / component), local_files_only=True))
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"framework.cosmos25.base_model: cannot read {path / component} config: {e}") from None


def frozen_dtype(cfg: Config) -> torch.dtype:
    """Frozen parts (VAE, text encoder) run in bf16 under ``trainer.mixed_precision: bf16``, as the
    original, on every device, and in fp32 under ``"no"``. A CPU host too: the real text encoder
    is 30 GB in fp32, more than a 24 GiB host holds, 15 GB in bf16 (the tiny configs say "no")."""
    if not cfg.trainer.autocast:
        return torch.float32
    return dev.autocast_dtype()


def text_identity(cfg: Config) -> str:
    """Names the text encoder weights, so a prompt cache of another model is refused."""
    c = cfg.framework.cosmos25
    if c.is_tiny:  # path- and version-independent, as the tiny weights are
        t = c.tiny
        return f"tiny:text{t.text_hidden_size}x{t.text_num_layers}h{t.text_num_heads}:seed{t.seed}"
    return f"cosmos25:{folder_hash(check_base_model(c.base_model, TEXT_PARTS), TEXT_PARTS)}"


def vae_identity(cfg: Config) -> str:
    """Names the VAE weights and the dtype they run in, so latents cached by another VAE (or in
    another precision, which changes them) are refused (``data/latents.py``)."""
    c = cfg.framework.cosmos25
    dtype = str(frozen_dtype(cfg)).removeprefix("torch.")
    if c.is_tiny:  # a pure function of its sizes and seed, as text_identity (and of fitted weights' content)
        t = c.tiny
        fitted = vae_weights_hash(t)
        return f"tiny:vae{t.vae_base_dim}:seed{t.seed}{'' if fitted is None else ':fitted' + fitted}:{dtype}"
    return f"cosmos25:{folder_hash(check_base_model(c.base_model, ('vae',)), ('vae',))}:{dtype}"


def folder_hash(p: Path, components: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for comp in components:  # configs + tokenizer content + weight file sizes: cheap, path-independent
        for f in sorted((p / comp).iterdir()):
            if f.suffix in (".json", ".txt", ".model", ".jinja"):
                h.update(f.name.encode() + f.read_bytes())
            elif f.is_file():
                h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:16]
