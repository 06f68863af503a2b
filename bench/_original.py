"""The original DiT4DiT beside ours in bench/: its side virtualenv as a worker.

``bench/profile_medium.py``, ``bench/latency.py`` and ``bench/train_step.py`` take the same flags as
``bench/parity_dit4dit.py`` (``--original-root`` a checkout of Mondo-Robotics/DiT4DiT,
``--original-python`` a python that runs it; env defaults DIT4DIT_ORIGINAL_ROOT /
DIT4DIT_ORIGINAL_PYTHON) and then time the original itself, built in its own classes at the
config's sizes by ``bench/_profile_original.py``, one round at a time so the rounds interleave.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dit4dit_npu.config.framework import PRESETS
from dit4dit_npu.train.memory_plan import ROBOTWIN_DIMS
from dit4dit_npu.transforms import PolicyIO

HERE = Path(__file__).resolve().parent


def add_original_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--original-root", type=Path, default=os.environ.get("DIT4DIT_ORIGINAL_ROOT") or None,
                   help="a checkout of Mondo-Robotics/DiT4DiT (env DIT4DIT_ORIGINAL_ROOT): measure against it")
    p.add_argument("--original-python", default=os.environ.get("DIT4DIT_ORIGINAL_PYTHON", sys.executable),
                   help="python of a virtualenv that runs the original (as bench/parity_dit4dit.py)")
    p.add_argument("--original-commit", help="the original's commit, for the reference line (default: git rev-parse)")
    p.add_argument("--work", type=Path, help="folder for the original's random Cosmos folder (default: a temporary one)")


class Original:
    """The original DiT4DiT as a long-lived worker in its own virtualenv (``bench/_profile_original.py``):
    one JSON command a line in, one JSON reply a line out, so its rounds interleave with ours."""

    @classmethod
    def start(cls, args: argparse.Namespace, spec: dict) -> Original:
        work = args.work or Path(tempfile.mkdtemp(prefix="profile_original_"))
        work.mkdir(parents=True, exist_ok=True)
        return cls(args.original_python, args.original_root.resolve(), work, spec, args.original_commit)

    def __init__(self, python: str, root: Path, work: Path, spec: dict, commit: str | None) -> None:
        env = dict(os.environ, PYTHONPATH=str(HERE.parent), OMP_NUM_THREADS=str(spec["threads"]), HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", NO_ALBUMENTATIONS_UPDATE="1")
        base = work / ("cosmos_" + "_".join(f"{v}" for v in spec["tiny"].values() if not isinstance(v, (list, str))))
        cmd = [python, str(HERE / "_profile_original.py"), "--original-root", str(root), "--base", str(base),
               "--spec", json.dumps(spec)]
        self.log = open(work / "original.log", "w")  # noqa: SIM115 (lives as long as the worker)
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self._read()
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        self.commit = commit or done.stdout.strip() or "(commit unknown: not a git checkout; give --original-commit)"

    def _read(self) -> dict:
        while line := self.proc.stdout.readline():  # its own prints pass by: only the worker's replies count
            if line.startswith("@profile@ "):
                return json.loads(line.removeprefix("@profile@ "))
        self.log.flush()
        raise SystemExit(f"the original failed:\n{Path(self.log.name).read_text()[-3000:]}")

    def __call__(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.log.close()


def original_spec(cfg, spec, io: PolicyIO, native, instruction: str, threads: int) -> dict:
    """Our config's sizes in the terms the original's side builds from (bench/_profile_original.py)."""
    cosmos, head = cfg.framework.cosmos25, cfg.framework.action_model
    tiny = dataclasses.asdict(cosmos.tiny)
    h, w = cfg.datasets.vla_data.image_size
    return dict(tiny=tiny, extract_layer=cosmos.extract_layer, max_seq=cosmos.max_sequence_length,
                hidden=tiny["num_attention_heads"] * tiny["attention_head_dim"], head_dims=list(PRESETS[head.action_model_type]),
                head_layers=head.diffusion_model_cfg.num_layers, head_output_dim=head.diffusion_model_cfg.output_dim,
                head_hidden=head.hidden_size, repeats=head.repeated_diffusion_steps, chunk=spec.chunk_length,
                frames=spec.num_frames, hw=[h, w], views=len(io.camera_keys), cameras=list(io.camera_keys),
                native=list(native), action_dim=ROBOTWIN_DIMS, state_dim=ROBOTWIN_DIMS, instruction=instruction,
                threads=threads)
