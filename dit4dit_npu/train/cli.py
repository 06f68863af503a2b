"""Command line of the trainer: parse, validate, print or run. Errors are one line, exit code 2.

An original DiT4DiT YAML and its launch-script flags are accepted as they are (``--config_yaml``
included): the config is migrated on load (``dit4dit_npu/config/migrate.py``) and what changed
is printed once, as one list. ``--migrate-config OUT.yaml`` writes the equivalent config in this
project's schema; ``--dry-run`` also builds the model's module tree (no weights) so that
everything the model build checks fails here, before any data is read. A run in which a trainable
module would get no loss is refused before either (``config/objective.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dit4dit_npu.config import Config, dump_yaml, load_config
from dit4dit_npu.config.objective import check_every_module_trains
from dit4dit_npu.console import entry_point
from dit4dit_npu.errors import DiT4DiTError
from dit4dit_npu.files import atomic_write_text, is_out_of_space
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
    print(f"config migrated ({len(notices)} change(s)):", file=sys.stderr)
    for line in notices:
        print(f"  {line}", file=sys.stderr)


def check_model_build(cfg: Config) -> None:
    """What building the model checks, on its module tree without weights: the base folder, the
    model sizes, and that every learning-rate key and freeze_modules path names a module."""
    from dit4dit_npu.train.optim import freeze_modules, param_groups
    from dit4dit_npu.transforms.policy_io import config_spec
    from dit4dit_npu.weights import build_skeleton

    # The raw widths come from the data: any placeholder builds the same module tree, as long as
    # it fits a per-dim state_noise_std (its length is checked against the data's width in training).
    noise = cfg.trainer.state_noise_std
    state_dim = 1
    if isinstance(noise, list):
        state_dim = next((n for n in range(1, len(noise) + 1) if config_spec(cfg, n, 1).state_width == len(noise)), 1)
    model = build_skeleton(cfg, config_spec(cfg, state_dim=state_dim, action_dim=1))
    freeze_modules(model, cfg.trainer.freeze_modules)
    param_groups(model, cfg.trainer.learning_rate)
    check_tiny_vae_weights(cfg)


def check_tiny_vae_weights(cfg: Config) -> None:
    """A fitted tiny VAE file (framework.cosmos25.tiny.vae_weights) loads into the tiny VAE of
    these sizes (a few MB: read whole, as training reads it), else the same one line training
    would give, minutes later."""
    c = cfg.framework.cosmos25
    if not c.is_tiny or c.tiny.vae_weights is None:
        return
    from dit4dit_npu.models import tiny
    from dit4dit_npu.weights.model_config import tiny_sizes
    from dit4dit_npu.weights.tiny_cache import load_vae_weights

    load_vae_weights(tiny.build_vae(tiny_sizes(c.tiny)), c.tiny.vae_weights)


@entry_point
def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    cfg = load_config(args.config, overrides, on_notices=print_notices)
    check_trackers(cfg.trackers)  # now, not after the imports and the data loading
    check_sim_eval(cfg.trainer.sim_eval)
    if args.migrate_config is not None:
        write_migrated(cfg, args.migrate_config)
        print(f"wrote {args.migrate_config}", file=sys.stderr)
        return 0
    check_every_module_trains(cfg)  # a run that would leave a module untrained: refused before any data work
    if args.dry_run:
        from dit4dit_npu.train.init_from import check_init_from

        check_model_build(cfg)
        check_init_from(cfg)
        print(dump_yaml(cfg), end="")
        return 0
    from dit4dit_npu.train.loop import train  # heavy imports only when training

    train(cfg)
    return 0


def write_migrated(cfg: Config, out: Path) -> None:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, dump_yaml(cfg))
    except OSError as e:
        if is_out_of_space(e):
            raise
        raise DiT4DiTError(f"--migrate-config {out}: cannot write ({e.strerror or e})") from None
