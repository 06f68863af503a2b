"""``python -m dit4dit_npu.doctor`` (console script ``dit4dit-doctor``): is this host ready for the
run? One line per check, PASS / WARN / FAIL / SKIP, exit code 1 on any FAIL (2 for bad arguments).

    python -m dit4dit_npu.doctor --config configs/robotwin/dit4dit_robotwin.yaml --num-processes 16 \\
        [--num-machines 2] [framework.cosmos25.base_model=/models/Cosmos-Predict2.5-2B ...]

Run it on every node before a long run. Three kinds of checks, one module each: the software
stack (``stack.py``: versions and their pairing, libraries), the host (``host.py``: cards, a
training step on each card, fused attention, a real all-reduce) and the run config
(``run_config.py``: it loads and its model builds, its data and base-model folders are readable,
its run folder is writable and shared by the nodes, the cards' free memory holds its memory plan).
``--stack`` runs only the stack checks, without importing torch in this process
(``scripts/setup_env.sh`` uses it before installing anything else). ``--policy DIR`` runs only the
check of a policy folder (``policy.py``: every file against its full content hash).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from dit4dit_npu.console import entry_point
from dit4dit_npu.doctor import host, run_config, stack
from dit4dit_npu.doctor.policy import check_policy
from dit4dit_npu.doctor.results import FAIL, SKIP, Result
from dit4dit_npu.errors import DiT4DiTError


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        prog="python -m dit4dit_npu.doctor", allow_abbrev=False,
        description="Pre-flight checks of this host for a training run: one PASS/WARN/FAIL/SKIP line each, "
                    "exit code 1 on any FAIL. Extra a.b=c arguments are config overrides.")
    p.add_argument("--config", help="the run config to check (data, base model, run folder, memory plan)")
    # Each count also takes the launch script's spelling (scripts/train_8p.sh, accelerate:
    # --num_processes), so one flag copied from the launch line works here unchanged.
    p.add_argument("--num-processes", "--num_processes", type=int, metavar="N",
                   help="processes per node the launch will start (default: one per visible card; 2 on a CPU host)")
    p.add_argument("--num-machines", "--num_machines", type=int, default=1, metavar="M",
                   help="nodes of the run (default 1)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S", help="seconds the all-reduce may take")
    p.add_argument("--stack", action="store_true", help="only the software stack (Python, torch, torch_npu, CANN, "
                                                        "libraries); imports no torch in this process")
    p.add_argument("--policy", metavar="DIR", help="only check this policy folder: every file against its full "
                                                   "content hash, its manifest and PolicyIO (no model is built)")
    args, overrides = p.parse_known_args(argv)
    for name in ("num_processes", "num_machines"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise DiT4DiTError(f"--{name.replace('_', '-')}: expected a positive integer, got {value}")
    if overrides and args.config is None:
        raise DiT4DiTError(f"config overrides ({' '.join(overrides)}) need --config")
    return args, overrides


@entry_point
def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    failed = False
    for result in run(args, overrides):
        print(result.line(), flush=True)
        failed |= result.status == FAIL
    return 1 if failed else 0


def run(args: argparse.Namespace, overrides: list[str]) -> Iterator[Result]:
    if args.policy is not None:
        yield check_policy(args.policy)
        return
    found = stack.Stack()
    yield from stack.stack_checks(found, package_requirements=not args.stack)
    if args.stack:
        return
    if not found.torch.ok:
        for name in ("cards", "attention", "step", "collective", "config", "memory"):
            yield Result(SKIP, name, "torch does not import (see above)")
        return
    yield from host.host_checks(args.num_processes, args.timeout)
    yield from run_config.config_checks(args, overrides)
