"""Training memory of full fine-tuning vs LoRA (``framework.cosmos25.lora``), measured.

    python bench/lora_memory.py [--rank 16] [--batch 2] [--threads 2]
    python bench/lora_memory.py --smoke   # seconds: the tiny config only, batch 1, rank 4, 1 step

For the tiny config (``configs/robotwin/dit4dit_robotwin_tiny.yaml``) and the CPU medium model
(``bench/medium.yaml``), each trained jointly (video + action losses) both ways, the same model
built by ``build_dit4dit`` (LoRA: peft adapters on the config's target modules, base transformer
frozen), the same batch, the trainer's own AdamW (``train/optim.py``):
- trainable parameters (LoRA: adapters + action head; full: transformer + action head);
- resident memory: every weight (trained and frozen; under LoRA the base transformer weights
  are still resident, only no longer trained) and AdamW's state after a step (two fp32 moments
  per trained parameter), counted from the tensors themselves;
- the step's peak on top of that (forward, backward, optimizer step, gradients freed after):
  the allocator's peak on an accelerator; on CPU the high-water mark of the profiler's
  alloc/free events (``_common.step_peak_mib``, as ``bench/train_step.py``), median of
  ``--repeats`` steps after a warm-up step (AdamW allocates its state at its first step).

No ZeRO partitioning here (one process): under ZeRO-2 the optimizer state and gradient
partitions shrink by the world size for both ways alike. The full-size model needs an
accelerator (none is lent to this project's CPU hosts); the memory planner (``dit4dit-memory-plan``) plans it.

The last line is ``speedup: X.XX``: a MEMORY ratio, not a time ratio: total training memory
(resident + step peak) of full fine-tuning / LoRA, at the medium config.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import torch
from _common import bench_spec, step_peak_mib

from dit4dit_npu import device as dev
from dit4dit_npu.config import load_config
from dit4dit_npu.console import run
from dit4dit_npu.models.prompt_cache import PromptCache
from dit4dit_npu.train.optim import build_optimizer
from dit4dit_npu.weights import build_dit4dit, build_prompt_encoder
from dit4dit_npu.weights.testing import make_batch

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # quiet profiler sessions

HERE = Path(__file__).resolve().parent
CONFIGS = {"tiny": HERE.parent / "configs/robotwin/dit4dit_robotwin_tiny.yaml", "medium": HERE / "medium.yaml"}
MIB = 2**20


def tensor_mib(tensors) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / MIB


def measure(config: Path, lora_rank: int, batch_size: int, repeats: int) -> dict[str, float]:
    """One way of training one config: parameter counts and memory in MiB."""
    dev.seed_everything(0)
    overrides = ["framework.cosmos25.training=joint", f"framework.cosmos25.lora.rank={lora_rank}"]
    cfg = load_config(config, overrides)
    spec = bench_spec(cfg)
    device = dev.get_device()
    model = build_dit4dit(cfg, spec).to(device).train()
    batch = make_batch(spec, batch_size=batch_size).to(device)
    cache = PromptCache()
    cache.build(batch.instruction, build_prompt_encoder(cfg))  # the encoder is freed after
    model.set_prompt_cache(cache.to(device))
    opt = build_optimizer(model, cfg.trainer)
    weight = cfg.trainer.loss_scale.future_video

    def step() -> None:
        out = model(batch)
        (out["action_loss"] + weight * out["video_loss"]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # AdamW allocates its moments at its first step: measure the steady state after it
    peaks = [step_peak_mib(step)[0] for _ in range(repeats)]
    trained = [p for p in model.parameters() if p.requires_grad]
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    row = {
        "trainable": sum(p.numel() for p in trained),
        "transformer": sum(p.numel() for p in model.backbone.transformer.parameters()),
        "weights": tensor_mib(model.parameters()),
        "optimizer": tensor_mib(state),
        "gradients": tensor_mib(trained),  # transient, inside the step peak
        "step_peak": statistics.median(peaks),
    }
    row["total"] = row["weights"] + row["optimizer"] + row["step_peak"]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = rank)")
    p.add_argument("--batch", type=int, default=2, help="samples per step")
    p.add_argument("--repeats", type=int, default=3, help="measured steps (median)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--smoke", action="store_true", help="a seconds-long run at tiny sizes (overrides the size options): checks that the bench works; its numbers mean nothing")
    args = p.parse_args()
    configs = CONFIGS
    if args.smoke:  # the headline below is then the tiny config's ratio
        args.rank, args.batch, args.repeats, args.threads = 4, 1, 1, 1
        configs = {"tiny": CONFIGS["tiny"]}
    torch.set_num_threads(args.threads)
    print(f"device: {dev.describe()}; batch {args.batch}; LoRA rank {args.rank} on the default target modules")
    ratio = {}
    for name, config in configs.items():
        rows = {"full": measure(config, 0, args.batch, args.repeats), "lora": measure(config, args.rank, args.batch, args.repeats)}
        print(f"\n== {name} ({config.relative_to(HERE.parent)}): transformer {rows['full']['transformer']:,} parameters ==")
        print(f"{'':<6} {'trainable':>12} {'weights MiB':>12} {'AdamW MiB':>10} {'grads MiB':>10} "
              f"{'step peak MiB':>14} {'total MiB':>10}")
        for way, r in rows.items():
            print(f"{way:<6} {r['trainable']:>12,} {r['weights']:>12.2f} {r['optimizer']:>10.2f} "
                  f"{r['gradients']:>10.2f} {r['step_peak']:>14.2f} {r['total']:>10.2f}")
        ratio[name] = rows["full"]["total"] / rows["lora"]["total"]
        print(f"trainable parameters / {rows['full']['trainable'] / rows['lora']['trainable']:.1f}, "
              f"AdamW state / {rows['full']['optimizer'] / rows['lora']['optimizer']:.1f}, "
              f"total training memory full / LoRA = {ratio[name]:.2f}")
    print("\nfull size: not measured (needs an accelerator; none is lent to this project's hosts)")
    print("speedup = total training memory (resident + step peak), full fine-tuning / LoRA, medium config "
          "(a memory ratio, not a time ratio)")
    print(f"speedup: {ratio['tiny' if args.smoke else 'medium']:.2f}")


if __name__ == "__main__":
    raise SystemExit(run(main))  # user errors: one line, exit code 2 (dit4dit_npu.console)
