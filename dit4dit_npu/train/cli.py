"""Command line of the trainer: parse, validate, print or run. Errors are one line, exit code 2."""

from __future__ import annotations

import argparse
import sys

from dit4dit_npu.config import ConfigError, dump_yaml, load_config

USAGE_EPILOG = """overrides:
  a.b=c            e.g. trainer.max_train_steps=10
  --a.b c          DiT4DiT's form, e.g. --trainer.max_train_steps 10
examples:
  python -m dit4dit_npu.train --config configs/robotwin/dit4dit_robotwin_tiny.yaml
  accelerate launch --config_file configs/deepspeed/accelerate_zero2.yaml --num_processes 8 \\
      -m dit4dit_npu.train --config configs/robotwin/dit4dit_robotwin.yaml
"""


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m dit4dit_npu.train",
        description="Train a DiT4DiT policy (Cosmos-Predict2.5 video backbone + DiT-B action head).",
        epilog=USAGE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="YAML config (e.g. configs/robotwin/dit4dit_robotwin.yaml)")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(dump_yaml(cfg), end="")
        return 0
    from dit4dit_npu.train.errors import user_errors  # heavy imports only when training
    from dit4dit_npu.train.loop import train

    try:
        train(cfg)
    except user_errors() as e:  # bad input: one line, no traceback; anything else is a bug
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk outside a checkpoint save (metrics, logs): still one line
        from dit4dit_npu.train.checkpoint import is_out_of_space

        if not is_out_of_space(e):
            raise
        print(f"error: no space left: {e}", file=sys.stderr)
        return 2
    return 0
