"""``trainer.compile`` / ``--compile`` (torch.compile of each Cosmos block, ``dit4dit_npu/weights/compile.py``):
eager vs compiled, same model, same batch, in one process.

    python bench/compile.py [--config bench/medium.yaml] [--rounds 7] [--batch-size 2] [--threads 1]
    python bench/compile.py --smoke   # the tiny config, 2 rounds, no new-batch-size probe: checks the script

Two copies of one model (same weights): "eager" as built, "compiled" with its transformer blocks
compiled exactly as the trainer and ``from_pretrained(compile=True)`` do. Timed, in interleaved
rounds (eager, compiled, eager, ...; medians over rounds):
- the training step: ``model(batch)`` + backward + AdamW, uncached (the clip's frames through the
  VAE), batch ``--batch-size`` (each copy has its own optimizer);
- ``DiT4DiT.predict_action`` at batch 1 (the model's part of inference: PolicyIO is not compiled).
The warm-up is reported apart: the first compiled training step and predict_action call (where
inductor compiles) against the eager medians, and then the first compiled call at batch 2 and at
batch 3 (what a new batch size costs: one recompile with the batch dim symbolic, then none). Before
timing, the two copies' losses and actions are compared (same noise). Load average is printed
before and after (the machine may be shared).

The last line is ``speedup: X.XX`` = eager median training step / compiled (the line before names
the reference: the same model, eager).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from pathlib import Path

import torch
from _common import bench_spec, timed

from dit4dit_npu import device as dev
from dit4dit_npu.config import load_config
from dit4dit_npu.console import run
from dit4dit_npu.models.prompt_cache import PromptCache
from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder
from dit4dit_npu.weights.compile import check_compile, compile_backbone
from dit4dit_npu.weights.testing import make_batch

HERE = Path(__file__).resolve().parent
TINY = HERE.parent / "configs/robotwin/dit4dit_robotwin_tiny.yaml"


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    try:  # fused where torch has it (CPU too), as bench/train_step.py
        return torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), fused=True)
    except RuntimeError:
        return torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(HERE / "medium.yaml"))
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (>= 5 for a reported number)")
    p.add_argument("--calls", type=int, default=3, help="predict_action calls per path per round (their median)")
    p.add_argument("--batch-size", type=int, default=2, help="training batch")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="the tiny config, 2 rounds, 1 call, no new-batch-size probe: "
                   "checks the script (its ratio means little)")
    p.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = p.parse_args()
    if args.smoke:
        args.config, args.rounds, args.calls = str(TINY), 2, 1
    check_compile("bench/compile.py")  # one line where this host cannot compile
    torch.set_num_threads(args.threads)
    dev.seed_everything(0)
    cfg = load_config(args.config, args.overrides)
    spec, device = bench_spec(cfg), dev.get_device()
    eager = build_dit4dit(cfg, spec).to(device)
    batch = make_batch(spec, batch_size=args.batch_size)
    obs = {n: make_batch(spec, batch_size=n, seed=10 + n, training=False) for n in (1, 2, 3)}
    cache = PromptCache()
    cache.build(sorted({*batch.instruction, *(t for b in obs.values() for t in b.instruction)}),
                build_prompt_encoder(cfg).to(device))
    eager.set_prompt_cache(cache)
    compiled = copy.deepcopy(eager)
    compiled.set_prompt_cache(cache)
    blocks = compile_backbone(compiled, "bench/compile.py")
    models = {"eager": eager, "compiled": compiled}
    opts = {name: optimizer(m) for name, m in models.items()}
    lam = cfg.trainer.loss_scale.future_video
    print(f"device: {dev.describe()}  threads={args.threads}  config={Path(args.config).name}  "
          f"training batch {args.batch_size} (uncached), predict_action batch 1; {blocks} blocks compiled, "
          f"torch {torch.__version__}")
    print(f"load average before: {load_average()}")

    def train(name: str) -> torch.Tensor:
        m, opt = models[name], opts[name]
        m.train()
        torch.manual_seed(1)  # the same noise for both copies
        out = m(batch)
        loss = out["action_loss"] + lam * out["video_loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    def predict(name: str, n: int = 1, seed: int = 0) -> torch.Tensor:
        return models[name].predict_action(obs[n], seed=seed)

    # warm-up, eager first (its allocations, optimizer state); the compiled copy's first calls compile.
    # The first step of each copy also serves as the equality check: identical weights and noise.
    first, loss = {}, {}
    for name in models:
        t0 = time.perf_counter()
        loss[name] = train(name)
        dev.synchronize()
        first[name] = time.perf_counter() - t0
    first_predict, actions = {}, {}
    for name in models:
        t0 = time.perf_counter()
        actions[name] = predict(name)
        dev.synchronize()
        first_predict[name] = time.perf_counter() - t0
    loss_diff = abs(loss["compiled"] - loss["eager"]).item() / max(abs(loss["eager"]).item(), 1e-12)
    action_diff = (actions["compiled"] - actions["eager"]).abs().max().item()
    print(f"same results: first-step loss {loss['eager'].item():.6f} eager vs {loss['compiled'].item():.6f} compiled "
          f"(relative difference {loss_diff:.1e}); predict_action max |difference| {action_diff:.1e}")

    steps: dict[str, list[float]] = {n: [] for n in models}
    calls: dict[str, list[float]] = {n: [] for n in models}
    t_rounds = time.perf_counter()
    for r in range(args.rounds):  # interleaved: eager, compiled, eager, ...
        for name in models:
            steps[name].append(timed(lambda: train(name)))  # noqa: B023 (called at once)
        for name in models:
            calls[name].append(statistics.median(
                timed(lambda: predict(name, seed=r)) for _ in range(args.calls)  # noqa: B023
            ))
    took = time.perf_counter() - t_rounds
    step, call = ({n: statistics.median(v[n]) for n in models} for v in (steps, calls))
    print(f"{'':<34}{'eager':>12}{'compiled':>12}{'ratio':>8}   (medians of {args.rounds} interleaved rounds, "
          f"{took:.0f} s)")
    print(f"{'training step, s':<34}{step['eager']:>12.4f}{step['compiled']:>12.4f}"
          f"{step['eager'] / step['compiled']:>7.2f}x")
    print(f"{'predict_action batch 1, ms':<34}{1e3 * call['eager']:>12.2f}{1e3 * call['compiled']:>12.2f}"
          f"{call['eager'] / call['compiled']:>7.2f}x")

    print(f"warm-up (compiling, once per process): first training step {first['compiled']:.1f} s "
          f"(+{first['compiled'] - step['compiled']:.1f} s over its median; eager's first {first['eager']:.2f} s), "
          f"first predict_action {first_predict['compiled']:.1f} s (+{first_predict['compiled'] - call['compiled']:.1f} s)")
    if args.smoke:  # the symbolic-batch recompile is the longest compile of all (minutes on torch 2.7, loaded)
        print("a new batch size: not measured with --smoke")
    else:  # what a new batch size costs the compiled copy (torch's automatic dynamic shapes)
        new_size = {}
        for n in (2, 3):
            t0 = time.perf_counter()
            predict("compiled", n)
            new_size[n] = time.perf_counter() - t0
        eager_3 = statistics.median(timed(lambda: predict("eager", 3)) for _ in range(max(1, args.calls)))
        again_3 = statistics.median(timed(lambda: predict("compiled", 3)) for _ in range(max(1, args.calls)))
        print(f"a new batch size: first compiled predict_action at batch 2 {new_size[2]:.1f} s (recompiles with the "
              f"batch dim symbolic), then batch 3 {new_size[3]:.2f} s (reuses it; eager {eager_3:.3f} s, compiled "
              f"again {again_3:.3f} s)")
    print(f"load average after: {load_average()}")
    print(f"reference: the same model eager (this bench's 'eager' copy), training step batch {args.batch_size} "
          f"uncached at {Path(args.config).stem} size; predict_action ratio {call['eager'] / call['compiled']:.2f}")
    print(f"speedup: {step['eager'] / step['compiled']:.2f}")


if __name__ == "__main__":
    raise SystemExit(run(main))  # user errors: one line, exit code 2 (dit4dit_npu.console)
