"""The eval commands; each parses its flags and calls its library module.

``python -m dit4dit_npu.eval`` (console script ``dit4dit-eval``, ``main``): open-loop evaluation of
a policy folder on held-out dataset episodes; the evaluation itself is ``eval/offline.py``.
``python -m dit4dit_npu.eval.feature_probe`` (``feature_probe_main``) and
``python -m dit4dit_npu.eval.video_picture`` (``video_picture_main``): those modules' ``__main__``
blocks call these.

    python -m dit4dit_npu.eval --policy runs/x/checkpoints/step_005000 [--data ROOT]
        [--episode-indices 3 11] [--out DIR] [--max-frames 512] [--stride 1] [--seed 0] [--blank-cameras]
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from dit4dit_npu.console import add_compile_flag, entry_point, former_names, require
from dit4dit_npu.eval import feature_probe, video_picture
from dit4dit_npu.eval.offline import EvalError, evaluate, output_dir
from dit4dit_npu.sim.tasks import check_seed_range


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m dit4dit_npu.eval",
        description="Open-loop evaluation of an exported DiT4DiT policy on held-out LeRobot episodes.",
    )
    policy = p.add_argument("--policy", help="policy folder, checkpoint folder or run folder (required)")
    former_names(p, policy, "--checkpoint")
    p.add_argument("--data", nargs="+", default=None, help="LeRobot dataset root(s) (default: recorded in the policy)")
    episodes = p.add_argument(
        "--episode-indices", nargs="+", type=int, default=None, help="episode indices (default: held-out ones)"
    )
    former_names(p, episodes, "--episodes")
    out = p.add_argument("--out", default=None, help="output folder (default: outputs/eval/<checkpoint name>)")
    former_names(p, out, "--output")
    p.add_argument("--max-frames", type=int, default=512, help="at most this many frames, evenly spaced")
    p.add_argument("--stride", type=int, default=1, help="evaluate every n-th frame before --max-frames")
    p.add_argument("--batch-size", type=int, default=8, help="observations per predict_action call (default: 8)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of the flow-matching noise (default: 0)")
    p.add_argument("--video-samples", type=int, default=3, help="frames shown in the imagined-vs-real strip (0 = off)")
    p.add_argument("--video-steps", type=int, default=2, help="sampling steps of the imagined video")
    p.add_argument("--plot-episodes", type=int, default=3, help="episodes drawn in the action plots (default: 3)")
    p.add_argument("--base-model", default=None, help="override the base model path recorded at export")
    p.add_argument("--device", default=None, help="torch device (default: the detected accelerator)")
    p.add_argument(
        "--blank-cameras", action="store_true",
        help="also score the same frames with every camera view a constant grey image (metrics.json: cameras_blanked)",
    )
    p.add_argument("--merge-lora", action="store_true", help="fold a LoRA policy's adapter into the base transformer at load (no adapter cost per step)")
    add_compile_flag(p)
    args = p.parse_args(argv)
    require(p, args, policy)
    return args


# flag -> smallest accepted value
ARG_MINIMUMS = {"max_frames": 1, "stride": 1, "batch_size": 1, "video_samples": 0, "video_steps": 1, "plot_episodes": 0}


def check_args(args: argparse.Namespace) -> None:
    for name, least in ARG_MINIMUMS.items():
        value = getattr(args, name)
        if value < least:
            raise EvalError(f"--{name.replace('_', '-')}: got {value}, expected an integer >= {least}")
    if args.device is not None:
        from dit4dit_npu import device as dev

        try:
            dev.parse_device(args.device)
        except dev.DeviceError as e:
            raise EvalError(f"--device: {e}") from None


@entry_point
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_args(args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    report = evaluate(args)
    m = report["model"]
    line = f"model mse {m['mse']:.5g} mae {m['mae']:.5g}"
    for name in ("hold_position", "dataset_mean"):
        if f"ratio_to_{name}" in report:
            line += f" | {name} mse {report[name]['mse']:.5g} (ratio {report[f'ratio_to_{name}']['mse']:.3f})"
    print(line)
    if "cameras_blanked" in report:
        b = report["cameras_blanked"]
        line = f"cameras blanked: model mse {b['model']['mse']:.5g}"
        for name in ("hold_position", "dataset_mean"):
            if f"ratio_to_{name}" in b:
                line += f" | ratio to {name} {b[f'ratio_to_{name}']['mse']:.3f}"
        print(line)
    out = output_dir(args.out, Path(report["checkpoint"]))
    print(f"wrote {out / 'metrics.json'} and {len(report['plots'])} plots")
    return 0


# -- python -m dit4dit_npu.eval.feature_probe ------------------------------------------------------


def feature_probe_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m dit4dit_npu.eval.feature_probe", description=feature_probe.__doc__.split("\n")[0]
    )
    p.add_argument("--policy", nargs="+", required=True, help="policy folder(s), checkpoint or run folder(s)")
    p.add_argument("--task", default="transfer_cube", help="ALOHA scene (default: %(default)s)")
    p.add_argument("--episodes", type=int, default=200, help="seeds probed (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="first scene seed (default: %(default)s)")
    p.add_argument(
        "--at", type=int, nargs="+", default=[0], help="expert steps before the observation (default: 0)"
    )
    p.add_argument("--size", default="240x320", help="camera frames HxW (default: %(default)s, the recipe's)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args(argv)
    if a.episodes < 2 * feature_probe.FOLDS:
        raise feature_probe.ProbeError(
            f"--episodes: got {a.episodes}, expected >= {2 * feature_probe.FOLDS} ({feature_probe.FOLDS}-fold cross-validation)"
        )
    if min(a.at) < 0:
        raise feature_probe.ProbeError(f"--at: got {a.at}, expected step counts >= 0")
    check_seed_range(a.seed, a.episodes)  # before any scene is built
    return a


@entry_point
def feature_probe_main(argv: list[str] | None = None) -> int:
    from dit4dit_npu.sim.tasks import parse_size

    a = feature_probe_args(argv)
    for path in a.policy:
        if not Path(path).exists():
            raise feature_probe.ProbeError(f"--policy {path}: no such folder")
    seeds = list(range(a.seed, a.seed + a.episodes))
    observations, targets = feature_probe.collect(a.task, seeds, sorted(set(a.at)), parse_size(a.size))
    rows = [feature_probe.policy_rows(p, observations, targets) for p in a.policy]
    keys = [k for k in rows[0] if k != "policy"]
    print(
        f"held-out R^2 of a linear probe for the object's x, y ({len(observations)} observations, "
        f"{feature_probe.FOLDS}-fold, seeds {seeds[0]}-{seeds[-1]}, expert steps {sorted(set(a.at))}):"
    )
    print("| policy | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for r in rows:
        print(f"| {r['policy']} | " + " | ".join(f"{r[k]:.3f}" for k in keys) + " |")
    if a.out:
        Path(a.out).write_text(
            json.dumps({"task": a.task, "seeds": seeds, "at": a.at, "rows": rows}, indent=1)
        )
    last = rows[-1]
    print(
        f"probe R^2: features {last['features']:.3f}, VAE latent {last['VAE latent']:.3f}, "
        f"state {last['state (control)']:.3f}"
    )
    return 0


# -- python -m dit4dit_npu.eval.video_picture -----------------------------------------------------


def video_picture_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dit4dit_npu.eval.video_picture", description=video_picture.__doc__.split("\n\n")[0])
    p.add_argument("--policy", required=True, help="a policy folder (DiT4DiTPolicy.from_pretrained)")
    p.add_argument("--demos", required=True, help="a LeRobot dataset of recorded demos (sim.demos)")
    p.add_argument("--episode", type=int, default=0, help="the demo episode (default 0)")
    p.add_argument("--task", default="transfer_cube", help="the ALOHA task of the closed-loop episode")
    p.add_argument("--seed", type=int, default=0, help="the closed-loop episode's scene seed (default 0: an unseen seed)")
    p.add_argument("--at", type=int, nargs="+", default=[0, 100, 200], help="the episode steps to show")
    p.add_argument("--steps", type=int, default=2, help="denoising steps of the imagined clip (default 2)")
    p.add_argument("--out", required=True, type=Path, help="the PNG to write")
    a = p.parse_args(argv)
    if any(t < 0 for t in a.at):
        raise EvalError(f"--at: expected steps >= 0, got {a.at}")
    if a.steps < 1:
        raise EvalError(f"--steps: expected >= 1, got {a.steps}")
    if a.out.suffix.lower() != ".png":
        raise EvalError(f"--out {a.out}: expected a .png file")
    check_seed_range(a.seed, 1, count_flag=None)  # its one closed-loop episode, before the policy loads
    return a


@entry_point
def video_picture_main(argv: list[str] | None = None) -> int:
    from PIL import Image

    from dit4dit_npu.eval.plots import plot_strips
    from dit4dit_npu.sim.backend import require_simulator

    a = video_picture_args(argv)
    require_simulator()
    if not Path(a.policy).exists():
        raise EvalError(f"--policy {a.policy}: no such folder")
    root = Path(a.demos).expanduser().resolve()
    if not root.is_dir():
        raise EvalError(f"--demos {a.demos}: no such folder")
    at = sorted(set(a.at))
    policy, loop, result = video_picture.closed_loop_strips(a.policy, a.task, a.seed, at, a.steps)
    strips = video_picture.demo_strips(policy, root, a.episode, at, a.steps, a.seed) + loop
    a.out.parent.mkdir(parents=True, exist_ok=True)
    plot_strips(a.out, strips, f"{video_picture.TITLE}\n{a.policy} (step {policy.manifest.step})", dpi=60)
    # a picture kept in docs/: 256 colours (a quarter of the bytes; the decoded frames are blurred anyway)
    Image.open(a.out).convert("RGB").quantize(256).save(a.out, optimize=True)
    print("mean |error| of future frames vs their VAE round trip (0-255):")
    for title, clips in strips:
        print("  " + video_picture.motion_line(title, clips))
    print(f"wrote {a.out}: steps {at} of demo episode {a.episode} and of closed-loop seed {a.seed} "
          f"({result['steps']} steps run, max reward {result['max_reward']})")
    return 0
