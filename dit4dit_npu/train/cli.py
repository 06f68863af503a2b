"""Command line of the trainer: parse, validate, print or run. Errors are one line, exit code 2.

An original DiT4DiT YAML and its launch-script flags are accepted as they are (``--config_yaml``
included): the config is migrated on load (``dit4dit_npu/config/migrate.py``) and what changed
is printed once, as one list. ``--migrate-config OUT.yaml`` writes the equivalent config in this
project's schema; ``--dry-run`` also builds the model's module tree (no weights) so that
everything the model build checks fails here, before any data is read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dit4dit_npu.config import Config, ConfigError, dump_yaml, load_config
from dit4dit_npu.sim.training_eval import check_sim_eval
from dit4dit_npu.train.metrics import check_trackers

USAGE_EPILOG = """overrides:
  a.b=c            e.g. trainer.max_train_steps=10
  --a.b c          DiT4DiT's form, e.g. --trainer.max_train_steps 10
                   (module paths as learning-rate keys: --trainer.learning_rate.backbone.transformer 2e-5)
examples:
  python -m dit4dit_npu.train --config configs/robotwin/dit4dit_robotwin_tiny.yaml
  accelerate launch --config_file configs/deepspeed/accelerate_zero2.yaml --num_processes 8 \\
      -m dit4dit_npu.train --config configs/robotwin/dit4dit_robotwin.yaml
  python -m dit4dit_npu.train --config_yaml dit4dit_libero.yaml --migrate-config libero.yaml
"""


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m dit4dit_npu.train",
        description="Train a DiT4DiT policy (Cosmos-Predict2.5 video backbone + DiT-B action head).",
        epilog=USAGE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        "--config_yaml",
        dest="config",
        required=True,
        help="run config YAML (e.g. configs/robotwin/dit4dit_robotwin_tiny.yaml; an original DiT4DiT YAML works "
        "too); overrides follow it",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the config, its trackers and the model build (no weights), print it resolved, and exit",
    )
    parser.add_argument(
        "--migrate-config",
        metavar="OUT.yaml",
        type=Path,
        help="write the config (an original DiT4DiT one included) in this project's schema and exit",
    )
    return parser.parse_known_args(argv)


def print_notices(notices: list[str]) -> None:
    print(f"DiT4DiT config migrated ({len(notices)} change(s)):", file=sys.stderr)
    for line in notices:
        print(f"  {line}", file=sys.stderr)


def check_model_build(cfg: Config) -> None:
    """What building the model checks, on its module tree without weights: the base folder, the
    model sizes, and that every learning-rate key and freeze_modules path names a module."""
    from dit4dit_npu.batch import BatchSpec
    from dit4dit_npu.models import build_skeleton
    from dit4dit_npu.train.optim import freeze_modules, param_groups
    from dit4dit_npu.transforms.images import tiled_size

    d = cfg.datasets.vla_data
    # widths come from the data (PolicyIO); the padded widths or placeholders build the same tree
    spec = BatchSpec(
        state_width=d.max_state_dim or 1,
        action_width=d.max_action_dim or 1,
        chunk_length=cfg.framework.action_model.chunk_length,
        num_frames=len(d.video_delta_indices[:: d.action_video_freq_ratio]),
        frame_size=tiled_size(d.image_size, len(d.camera_keys), d.view_layout),
    )
    model = build_skeleton(cfg, spec)
    freeze_modules(model, cfg.trainer.freeze_modules)
    param_groups(model, cfg.trainer.learning_rate)


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    try:
        cfg = load_config(args.config, overrides, on_notices=print_notices)
        check_trackers(cfg.trackers)  # now, not after the imports and the data loading
        check_sim_eval(cfg.trainer.sim_eval)
        if args.migrate_config is not None:
            args.migrate_config.parent.mkdir(parents=True, exist_ok=True)
            args.migrate_config.write_text(dump_yaml(cfg))
            print(f"wrote {args.migrate_config}", file=sys.stderr)
            return 0
        if args.dry_run:
            check_model_build(cfg)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
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
