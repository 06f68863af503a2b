"""The original-DiT4DiT side of ``bench/parity_dit4dit.py --train-steps N`` (run by it, in the original's venv).

    ORIGINAL_PYTHON bench/_parity_original_train.py --original-root DIR --base TINY_DIR --out OUT --preset libero --steps N

Trains the original model, imported from ``--original-root`` (never copied here), for N optimizer
steps on CPU in fp32 and writes what the comparison needs:

- ``OUT/run/``: its run folder with the initial weights (``checkpoints/steps_0_pytorch_model.pt``),
  the final ones (``steps_N_pytorch_model.pt``), ``config.yaml`` and ``dataset_statistics.json``;
- ``batch_K.npz`` / ``noise_K.npz`` for each step K: the batch as its dataloader emits it and
  every random draw of that step's forward, by name (see ``_parity_original.NoiseTape``);
- ``steps.json``: per step its losses, the gradient norm before clipping and each group's LR.

Its optimizer, scheduler and freezing are built by its own functions, in the order of its
``train.py`` ``main`` / ``prepare_training``: ``build_param_lr_groups`` -> ``torch.optim.AdamW``
with its config's base lr, betas, weight decay and eps -> transformers' ``get_scheduler`` with its
``scheduler_specific_kwargs`` -> ``TrainerUtils.freeze_backbones`` -> ``accelerator.prepare``.
Each step is ``VLATrainer._train_step`` (train.py:475-555): its ``train.py`` cannot be imported
outside a DeepSpeed launch (it builds a DeepSpeed Accelerator at import time, with bf16 on), so
the step's dozen lines are followed here in order on a plain fp32 CPU ``Accelerator``:
``accumulate`` -> forward under ``autocast("cuda")`` (disabled on CPU, as on its CPU runs) ->
total = action + ``loss_scale.future_video`` x video -> ``accelerator.backward`` ->
``clip_grad_norm_(trainer.gradient_clipping)`` (DeepSpeed's global-norm clip in its launches) ->
``optimizer.step`` -> ``lr_scheduler.step`` -> ``zero_grad``. The model is left in the mode its
trainer leaves it in (it never calls ``.train()``).

The head's dropout is set to 0 in its config (and so in the import): dropout draws its masks
inside torch's kernels, which no tape records, so masks cannot be replayed draw for draw.
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
from _parity_original import (
    PRESETS,
    TINY_DIT,
    B,
    NoiseTape,
    model_state,
    original_config,
    statistics,
    write_tiny_base,
)

# The launch scripts' warmup (5000 of 80k steps) does not fit in N steps; 5 keeps a warmup and a decay.
WARMUP = 5


def make_batch(p: dict, st: dict, stats: dict, rng: np.random.Generator, normalizer) -> tuple[list[dict], dict]:
    """One training batch as its dataloader emits it (float16 state/actions, [0, 1] float frames)."""
    T = len(p["vdi"][:: p["ratio"]])
    frames = rng.integers(0, 256, size=(B, T, p["views"], *p["hw"], 3), dtype=np.uint8)
    raw_state = rng.uniform(st["state"]["min"], st["state"]["max"], size=(B, p["s_raw"]))
    if p["tag"] != "franka":
        raw_state[:, 12:] = rng.integers(0, 2, size=(B, 2))
    chunk = p["fws"] + 1
    raw_act = rng.uniform(st["action"]["min"], st["action"]["max"], size=(B, chunk, p["a_real"]))
    grip = ~np.array(st["action"]["mask"])
    raw_act[..., grip] = rng.integers(0, 2, size=raw_act[..., grip].shape)
    state = model_state(p, stats, raw_state, normalizer)
    state = np.pad(state, ((0, 0), (0, p["S"] - state.shape[1])))[:, None]
    a_model = raw_act.copy()
    lo, hi = np.asarray(st["action"]["min"]), np.asarray(st["action"]["max"])
    for d in np.flatnonzero(~grip):
        one = normalizer("min_max", {"min": [lo[d]], "max": [hi[d]]})
        a_model[..., d] = one.forward(torch.from_numpy(raw_act[..., d : d + 1]))[..., 0].numpy()
    if p["tag"] != "franka":
        a_model[..., grip] = (raw_act[..., grip] > 0.5).astype(np.float64)
    act16 = np.zeros((B, chunk, p["A"]), np.float16)
    act16[..., : p["a_real"]] = a_model
    mask = np.zeros_like(act16, dtype=bool)
    mask[..., : p["a_real"]] = True
    tiled = np.concatenate(list(np.moveaxis(frames, 2, 0)), axis=-2).transpose(0, 1, 4, 2, 3)  # B,T,3,H,V*W
    images = np.ascontiguousarray(tiled).astype(np.float32) / 255.0
    state16 = state.astype(np.float16)
    batch = [dict(image=[torch.from_numpy(images[b, t]) for t in range(T)], lang=p["prompts"][b], action=act16[b],
                  state=state16[b], action_mask=mask[b]) for b in range(B)]
    return batch, dict(frames=tiled, state=state16[:, 0], action=act16, mask=mask)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--original-root", type=Path, required=True)
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    ap.add_argument("--steps", type=int, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not (args.base / "model_index.json").is_file():
        write_tiny_base(args.base)
    root, out, p = args.original_root.resolve(), args.out.resolve(), PRESETS[args.preset]
    sys.path.insert(0, str(root))  # the original is a checkout, not a package (see _parity_original)
    os.chdir(root)
    for name in ("pytorch3d", "pytorch3d.transforms"):
        sys.modules.setdefault(name, types.ModuleType(name))
        sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    from accelerate import Accelerator
    from DiT4DiT.dataloader.gr00t_lerobot.transform.state_action import Normalizer
    from DiT4DiT.model.framework import build_framework
    from DiT4DiT.model.modules.action_model import ActionDiT
    from DiT4DiT.training.trainer_utils.config_tracker import wrap_config
    from DiT4DiT.training.trainer_utils.trainer_tools import TrainerUtils, build_param_lr_groups
    from omegaconf import OmegaConf
    from transformers import get_scheduler

    run = out / "run"
    cfg = original_config(root, args.base.resolve(), p, run)
    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([
        f"trainer.max_train_steps={args.steps}", f"trainer.num_warmup_steps={WARMUP}",
        "framework.action_model.diffusion_model_cfg.dropout=0.0",
    ]))
    cfg = wrap_config(cfg)
    ActionDiT.DiTConfig["DiT-T"] = dict(TINY_DIT)
    torch.manual_seed(0)
    model = build_framework(cfg)
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), run / "checkpoints" / "steps_0_pytorch_model.pt")

    # train.py setup_optimizer_and_scheduler, then prepare_training's freezing and prepare
    t = cfg.trainer
    optimizer = torch.optim.AdamW(build_param_lr_groups(model=model, cfg=cfg), lr=t.learning_rate.base,
                                  betas=tuple(t.optimizer.betas), weight_decay=t.optimizer.weight_decay, eps=t.optimizer.eps)
    lr_scheduler = get_scheduler(name=t.lr_scheduler_type, optimizer=optimizer, num_warmup_steps=t.num_warmup_steps,
                                 num_training_steps=t.max_train_steps, scheduler_specific_kwargs=t.scheduler_specific_kwargs)
    model = TrainerUtils.freeze_backbones(model, freeze_modules=t.freeze_modules)
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)

    rng = np.random.default_rng(1)
    stats = statistics(p, rng)
    st = stats[p["tag"]]
    names = [f"condition_{b}" for b in range(B)] + ["feature", "video_time", "video", "video_fill", "action", "action_beta"]
    rows = []
    torch.manual_seed(3)
    for k in range(args.steps):
        batch, arrays = make_batch(p, st, stats, rng, Normalizer)
        lrs = {g["name"]: float(g["lr"]) for g in optimizer.param_groups}
        with NoiseTape() as tape, accelerator.accumulate(model):  # VLATrainer._train_step
            with torch.enable_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                output = model.forward(batch)
                action_loss, video_loss = output["action_loss"], output["future_video_loss"]
                scale = float(getattr(getattr(t, "loss_scale", None), "future_video", 1.0))
                total = action_loss + video_loss * scale
                accelerator.backward(total)
            if accelerator.sync_gradients:
                norm = accelerator.clip_grad_norm_(model.parameters(), t.gradient_clipping)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad(set_to_none=True)
        np.savez(out / f"batch_{k}.npz", **arrays)
        np.savez(out / f"noise_{k}.npz", **tape.named(names))
        rows.append(dict(action_loss=float(action_loss), video_loss=float(video_loss), total_loss=float(total),
                         grad_norm=float(norm), lr=lrs))
    torch.save(accelerator.unwrap_model(model).state_dict(), run / "checkpoints" / f"steps_{args.steps}_pytorch_model.pt")
    cfg.save_accessed_config(run / "config.yaml", use_original_values=False)
    (run / "dataset_statistics.json").write_text(json.dumps(stats, indent=2))
    (out / "prompts.json").write_text(json.dumps(p["prompts"]))
    trainable = [n for n, q in accelerator.unwrap_model(model).named_parameters() if q.requires_grad]
    (out / "steps.json").write_text(json.dumps(dict(steps=rows, trainable=trainable), indent=1))
    print(json.dumps(rows[-1]))


if __name__ == "__main__":
    main()
