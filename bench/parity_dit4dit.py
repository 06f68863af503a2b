"""Numerical parity of an imported DiT4DiT checkpoint with the original implementation itself.

    python bench/parity_dit4dit.py --original-root /path/to/DiT4DiT \\
        --original-python /path/to/dit4dit-venv/bin/python [--work DIR] [--presets libero robotwin]
        [--train-steps N]
    python bench/parity_dit4dit.py --smoke [--original-root ... --original-python ...]

The original needs its own virtualenv (it runs on diffusers 0.37 and transformers 4.x, not on
this project's versions): python 3.11 with torch, torchvision, diffusers==0.37.1,
transformers==4.57.6, accelerate, omegaconf, einops, safetensors, numpy, pandas, pyarrow, rich,
tqdm, pillow, msgpack, websockets, pydantic, numpydantic, opencv-python-headless, matplotlib,
albumentations==1.4.18, av (see README "Coming from DiT4DiT"). Two interpreters exchange files:

1. the original's (``bench/_parity_original.py``, importing the original from ``--original-root``,
   never copying it): writes a tiny random Cosmos-Predict2.5 folder, builds the original model on
   it, saves its run folder in the original's format (``steps_1000_pytorch_model.pt``,
   ``config.yaml``, ``dataset_statistics.json``), runs ``predict_action`` on a robot observation
   (through its LIBERO client's un-normalization; RoboTwin: its dataset transform's inverse) and
   one training forward on a batch, recording every random draw;
2. this one: converts the run with ``python -m dit4dit_npu.convert dit4dit``, loads the policy
   with ``DiT4DiTPolicy.from_pretrained``, predicts on the same observation with the same noise
   (``predict_action(obs, noise=...)``) and computes the losses of the same batch with the same
   noise, and prints the max absolute differences (target <= 1e-4, fp32, CPU);
3. ``--train-steps N`` instead: the original trains N steps (``bench/_parity_original_train.py``:
   its parameter groups and LRs, AdamW settings, warmup + cosine schedule, gradient clipping,
   freeze list, repeated diffusion steps), its initial and final weights are imported, and ours
   trains from the initial ones on its batches with its draws through ``dit4dit_npu.train``'s
   optimizer, schedule, freezing, objective and micro-step; printed: the max relative differences
   of the per-step losses, gradient norms (before clipping) and group LRs, and of the final
   trainable weights (target 1e-5; last line ``max rel diff: X``). ``--smoke``: 2 steps, libero;
4. after the one-call comparison, the imported policy is exported back
   (``convert to-dit4dit``), loaded by the original's own ``from_pretrained``
   (``bench/_parity_original_load.py``) and run on the same observation and draws: column
   ``export, its reload`` is max |its normalized actions - its first reply|.

Presets: ``libero`` (2 views, interleaved sin/cos state, gripper passed raw and binarized by the
client, min-max actions clipped) and ``robotwin`` (3 views, DiT4DiT's [L6, R6, Lg, Rg] order
against the robot's [L6, Lg, R6, Rg], min-max joints, binary grippers, an 8-frame clip of which
its VAE used 5). The last line is ``max abs diff: X`` (exit code 1 above the target).
``--smoke`` runs 2 training steps of the libero preset; without ``--original-root`` it prints one line saying
that it was skipped, and exits 0 (the original is an external checkout with its own virtualenv).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
TARGET = 1e-4
TRAIN_TARGET = 1e-5  # relative: per-step losses, LRs, final trainable weights
# Shown, outside the target: an absolute difference, and a ratio whose floor is fp32 rounding of the
# weights over the size of N small updates (see train_compare).
INFORMATIVE = ("key biases abs", "updates")
# Its RoboTwin statistics carry the generic tag new_embodiment: the robot type is given.
ROBOT_TYPE = {"libero": "libero_franka", "robotwin": "robotwin"}


def run_original(python: str, root: Path, base: Path, out: Path, preset: str, script: str = "_parity_original.py",
                 extra: list[str] | None = None) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", NO_ALBUMENTATIONS_UPDATE="1")
    cmd = [python, str(REPO / "bench" / script), "--original-root", str(root), "--base", str(base),
           "--out", str(out), "--preset", preset, *(extra or [])]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the original failed on preset {preset}:\n{done.stderr[-3000:]}")


def convert(run: Path, base: Path, policy: Path, preset: str, step: int = 1000) -> None:
    """Its tiny head ("DiT-T", an entry of its size table) is read from the config it states."""
    cmd = [sys.executable, "-m", "dit4dit_npu.convert", "dit4dit",
           "--checkpoint", str(run / "checkpoints" / f"steps_{step}_pytorch_model.pt"), "--config",
           str(run / "config.yaml"), "--base-model", str(base), "--out", str(policy), "--image-size", "32", "32",
           "--robot-type", ROBOT_TYPE[preset],
           # the original's run is a few synthetic frames: a joint that never moved has min == max
           # (refused by default), and the comparison must keep the original's formula for it
           "--allow-constant-dims"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the conversion failed: {done.stderr.strip()}")


def compare(out: Path) -> dict[str, float]:
    """Ours on the original's observation / batch / noise -> max |ours - original| per output."""
    from dit4dit_npu import DiT4DiTPolicy

    policy = DiT4DiTPolicy.from_pretrained(out / "policy", device="cpu")
    prompts = json.loads((out / "prompts.json").read_text())
    policy.add_instructions(prompts)
    b = len(prompts)

    obs = np.load(out / "observation.npz")
    o = {key: obs["frames"][:, v] for v, key in enumerate(policy.camera_keys)} | {"state": obs["state"], "instruction": prompts}
    npred = np.load(out / "noise_predict.npz")
    noise = dict(
        condition=np.concatenate([npred[f"condition_{i}"][:, :, :1] for i in range(b)]),  # latent 0's eps
        feature=npred["feature"],
        action=npred["action"],
    )
    actions = policy.predict_action(o, noise=noise)
    with torch.no_grad():
        normalized = policy.model.predict_action(policy.io.encode_observation(o)[0], noise=noise).numpy()

    bt, ntr = np.load(out / "batch.npz"), np.load(out / "noise_train.npz")
    batch, train_noise = training_call(policy.model, policy.io, policy.manifest, prompts, bt, ntr)
    with torch.no_grad():
        losses = policy.model(batch, noise=train_noise)
    return {
        "normalized actions": float(np.abs(normalized - obs["normalized"]).max()),
        "robot actions": float(np.abs(actions - obs["actions"]).max()),
        "action loss": abs(float(losses["action_loss"]) - float(bt["action_loss"])),
        "video loss": abs(float(losses["video_loss"]) - float(bt["video_loss"])),
    }


def export_check(python: str, root: Path, out: Path) -> float:
    """Ours -> its format (``convert to-dit4dit``) -> its own ``from_pretrained`` -> its
    ``predict_action`` on the recorded observation and draws: max |that - its original reply|."""
    export = out / "export"
    if export.exists():
        shutil.rmtree(export)
    cmd = [sys.executable, "-m", "dit4dit_npu.convert", "to-dit4dit", str(out / "policy"), "--out", str(export),
           "--action-model-type", "DiT-T"]  # its size table's tiny entry, which the harness adds on its side
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the export failed: {done.stderr.strip()}")
    ckpt = next((export / "checkpoints").glob("steps_*_pytorch_model.pt"))
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", NO_ALBUMENTATIONS_UPDATE="1")
    cmd = [python, str(REPO / "bench" / "_parity_original_load.py"), "--original-root", str(root), "--checkpoint",
           str(ckpt), "--out", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the original could not load or run the export:\n{done.stderr[-3000:]}")
    return float(np.abs(np.load(out / "normalized_export.npy") - np.load(out / "observation.npz")["normalized"]).max())


def training_call(model, io, manifest, prompts: list[str], bt, ntr) -> tuple:
    """Its batch (as its dataloader emitted it) and its recorded draws of one training forward ->
    our ``Batch`` and ``TrainingNoise`` fields."""
    from dit4dit_npu.batch import Batch

    b, r = len(prompts), model.action_model.repeats
    noise_s = manifest.framework.action_model.noise_s
    noise = dict(
        condition=np.concatenate([ntr[f"condition_{i}"][:, :, :1] for i in range(b)]),
        feature=ntr["feature"],
        video_time=ntr["video_time"],
        video=ntr["video"],
        # its R repeats are batch-tiled rows r * B + b; ours name them (b, r)
        action=ntr["action"].reshape(r, b, *ntr["action"].shape[1:]).swapaxes(0, 1),
        action_time=(ntr["action_beta"] / np.float32(noise_s)).reshape(r, b).T,
    )
    batch = Batch(
        frames=torch.from_numpy(bt["frames"][:, : io.spec.num_frames]),  # the 1 + 4k frames its VAE used
        instruction=prompts,
        state=torch.from_numpy(bt["state"].astype(np.float32)),
        action=torch.from_numpy(bt["action"].astype(np.float32)),
        action_mask=torch.from_numpy(bt["mask"]),
    )
    return batch, noise


def train_compare(out: Path, steps: int) -> dict[str, float]:
    """Our trainer's pieces on the original's initial weights, batches and noise, N steps ->
    max relative differences of the per-step losses, the group LRs and the final trainable weights.

    The optimizer, LR schedule, freezing, objective and micro-step (backward, clip, step) are the
    ones ``dit4dit_npu.train`` uses, on a plain (no DeepSpeed) CPU accelerator, as the original's
    side runs; only the data stream is replaced by its recorded batches and draws."""
    from types import SimpleNamespace

    from dit4dit_npu import DiT4DiTPolicy
    from dit4dit_npu.config import load_config
    from dit4dit_npu.policy.folder import load_policy_folder
    from dit4dit_npu.train import distributed
    from dit4dit_npu.train.optim import build_optimizer, build_scheduler, freeze_modules
    from dit4dit_npu.train.trainer import Trainer

    prompts = json.loads((out / "prompts.json").read_text())
    policy = DiT4DiTPolicy.from_pretrained(out / "policy_0", device="cpu")
    policy.add_instructions(prompts)  # the prompt cache our training fills at its start
    cfg = load_config(out / "policy_0" / "train_config.yaml", ["trainer.deepspeed_config=null"])
    accelerator = distributed.build_accelerator(cfg)
    model = policy.model.train()  # Trainer.session
    freeze_modules(model, cfg.trainer.freeze_modules)
    optimizer = build_optimizer(model, cfg.trainer)
    scheduler = build_scheduler(optimizer, cfg.trainer)
    model, optimizer = accelerator.prepare(model, optimizer)
    trainer = SimpleNamespace(cfg=cfg)  # what Trainer._losses reads: the objective's weighting
    initial = {k: v.clone() for k, v in distributed.unwrap(model).trainable_state_dict().items()}
    recorded = json.loads((out / "steps.json").read_text())
    theirs = recorded["steps"]
    if len(initial) != len(recorded["trainable"]):  # the same tensors train on both sides
        raise SystemExit(f"{len(initial)} trainable tensors here, {len(recorded['trainable'])} in the original")
    worst = dict.fromkeys(["action loss", "video loss", "total loss", "grad norm", "lr"], 0.0)
    for k in range(steps):
        bt, ntr = np.load(out / f"batch_{k}.npz"), np.load(out / f"noise_{k}.npz")
        batch, noise = training_call(distributed.unwrap(model), policy.io, policy.manifest, prompts, bt, ntr)
        lrs = sorted(float(g["lr"]) for g in optimizer.param_groups)

        def forward(b, noise=noise):
            losses = Trainer._losses(trainer, model(b, noise=noise))
            return losses, losses["total_loss"]

        losses, norm = distributed.micro_step(accelerator, model, optimizer, forward, batch, cfg.trainer.gradient_clipping)
        scheduler.step()
        row = theirs[k]
        for name, ours, ref in [("action loss", losses["action_loss"], row["action_loss"]),
                                ("video loss", losses["video_loss"], row["video_loss"]),
                                ("total loss", losses["total_loss"], row["total_loss"]), ("grad norm", norm, row["grad_norm"])]:
            worst[name] = max(worst[name], abs(float(ours) - ref) / abs(ref))
        for ours, ref in zip(lrs, sorted(row["lr"].values()), strict=True):
            worst["lr"] = max(worst["lr"], abs(ours - ref) / max(abs(ref), 1e-30))
    final = distributed.unwrap(model).trainable_state_dict()
    reference = load_policy_folder(out / f"policy_{steps}").model.trainable_state_dict()
    if sorted(final) != sorted(reference):
        raise SystemExit(f"trainable tensors differ: {sorted(set(final) ^ set(reference))[:5]}")
    # Attention key biases get no gradient in exact arithmetic (q.b is the same for every key of a
    # query: softmax ignores it), so what they receive is rounding noise, which Adam scales up to
    # ~1e-7 a step: compared in absolute terms, apart (the other tensors move ~lr = 1e-5..1e-4 a step).
    null = sorted(n for n in reference if n.endswith("to_k.bias"))
    worst["key biases abs"] = max((float((final[n] - reference[n]).abs().max()) for n in null), default=0.0)
    kept = [n for n in reference if n not in null]
    worst["weights"] = max(float((final[n] - reference[n]).abs().max() / reference[n].abs().max()) for n in kept)
    # stricter: the difference of what N steps changed, relative to that change (all tensors at once)
    moved = torch.cat([(reference[n] - initial[n]).flatten() for n in kept])
    error = torch.cat([(final[n] - reference[n]).flatten() for n in kept])
    worst["updates"] = float(error.norm() / moved.norm())
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--original-root", type=Path, help="a checkout of Mondo-Robotics/DiT4DiT (required unless --smoke)")
    ap.add_argument("--original-python", default=sys.executable,
                    help="python of a virtualenv that runs the original (diffusers 0.37, transformers 4.x)")
    ap.add_argument("--work", type=Path, help="working folder (default: a temporary one)")
    ap.add_argument("--presets", nargs="+", choices=["libero", "robotwin"],
                    help="default: both (one call); libero (training)")
    ap.add_argument("--train-steps", type=int, metavar="N",
                    help="compare N training steps (optimizer, schedule, clipping, freezing) instead of one call")
    ap.add_argument("--smoke", action="store_true",
                    help="2 training steps on libero (minutes: both sides still build, save and import the model); "
                         "without --original-root: say it was skipped and exit 0")
    args = ap.parse_args(argv)
    if args.smoke:
        if args.original_root is None:
            print("parity_dit4dit --smoke: skipped: needs a checkout of the original DiT4DiT (--original-root DIR) "
                  "and a python that runs it (--original-python)")
            return 0
        args.train_steps, args.presets = 2, ["libero"]
    elif args.original_root is None:
        ap.error("--original-root is required (a checkout of Mondo-Robotics/DiT4DiT)")
    if args.train_steps is not None and args.train_steps < 1:
        ap.error("--train-steps: expected N >= 1")
    training = args.train_steps is not None
    presets = args.presets or (["libero"] if training else ["libero", "robotwin"])
    torch.set_num_threads(1)
    work = args.work or Path(tempfile.mkdtemp(prefix="parity_dit4dit_"))
    base = work / "tiny_cosmos25"
    root = args.original_root.resolve()
    rows, started = {}, time.perf_counter()
    for preset in presets:
        if training:
            out, n = work / f"{preset}_train{args.train_steps}", args.train_steps
            run_original(args.original_python, root, base, out, preset, "_parity_original_train.py", ["--steps", str(n)])
            for step in (0, n):  # its initial and final weights, through the import
                convert(out / "run", base, out / f"policy_{step}", preset, step)
            rows[preset] = train_compare(out, n)
        else:
            out = work / preset
            run_original(args.original_python, root, base, out, preset)
            convert(out / "run", base, out / "policy", preset)
            rows[preset] = compare(out) | {"export, its reload": export_check(args.original_python, root, out)}
    names = list(next(iter(rows.values())))
    print(f"{'preset':<10}" + "".join(f"{n:>20}" for n in names))
    for preset, row in rows.items():
        print(f"{preset:<10}" + "".join(f"{row[n]:>20.3g}" for n in names))
    worst = max(v for row in rows.values() for n, v in row.items() if n not in INFORMATIVE)
    elapsed = time.perf_counter() - started
    if training:
        print(f"{args.train_steps} steps in {elapsed:.0f} s (both sides, conversions included)")
        print(f"max rel diff: {worst:.3g} (target <= {TRAIN_TARGET:g}, fp32 CPU)")
        return 0 if worst <= TRAIN_TARGET else 1
    print(f"max abs diff: {worst:.3g} (target <= {TARGET:g}, fp32 CPU)")
    return 0 if worst <= TARGET else 1

if __name__ == "__main__":
    from dit4dit_npu.console import run  # user errors: one line, exit code 2

    raise SystemExit(run(main))
