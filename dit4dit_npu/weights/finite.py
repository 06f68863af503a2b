"""Weights that hold NaN/inf are refused when they are loaded, naming the file: a run would
otherwise start, give non-finite latents, prompts or features at its first step, and stop with a
divergence message that blames the learning rate.

- ``nonfinite``: the first tensor of named tensors (a state dict, a module's parameters and
  buffers) holding NaN/inf, checked tensor by tensor in bounded pieces (no second copy of a 7B
  text encoder);
- ``nonfinite_file``: the first safetensors file of a folder holding such a tensor, read only
  after the loaded module failed the check (to name the file, not to check it twice).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

_PIECE = 2**24  # elements per isfinite call: a 64 MiB bool temporary at most


def nonfinite(named: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """``"tensor 'NAME' has N NaN/inf value(s)"`` for the first tensor holding any, else None."""
    for name, t in named:
        if not t.is_floating_point() or t.device.type == "meta":
            continue
        flat = t.detach().reshape(-1)
        if all(bool(torch.isfinite(piece).all()) for piece in flat.split(_PIECE)):
            continue
        n = sum(int((~torch.isfinite(piece)).sum()) for piece in flat.split(_PIECE))
        return f"tensor {name!r} has {n} NaN/inf value(s)"
    return None


def module_tensors(module: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    yield from module.named_parameters()
    yield from module.named_buffers()


def nonfinite_file(folder: Path) -> tuple[Path, str] | None:
    """(file, problem) of the first ``*.safetensors`` file in ``folder`` holding a NaN/inf tensor."""
    from safetensors import safe_open

    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            problem = nonfinite((k, f.get_tensor(k)) for k in f.keys())
        if problem is not None:
            return file, problem
    return None
