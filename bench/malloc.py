"""CPU allocator churn: training-step time and page faults per step with and without the glibc
malloc settings ``device.configure_host_allocator`` applies at start-up of every entry point.

    python bench/malloc.py [--config configs/robotwin/dit4dit_robotwin_tiny.yaml] [--steps 30] [--rounds 3]
    python bench/malloc.py --smoke   # seconds: one default/tuned pair, 2 steps of batch 2

Each measurement is a fresh subprocess (malloc settings are process-wide and cannot be undone):
``default`` leaves glibc as it is, ``tuned`` calls ``configure_host_allocator()`` first (32 MiB
mmap threshold, 256 MiB trim threshold). Both run the same training step (forward + backward +
AdamW on one random batch, 1 thread, as ``bench/train_step.py``) and the same
``predict_action`` call, and the model's VAE encoding a training batch's clips alone (the buffers
that churn most), alternating default / tuned for ``--rounds`` rounds so machine noise hits both
alike. Page faults are ``resource.getrusage`` minor + major faults over the timed calls. Any
MALLOC_* variable in the environment is removed for ``default`` and kept out of ``tuned``.
Measured on the 2-core host, batch 8: about 3000-8000 faults per VAE encode with glibc's defaults
(it trims in bursts, every few encodes), 0-100 tuned; a loaded host once showed 538 tuned (page
reclaim from outside). This measurement was a unit test (tests/test_host_allocator.py) until it
proved load-dependent; that file now checks the mechanism (where a freed buffer goes) instead.

The last line is ``speedup: X.XX`` = default / tuned median training-step time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TINY = HERE.parent / "configs/robotwin/dit4dit_robotwin_tiny.yaml"
MODES = ("default", "tuned")


def faults() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt + r.ru_majflt


def child(args: argparse.Namespace) -> None:
    """One measurement in this process; prints one JSON line."""
    from dit4dit_npu import device as dev

    applied = dev.configure_host_allocator() if args.mode == "tuned" else {}
    import torch
    from _common import bench_spec

    from dit4dit_npu.config import load_config
    from dit4dit_npu.models.prompt_cache import PromptCache
    from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder
    from dit4dit_npu.weights.testing import make_batch

    torch.set_num_threads(1)
    dev.seed_everything(0)
    cfg = load_config(args.config)
    spec = bench_spec(cfg)
    model = build_dit4dit(cfg, spec)
    batch = make_batch(spec, batch_size=args.batch_size)
    cache = PromptCache()
    cache.build(batch.instruction, build_prompt_encoder(cfg))
    model.set_prompt_cache(cache)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    lam = cfg.trainer.loss_scale.future_video
    model.train()

    def step() -> None:
        out = model(batch)
        opt.zero_grad(set_to_none=True)
        (out["action_loss"] + lam * out["video_loss"]).backward()
        opt.step()

    obs = make_batch(spec, batch_size=1, training=False)
    from dit4dit_npu.models.vae import vae_latents

    vae = model.backbone.vae
    video = batch.frames.permute(0, 2, 1, 3, 4).float() / 127.5 - 1  # (B, 3, T, H, W) in [-1, 1]

    def encode() -> None:
        with torch.no_grad():
            vae_latents(vae, video)

    def timed(fn, n: int) -> dict:
        for _ in range(3):  # warm-up: optimizer state, first-touch of every buffer
            fn()
        f0, wall, cpu = faults(), [], []
        for _ in range(n):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        return {"wall": wall, "cpu": cpu, "faults": (faults() - f0) / n}

    print(json.dumps({
        "mode": args.mode, "applied": applied, "step": timed(step, args.steps),
        "act": timed(lambda: model.predict_action(obs, seed=0), args.steps),
        "encode": timed(encode, args.steps),
    }))


def run_child(mode: str, args: argparse.Namespace) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(OMP_NUM_THREADS="1", DIT4DIT_DEVICE="cpu", HF_HUB_OFFLINE="1", KINETO_LOG_LEVEL="5")
    # the package of this checkout (the bench measures the code it ships with)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--config", str(args.config),
           "--steps", str(args.steps), "--batch-size", str(args.batch_size)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=HERE)
    if r.returncode != 0:
        raise SystemExit(f"{mode} child failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(TINY))
    p.add_argument("--steps", type=int, default=30, help="timed steps per process (after 3 warm-up)")
    p.add_argument("--rounds", type=int, default=3, help="default/tuned process pairs")
    p.add_argument("--batch-size", type=int, default=8, help="the tiny config's per-device batch")
    p.add_argument("--child", choices=MODES, default=None, help=argparse.SUPPRESS)
    p.add_argument("--smoke", action="store_true", help="a seconds-long run at tiny sizes (overrides the size options): checks that the bench works; its numbers mean nothing")
    args = p.parse_args()
    if args.smoke:
        args.config, args.steps, args.rounds, args.batch_size = str(TINY), 2, 1, 2
    if args.child:
        args.mode = args.child
        child(args)
        return
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            runs[mode].append(run_child(mode, args))
    print(f"config {Path(args.config).name}, batch {args.batch_size}, 1 thread, {args.rounds} x {args.steps} "
          f"steps per mode; tuned applied {runs['tuned'][0]['applied']}")
    print(f"{'':<18} {'wall ms p50':>12} {'p90':>8} {'CPU ms p50':>11} {'p90':>8} {'faults/call':>12}")
    cpu = {}
    for what, label in (("step", "train step"), ("act", "predict_action"), ("encode", "VAE encode")):
        for mode in MODES:
            wall = [t * 1e3 for r in runs[mode] for t in r[what]["wall"]]
            used = [t * 1e3 for r in runs[mode] for t in r[what]["cpu"]]
            flt = statistics.mean(r[what]["faults"] for r in runs[mode])
            cpu[what, mode] = statistics.median(used)
            print(f"{label + ' ' + mode:<18} {statistics.median(wall):>12.1f} {_p90(wall):>8.1f} "
                  f"{cpu[what, mode]:>11.1f} {_p90(used):>8.1f} {flt:>12.0f}")
    print("CPU ms = the process's CPU time per call (user + system, page faults included): unlike wall time it")
    print("does not count waiting for a core, so it stays comparable on a loaded machine (1 thread: equal when idle)")
    print("speedup = training step, median CPU time per step, default glibc malloc / tuned (configure_host_allocator)")
    print(f"speedup: {cpu['step', 'default'] / cpu['step', 'tuned']:.2f}")


def _p90(xs: list[float]) -> float:
    return sorted(xs)[int(0.9 * (len(xs) - 1))]


if __name__ == "__main__":
    from dit4dit_npu.console import run  # user errors: one line, exit code 2

    raise SystemExit(run(main))
