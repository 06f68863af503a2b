"""``python -m dit4dit_npu.eval`` (console script ``dit4dit-eval``): open-loop evaluation of a policy
folder on held-out dataset episodes; the evaluation itself is ``eval/offline.py``.

    python -m dit4dit_npu.eval --policy runs/x/checkpoints/step_005000 [--data ROOT]
        [--episode-indices 3 11] [--out DIR] [--max-frames 512] [--stride 1] [--seed 0] [--blank-cameras]
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from dit4dit_npu.console import add_compile_flag, entry_point, former_names, require
from dit4dit_npu.eval.offline import EvalError, evaluate, output_dir


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

