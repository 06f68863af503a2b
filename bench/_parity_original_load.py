"""The original-DiT4DiT side of ``bench/parity_dit4dit.py``'s export check (run by it, in the original's venv).

    ORIGINAL_PYTHON bench/_parity_original_load.py --original-root DIR --checkpoint RUN/checkpoints/steps_N_pytorch_model.pt --out OUT

Loads a run folder written by ``python -m dit4dit_npu.convert to-dit4dit`` with the original's own
``baseframework.from_pretrained`` (as its model server does: strict state dict, its config.yaml and
dataset_statistics.json), puts it in eval mode as its server does, and runs ``predict_action`` on
the observation ``_parity_original.py`` recorded in OUT (``observation.npz``: the frames and the
state as its server received them) with that call's recorded draws replayed in order. Writes
``OUT/normalized_export.npy``: what its server would reply.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import torch
from _parity_original import TINY_DIT


class NoiseReplay:
    """torch.randn / randn_like return the recorded draws, in order (in eval mode the call's only
    random draws: see _parity_original.NoiseTape, which recorded them)."""

    def __init__(self, draws: list[torch.Tensor]) -> None:
        self.draws = list(draws)

    def __enter__(self) -> NoiseReplay:
        self.saved = torch.randn, torch.randn_like
        torch.randn = lambda *shape, size=None, **kw: self._next(size or shape, kw)
        torch.randn_like = lambda like, **kw: self._next(like.shape, kw)
        return self

    def _next(self, shape, kwargs: dict) -> torch.Tensor:
        want = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else tuple(shape)
        out = self.draws.pop(0)
        if tuple(out.shape) != want:
            raise RuntimeError(f"replayed draw of shape {tuple(out.shape)} for a draw of shape {want}")
        return out.clone().to(kwargs.get("dtype") or out.dtype)

    def __exit__(self, *exc) -> None:
        torch.randn, torch.randn_like = self.saved
        if not exc[0] and self.draws:
            raise RuntimeError(f"{len(self.draws)} recorded draws were not used")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--original-root", type=Path, required=True)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    root, out, ckpt = args.original_root.resolve(), args.out.resolve(), args.checkpoint.resolve()
    sys.path.insert(0, str(root))  # the original is a checkout, not a package (see _parity_original)
    os.chdir(root)
    for name in ("pytorch3d", "pytorch3d.transforms"):
        sys.modules.setdefault(name, types.ModuleType(name))
        sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    from DiT4DiT.model.framework.base_framework import baseframework
    from DiT4DiT.model.modules.action_model import ActionDiT

    ActionDiT.DiTConfig["DiT-T"] = dict(TINY_DIT)  # the tiny head's size-table entry, as when it was trained
    model = baseframework.from_pretrained(str(ckpt)).eval()

    obs, noise = np.load(out / "observation.npz"), np.load(out / "noise_predict.npz")
    prompts = json.loads((out / "prompts.json").read_text())
    b = len(prompts)
    examples = [dict(image=[np.concatenate(list(obs["frames"][i]), axis=1)], lang=prompts[i], state=obs["model_state"][i])
                for i in range(b)]
    draws = [torch.from_numpy(noise[f"condition_{i}"]) for i in range(b)] + [
        torch.from_numpy(noise["feature"]), torch.from_numpy(noise["action"])]
    with torch.no_grad(), NoiseReplay(draws):
        normalized = model.predict_action(examples=examples)["normalized_actions"]
    np.save(out / "normalized_export.npy", normalized)


if __name__ == "__main__":
    main()
