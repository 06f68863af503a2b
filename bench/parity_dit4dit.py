"""Numerical parity of an imported DiT4DiT checkpoint with the original implementation itself.

    python bench/parity_dit4dit.py --original-root /path/to/DiT4DiT \\
        --original-python /path/to/dit4dit-venv/bin/python [--work DIR] [--presets libero robotwin]
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
   noise, and prints the max absolute differences (target <= 1e-4, fp32, CPU).

Presets: ``libero`` (2 views, interleaved sin/cos state, gripper passed raw and binarized by the
client, min-max actions clipped) and ``robotwin`` (3 views, DiT4DiT's [L6, R6, Lg, Rg] order
against the robot's [L6, Lg, R6, Rg], min-max joints, binary grippers, an 8-frame clip of which
its VAE used 5). The last line is ``max abs diff: X`` (exit code 1 above the target).
``--smoke`` runs the libero preset only; without ``--original-root`` it prints one line saying
that it was skipped, and exits 0 (the original is an external checkout with its own virtualenv).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
TARGET = 1e-4
# The harness's tiny head ("DiT-T", registered in the original's size table) in our config terms.
HEAD_SIZE = [
    "framework.action_model.action_model_type=DiT-B",
    "framework.action_model.input_embedding_dim=64",
    "framework.action_model.diffusion_model_cfg.num_attention_heads=2",
    "framework.action_model.diffusion_model_cfg.attention_head_dim=32",
]


def run_original(python: str, root: Path, base: Path, out: Path, preset: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", NO_ALBUMENTATIONS_UPDATE="1")
    cmd = [python, str(REPO / "bench" / "_parity_original.py"), "--original-root", str(root), "--base", str(base),
           "--out", str(out), "--preset", preset]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the original failed on preset {preset}:\n{done.stderr[-3000:]}")


def convert(run: Path, base: Path, policy: Path) -> None:
    cmd = [sys.executable, "-m", "dit4dit_npu.convert", "dit4dit",
           "--checkpoint", str(run / "checkpoints" / "steps_1000_pytorch_model.pt"), "--config", str(run / "config.yaml"),
           "--base-model", str(base), "--out", str(policy), "--image-size", "32", "32", *HEAD_SIZE]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the conversion failed: {done.stderr.strip()}")


def compare(out: Path) -> dict[str, float]:
    """Ours on the original's observation / batch / noise -> max |ours - original| per output."""
    from dit4dit_npu import DiT4DiTPolicy
    from dit4dit_npu.batch import Batch

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
    r = policy.model.action_model.repeats
    noise_s = policy.manifest.framework.action_model.noise_s
    train_noise = dict(
        condition=np.concatenate([ntr[f"condition_{i}"][:, :, :1] for i in range(b)]),
        feature=ntr["feature"],
        video_time=ntr["video_time"],
        video=ntr["video"],
        # its R repeats are batch-tiled rows r * B + b; ours name them (b, r)
        action=ntr["action"].reshape(r, b, *ntr["action"].shape[1:]).swapaxes(0, 1),
        action_time=(ntr["action_beta"] / np.float32(noise_s)).reshape(r, b).T,
    )
    batch = Batch(
        frames=torch.from_numpy(bt["frames"][:, : policy.io.spec.num_frames]),  # the 1 + 4k frames its VAE used
        instruction=prompts,
        state=torch.from_numpy(bt["state"].astype(np.float32)),
        action=torch.from_numpy(bt["action"].astype(np.float32)),
        action_mask=torch.from_numpy(bt["mask"]),
    )
    with torch.no_grad():
        losses = policy.model(batch, noise=train_noise)
    return {
        "normalized actions": float(np.abs(normalized - obs["normalized"]).max()),
        "robot actions": float(np.abs(actions - obs["actions"]).max()),
        "action loss": abs(float(losses["action_loss"]) - float(bt["action_loss"])),
        "video loss": abs(float(losses["video_loss"]) - float(bt["video_loss"])),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--original-root", type=Path, help="a checkout of Mondo-Robotics/DiT4DiT (required unless --smoke)")
    ap.add_argument("--original-python", default=sys.executable,
                    help="python of a virtualenv that runs the original (diffusers 0.37, transformers 4.x)")
    ap.add_argument("--work", type=Path, help="working folder (default: a temporary one)")
    ap.add_argument("--presets", nargs="+", default=["libero", "robotwin"], choices=["libero", "robotwin"])
    ap.add_argument("--smoke", action="store_true",
                    help="the libero preset only; without --original-root: say it was skipped and exit 0")
    args = ap.parse_args(argv)
    if args.smoke:
        if args.original_root is None:
            print("parity_dit4dit --smoke: skipped: needs a checkout of the original DiT4DiT (--original-root DIR) "
                  "and a python that runs it (--original-python)")
            return 0
        args.presets = ["libero"]
    elif args.original_root is None:
        ap.error("--original-root is required (a checkout of Mondo-Robotics/DiT4DiT)")
    torch.set_num_threads(1)
    work = args.work or Path(tempfile.mkdtemp(prefix="parity_dit4dit_"))
    base = work / "tiny_cosmos25"
    rows = {}
    for preset in args.presets:
        out = work / preset
        run_original(args.original_python, args.original_root.resolve(), base, out, preset)
        convert(out / "run", base, out / "policy")
        rows[preset] = compare(out)
    names = list(next(iter(rows.values())))
    print(f"{'preset':<10}" + "".join(f"{n:>20}" for n in names))
    for preset, row in rows.items():
        print(f"{preset:<10}" + "".join(f"{row[n]:>20.3g}" for n in names))
    worst = max(v for row in rows.values() for v in row.values())
    print(f"max abs diff: {worst:.3g} (target <= {TARGET:g}, fp32 CPU)")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    from dit4dit_npu.cli import run  # user errors: one line, exit code 2

    raise SystemExit(run(main))
