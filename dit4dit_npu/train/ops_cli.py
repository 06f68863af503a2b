"""The ops tools' commands (train/__init__.py lists the tools): each parses and checks its flags,
then calls its library module.

    python -m dit4dit_npu.train.memory_plan ...    memory_plan_main   (dit4dit-memory-plan)
    python -m dit4dit_npu.train.fit_tiny_vae ...   fit_tiny_vae_main  (dit4dit-fit-tiny-vae)
    python -m dit4dit_npu.train.success_curve ...  success_curve_main (dit4dit-sim-success-curve)
    python -m dit4dit_npu.train.grad_split ...     grad_split_main    (dit4dit-grad-split)

Each module keeps a two-line ``__main__`` block that calls its command here, so the ``python -m``
spellings keep working. A command imports its module (and torch) only when it runs.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from dit4dit_npu.console import entry_point
from dit4dit_npu.errors import DiT4DiTError


@entry_point
def memory_plan_main(argv: list[str] | None = None) -> int:
    from dit4dit_npu.train import memory_plan

    p = argparse.ArgumentParser(prog="python -m dit4dit_npu.train.memory_plan", description=memory_plan.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/robotwin/dit4dit_robotwin.yaml",
                   help="the run config to plan (default: %(default)s)")
    p.add_argument("--zero", type=int, choices=(0, 2, 3), default=2, help="DeepSpeed ZeRO stage (0: one card, no DeepSpeed)")
    p.add_argument("--world-size", type=int, default=8, help="ranks of the run (default: %(default)s)")
    p.add_argument("--batch", type=int, default=None, help="per-card batch (default: the config's)")
    p.add_argument("--instructions", type=int, default=None, help="distinct instructions (default: one per dataset)")
    p.add_argument("--cards", type=float, nargs="+", default=[64, 141], help="card sizes in GB")
    p.add_argument("--latent-cache", action="store_true", help="plan a run from a latent cache (no VAE encode)")
    p.add_argument("--ema", action="store_true", help="plan trainer.ema on (also on when the config sets it)")
    p.add_argument("--check", action="store_true", help="also measure one real step and compare (see check())")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of the measurements (default: %(default)s)")
    p.add_argument("--json", type=Path, metavar="OUT.json",
                   help="also write the per-card totals (bytes) there (what `python -m dit4dit_npu.doctor` reads)")
    p.add_argument("--host", action="store_true",
                   help="plan a CPU host's training process (its peak resident memory) instead of a card")
    p.add_argument("--fits", type=Path, metavar="FITS.json",
                   help="the activation measurements: read there when they are this config's, else measured and written "
                        "there (one measurement, many plans: they do not depend on depth, batch, ZeRO or ranks)")
    p.add_argument("--smoke", action="store_true", help="a seconds-long run at tiny sizes (overrides the size options): checks that the planner works; its numbers mean nothing")
    args = p.parse_args(argv)
    for name in ("world_size", "threads"):
        if getattr(args, name) < 1:
            raise DiT4DiTError(f"--{name.replace('_', '-')}: expected a positive integer, got {getattr(args, name)}")
    if args.batch is not None and args.batch < 1:
        raise DiT4DiTError(f"--batch: expected a positive integer, got {args.batch}")
    for flag, path in (("--json", args.json), ("--fits", args.fits)):  # written after the measuring: said now
        folder = next((f for f in (path, *path.parents) if f.exists()), None) if path is not None else None
        if folder is not None and (folder == path) == folder.is_dir():
            raise DiT4DiTError(f"{flag} {path}: {folder} is a {'folder' if folder.is_dir() else 'file'}, "
                               "expected a file path in a folder")
    return memory_plan.plan(args)


def check_fit_flags(a: argparse.Namespace) -> None:
    """Every flag before the data loads and the minutes of fitting: --steps 0 wrote the random VAE
    as "fitted", --lr nan / --frames 0 were tracebacks, and an output under a file failed after the
    fit (with --png, once the weights were already written)."""
    for name in ("steps", "frames", "batch", "show"):
        if getattr(a, name) < 1:
            raise DiT4DiTError(f"--{name}: expected an int >= 1, got {getattr(a, name)}")
    if not (math.isfinite(a.lr) and a.lr > 0):
        raise DiT4DiTError(f"--lr: expected a finite number > 0, got {a.lr}")
    for flag, path in (("--out", a.out), ("--png", a.png or a.out.with_suffix(".png"))):
        if path.is_dir():
            raise DiT4DiTError(f"{flag} {path} is a folder, expected a file path")
        for folder in path.parents:
            if folder.exists():
                if not folder.is_dir():
                    raise DiT4DiTError(f"{flag} {path}: {folder} is a file, not a folder")
                break


@entry_point
def fit_tiny_vae_main(argv: list[str] | None = None) -> int:
    from dit4dit_npu.train import fit_tiny_vae

    p = argparse.ArgumentParser(prog="dit4dit-fit-tiny-vae", description=fit_tiny_vae.__doc__.splitlines()[0],
                                epilog="overrides: a.b=c (the run config's keys)")
    p.add_argument("--config", required=True, help="the run config whose training frames the VAE is fitted to")
    p.add_argument("--out", type=Path, required=True, help="the fitted weights (.safetensors)")
    p.add_argument("--steps", type=int, default=500, help="optimizer steps of the reconstruction fit")
    p.add_argument("--frames", type=int, default=384, help="training clips to fit on (evenly spaced)")
    p.add_argument("--batch", type=int, default=2, help="clips per step (5-frame clips: ~3 s a step on a shared core)")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    p.add_argument("--show", type=int, default=4, help="held-out frames (evenly spaced) in the PNG and the error")
    p.add_argument("--png", type=Path, default=None, help="default: OUT with .png")
    p.add_argument("--init", type=Path, default=None,
                   help="start from these fitted weights (a fit continued), not the random init")
    p.add_argument("--smoke", action="store_true", help="4 clips, 3 steps: checks that the command runs")
    p.add_argument("overrides", nargs="*", help="config overrides a.b=c")
    a = p.parse_args(argv)
    if a.out.suffix != ".safetensors":
        raise DiT4DiTError(f"--out: expected a .safetensors file, got {a.out}")
    if a.smoke:
        a.frames, a.steps, a.batch, a.show = 4, 3, 2, 2
    check_fit_flags(a)
    fit_tiny_vae.fit_and_save(a)
    return 0


@entry_point
def success_curve_main(argv: list[str] | None = None) -> int:
    from dit4dit_npu.sim.eval import check_episode_timeout
    from dit4dit_npu.sim.tasks import check_seed_range, get_task
    from dit4dit_npu.train import success_curve
    from dit4dit_npu.train.success_curve import intermediate_episodes

    p = argparse.ArgumentParser(prog="python -m dit4dit_npu.train.success_curve", description=success_curve.__doc__.splitlines()[0])
    p.add_argument("--run", type=Path, action="append", required=True,
                   help="a training run folder (with checkpoints/); repeat it for several runs on one figure")
    p.add_argument("--task", default="transfer_cube", help="the scene the run was trained on (default: %(default)s)")
    p.add_argument("--episodes", type=int, default=50, help="episodes per checkpoint (default: %(default)s)")
    p.add_argument("--intermediate-episodes", type=int, default=None, metavar="M",
                   help="episodes for each checkpoint before a run's last (at most --episodes; default: --episodes; "
                        "not with --smoke)")
    p.add_argument("--seed", type=int, default=0, help="first evaluation seed")
    p.add_argument("--replan", type=int, default=None, help="actions executed per query (default: whole chunk)")
    p.add_argument("--workers", type=int, default=1, help="parallel eval processes (default: %(default)s)")
    p.add_argument("--episode-timeout", type=float, default=None, metavar="S",
                   help="with --workers > 1: each eval's deadline for its workers' next result "
                        "(python -m dit4dit_npu.sim.eval's flag; default: its default)")
    p.add_argument("--max-steps", type=int, default=400, help="episode length (ACT: 400)")
    p.add_argument("--out", type=Path, default=Path("docs/aloha_success_vs_steps.png"), help="the plot (default: %(default)s)")
    p.add_argument("--smoke", action="store_true", help="one 16-step episode per checkpoint, plot in the (first) run")
    p.add_argument("--label", action="append", default=None,
                   help="a run's name in the plot (default: its folder name); once per --run, in their order")
    p.add_argument("--x", choices=("step", "time"), default="step",
                   help="the x axis: the training step (default), or the training wall time each checkpoint records "
                        "(minutes; trainer.max_train_time_s's count)")
    p.add_argument("--table", type=Path, default=None, help="also write every checkpoint of every run as a Markdown table")
    a = p.parse_args(argv)
    get_task(a.task)  # an unknown task: one line before any checkpoint is loaded
    for name in ("episodes", "workers", "max_steps"):
        if getattr(a, name) < 1:
            raise DiT4DiTError(f"--{name.replace('_', '-')}: expected a positive integer, got {getattr(a, name)}")
    if a.label is not None and len(a.label) != len(a.run):
        raise DiT4DiTError(f"--label: given {len(a.label)} time(s) for {len(a.run)} --run; give one per run, or none")
    if a.smoke and a.intermediate_episodes is not None:  # the smoke sets its own episodes: refused, not ignored
        raise DiT4DiTError("--intermediate-episodes: --smoke evaluates one episode per checkpoint; give one or the other")
    if a.intermediate_episodes is not None and not 1 <= a.intermediate_episodes <= a.episodes:
        raise DiT4DiTError(f"--intermediate-episodes: expected 1..{a.episodes} (at most --episodes), "
                           f"got {a.intermediate_episodes}")
    if a.smoke:
        a.episodes, a.max_steps, a.out = 1, 16, a.run[0] / "sim_curve" / "smoke.png"
    check_seed_range(a.seed, a.episodes)  # every checkpoint's episodes, before the first one runs
    if a.episode_timeout is not None:  # the smallest eval of the curve waits on its workers too
        n = min(a.episodes, intermediate_episodes(a))
        given = ("--smoke (one episode per checkpoint)" if a.smoke
                 else f"--intermediate-episodes {n}" if n < a.episodes else f"--episodes {n}")
        check_episode_timeout(a.episode_timeout, a.workers, n, given)
    return success_curve.curve(a)


@entry_point
def grad_split_main(argv: list[str] | None = None) -> int:
    import json

    from dit4dit_npu.files import atomic_write_text
    from dit4dit_npu.train import grad_split

    p = argparse.ArgumentParser(prog="python -m dit4dit_npu.train.grad_split", description=grad_split.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, required=True, help="a joint training run folder (config.yaml, checkpoints/)")
    p.add_argument("--checkpoint", action="append", default=None, metavar="step_N",
                   help="a checkpoint of the run (repeat it; default: every one with an exported policy)")
    p.add_argument("--batches", type=int, default=8, help="training batches per checkpoint (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="draws the batches and their noise (default: %(default)s)")
    p.add_argument("--json", type=Path, default=None, metavar="OUT.json", help="also write every row there")
    a = p.parse_args(argv)
    if a.batches < 1:
        raise DiT4DiTError(f"--batches: expected a positive integer, got {a.batches}")
    if not 0 <= a.seed < 2**32:  # it seeds numpy and torch (seed * 1_000_003 + batch): in range for both
        raise DiT4DiTError(f"--seed: expected an int in [0, 2**32), got {a.seed}")
    if a.json is not None and a.json.is_dir():
        raise DiT4DiTError(f"--json {a.json} is a folder, expected a file path")
    if a.json is not None and not a.json.parent.is_dir():  # said before the checkpoints' work, not after it
        raise DiT4DiTError(f"--json {a.json}: {a.json.parent} is not a folder (expected a file in an existing folder)")
    records = grad_split.run_split(a.run, a.checkpoint, a.batches, a.seed)
    if a.json is not None:
        atomic_write_text(a.json, json.dumps(records, indent=1) + "\n")
        print(f"wrote {a.json}")
    return 0
