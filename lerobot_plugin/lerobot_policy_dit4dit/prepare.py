"""Make a dit4dit-npu policy folder one that ``lerobot-eval --policy.path=DIR`` opens.

    dit4dit-lerobot-prepare --policy DIR [--n-action-steps N]

lerobot opens a policy folder by its ``config.json`` (whose ``type`` names the plugin) and its
processor pipelines (``policy_preprocessor.json``, ``policy_postprocessor.json``); this writes
those three files, lerobot's own serialization of ``DiT4DiTConfig`` and of
``make_dit4dit_pre_post_processors``, into the folder. They hold nothing about the model: the
policy still loads from its own files (which these do not touch, so its content hashes still hold),
through dit4dit-npu's loader. The folder is loaded once first, so a folder that would not load is
refused here rather than in the middle of an evaluation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from huggingface_hub.constants import CONFIG_NAME  # "config.json", what lerobot reads a policy folder by

from dit4dit_npu.console import entry_point
from dit4dit_npu.policy import DiT4DiTPolicy as NativePolicy
from lerobot_policy_dit4dit.configuration_dit4dit import TYPE, DiT4DiTConfig, LeRobotPluginError
from lerobot_policy_dit4dit.modeling_dit4dit import DiT4DiTPolicy
from lerobot_policy_dit4dit.processor_dit4dit import make_dit4dit_pre_post_processors


def prepare(policy_dir: str | Path, config: DiT4DiTConfig) -> list[Path]:
    """Write lerobot's files into ``policy_dir``; returns their paths."""
    folder = Path(policy_dir)
    existing = folder / CONFIG_NAME
    if existing.is_file():
        kind = json.loads(existing.read_text()).get("type") if existing.stat().st_size else None
        if kind != TYPE:
            raise LeRobotPluginError(f"{existing}: a lerobot config of type {kind!r} is already there; not replacing it")
    native = NativePolicy.from_pretrained(folder, device="cpu", base_model=config.base_model)
    DiT4DiTPolicy._steps(config.n_action_steps, native.chunk_length)  # refused now, not at evaluation
    config.save_pretrained(folder)
    pipelines = make_dit4dit_pre_post_processors(config)
    for pipeline in pipelines:
        pipeline.save_pretrained(folder)
    return [existing, *(folder / f"{pipeline.name}.json" for pipeline in pipelines)]


@entry_point
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dit4dit-lerobot-prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", required=True, metavar="DIR", help="a dit4dit-npu policy folder (exported by training)")
    p.add_argument("--n-action-steps", type=int, default=None, metavar="N",
                   help="actions of each chunk lerobot executes before predicting again (default: the whole chunk)")
    p.add_argument("--base-model", default=None, metavar="DIR",
                   help="the base model's path, where it differs from the one recorded at export")
    args = p.parse_args(argv)
    folder = Path(args.policy)
    if not folder.is_dir():
        raise LeRobotPluginError(f"--policy {folder}: not a folder")
    config = DiT4DiTConfig(device="cpu", push_to_hub=False, n_action_steps=args.n_action_steps, base_model=args.base_model)
    written = prepare(folder, config)
    print(f"wrote {', '.join(p.name for p in written)} into {folder}: lerobot-eval --policy.path={folder} ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
