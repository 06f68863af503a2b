"""``python -m dit4dit_npu.convert dit4dit --checkpoint steps_N_pytorch_model.pt --config config.yaml
[--stats dataset_statistics.json] --base-model COSMOS_DIR --out POLICY_DIR [conventions] [a.b=c ...]``
and the way back, ``python -m dit4dit_npu.convert to-dit4dit POLICY_DIR --out RUN_DIR``.

Each convention flag sets the ``datasets.vla_data`` key of the same name (``--state-parts`` is
``state_parts``, ...), as an ``datasets.vla_data.KEY=...`` override would. Bad input is one line on
stderr and exit code 2, with nothing written."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dit4dit_npu.console import entry_point, former_names


def _conventions(args: argparse.Namespace) -> dict:
    from dit4dit_npu.convert.conventions import parse_dims, parse_parts

    parsers = {
        "state_parts": parse_parts, "action_parts": parse_parts, "state_order": parse_dims,
        "action_order": parse_dims, "gripper_dims": parse_dims,
    }
    out = {}
    for key in ("camera_keys", "view_layout", "image_size", "state_parts", "action_parts", "state_order",
                "action_order", "gripper_dims", "gripper_threshold", "action_clip"):
        value = getattr(args, key)
        if value is not None:
            flag = "--" + key.replace("_", "-")
            out[key] = parsers[key](value, flag) if key in parsers else value
    if out.get("state_order") == []:  # "--state-order ''": the robot's own order
        out["state_order"] = None
    if out.get("action_order") == []:
        out["action_order"] = None
    return out


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m dit4dit_npu.convert", allow_abbrev=False)
    sub = parser.add_subparsers(dest="source", required=True, help="dit4dit: an original DiT4DiT run -> a policy "
                                "folder; to-dit4dit: a policy folder -> an original-format run folder")
    p = sub.add_parser(
        "dit4dit",
        allow_abbrev=False,
        help="an original DiT4DiT run -> a policy folder",
        description="Import an original DiT4DiT checkpoint as a policy folder (DiT4DiTPolicy.from_pretrained, "
        "eval and serve use it unchanged). Trailing a.b=c overrides apply to the config after DiT4DiT's own "
        "values. Every convention not given is the robot type's (or DiT4DiT's clients'), printed as a notice.",
    )
    p.add_argument("--checkpoint", type=Path, required=True, help="RUN/checkpoints/steps_N_pytorch_model.pt")
    p.add_argument("--config", type=Path, required=True, help="RUN/config.yaml (the config the run wrote)")
    p.add_argument("--stats", type=Path, help="dataset_statistics.json (default: RUN/dataset_statistics.json)")
    p.add_argument("--base-model", required=True, help="the Cosmos-Predict2.5-2B diffusers folder the run trained on")
    p.add_argument("--out", type=Path, required=True, help="policy folder to write")
    robot = p.add_argument("--robot-type", help="libero_franka, robotwin, fourier_gr1_arms_waist, or custom (its "
                           "conventions from the flags below); default: the config's mixture or the statistics tag")
    former_names(p, robot, "--embodiment")
    p.add_argument("--tag", help="embodiment tag in the statistics file (needed when it has several)")
    c = p.add_argument_group("conventions (datasets.vla_data keys of the same names)")
    c.add_argument("--camera-keys", nargs="+", help="the views in tiling order, primary first")
    c.add_argument("--view-layout", choices=["width", "height", "grid"], help="how views are tiled (DiT4DiT: width)")
    c.add_argument("--image-size", type=int, nargs=2, metavar=("H", "W"),
                   help="per-view size the run trained at (DiT4DiT's dataset: 224 x 224)")
    c.add_argument("--state-parts", metavar="SIZE:ENC,...", help="state keys in the robot's order, each sincos, "
                   "min_max, mean_std, q99, binary or none, e.g. 14:sincos or 6:min_max,1:binary,6:min_max,1:binary")
    c.add_argument("--action-parts", metavar="SIZE:ENC,...", help="action parts (no sincos); default: min_max where "
                   "the statistics mask is true, none where false")
    c.add_argument("--state-order", metavar="I,...", help="model = robot[order] for the state; '' = the robot's order")
    c.add_argument("--action-order", metavar="I,...", help="model = robot[order] for the action; '' = the robot's order")
    c.add_argument("--gripper-dims", metavar="I,...", help="predicted action dims set to 0/1 at the threshold; '' = none")
    c.add_argument("--gripper-threshold", type=float, help="threshold of gripper dims and binary parts (0.5)")
    c.add_argument("--action-clip", choices=["all", "normalized", "none"],
                   help="clip predicted actions to [-1, 1] before un-normalizing: every dim (all, DiT4DiT's clients), "
                   "the normalized dims, or none")
    p.add_argument("--instruction", action="append", default=[], help="pre-encode this instruction (repeatable)")
    p.add_argument("--allow-constant-dims", action="store_true",
                   help="convert statistics with min == max on dims the policy normalizes (refused by default: the "
                   "policy would always command such a joint to one value)")

    e = sub.add_parser(
        "to-dit4dit",
        allow_abbrev=False,
        help="a policy folder -> an original-format DiT4DiT run folder",
        description="Write a run folder in DiT4DiT's own format (checkpoints/steps_N_pytorch_model.pt, config.yaml, "
        "dataset_statistics.json) that its from_pretrained loads, for its LIBERO / RoboTwin clients.",
    )
    e.add_argument("policy", type=Path, help="a policy folder")
    e.add_argument("--out", type=Path, required=True, help="run folder to write (new)")
    e.add_argument("--tag", help="embodiment tag of the statistics (default: the one it was imported with, "
                   "else new_embodiment)")
    e.add_argument("--action-model-type", help="DiT4DiT's size-table entry of the head (default: DiT-B / DiT-L "
                   "when the sizes are that preset's; another name is an entry you added to its DiTConfig)")
    args, overrides = parser.parse_known_args(argv)
    if args.source == "to-dit4dit" and overrides:
        # the export has no run config to override: what is left over is a mistyped flag (argparse's
        # usage and exit code 2, as for the import's own flags)
        e.error(f"unrecognized arguments: {' '.join(overrides)}")
    return args, overrides


@entry_point
def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    if args.source == "to-dit4dit":
        from dit4dit_npu.convert.export import export_dit4dit

        folder, notices = export_dit4dit(args.policy, args.out, tag=args.tag, action_model_type=args.action_model_type)
        for line in notices:
            print(f"  {line}", file=sys.stderr)
        print(f"wrote {folder}")
        return 0
    from dit4dit_npu.convert import convert_dit4dit

    folder, notices = convert_dit4dit(
        args.checkpoint, args.config, args.base_model, args.out, stats=args.stats, robot_type=args.robot_type,
        tag=args.tag, conventions=_conventions(args), overrides=overrides, instructions=args.instruction,
        allow_constant_dims=args.allow_constant_dims,
    )
    if notices:
        print(f"DiT4DiT run imported ({len(notices)} change(s) and inferred choice(s)):", file=sys.stderr)
        for line in notices:
            print(f"  {line}", file=sys.stderr)
    print(f"wrote {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
