"""``python -m dit4dit_npu.convert dit4dit --checkpoint steps_N_pytorch_model.pt --config config.yaml
[--stats dataset_statistics.json] --base-model COSMOS_DIR --out POLICY_DIR [a.b=c ...]``.

Bad input is one line on stderr and exit code 2, with nothing written."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dit4dit_npu.cli import entry_point
from dit4dit_npu.config.original_data import ROBOT_TYPES


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m dit4dit_npu.convert", allow_abbrev=False)
    sub = parser.add_subparsers(dest="source", required=True, help="what to import (dit4dit: an original DiT4DiT run)")
    p = sub.add_parser(
        "dit4dit",
        allow_abbrev=False,
        help="an original DiT4DiT run -> a policy folder",
        description="Import an original DiT4DiT checkpoint as a policy folder (DiT4DiTPolicy.from_pretrained, "
        "eval and serve use it unchanged). Trailing a.b=c overrides apply to the config after DiT4DiT's own "
        "values (e.g. for an action_model_type that is not a DiT4DiT preset).",
    )
    p.add_argument("--checkpoint", type=Path, required=True, help="RUN/checkpoints/steps_N_pytorch_model.pt")
    p.add_argument("--config", type=Path, required=True, help="RUN/config.yaml (the config the run wrote)")
    p.add_argument("--stats", type=Path, help="dataset_statistics.json (default: RUN/dataset_statistics.json)")
    p.add_argument("--base-model", required=True, help="the Cosmos-Predict2.5-2B diffusers folder the run trained on")
    p.add_argument("--out", type=Path, required=True, help="policy folder to write")
    p.add_argument("--embodiment", choices=sorted(ROBOT_TYPES), help="robot type (default: from the config or statistics)")
    p.add_argument("--tag", help="embodiment tag in the statistics file (needed when it has several)")
    p.add_argument("--image-size", type=int, nargs=2, default=[224, 224], metavar=("H", "W"),
                   help="per-view image size the run trained at (DiT4DiT always resized to 224 x 224)")
    p.add_argument("--instruction", action="append", default=[], help="pre-encode this instruction (repeatable)")
    return parser.parse_known_args(argv)


@entry_point
def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    from dit4dit_npu.convert import convert_dit4dit

    folder, notices = convert_dit4dit(
        args.checkpoint, args.config, args.base_model, args.out, stats=args.stats, embodiment=args.embodiment,
        tag=args.tag, image_size=args.image_size, overrides=overrides, instructions=args.instruction,
    )
    if notices:
        print(f"DiT4DiT config imported ({len(notices)} change(s)):", file=sys.stderr)
        for line in notices:
            print(f"  {line}", file=sys.stderr)
    print(f"wrote {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
