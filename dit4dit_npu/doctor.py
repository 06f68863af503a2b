"""``python -m dit4dit_npu.doctor`` (console script ``dit4dit-doctor``): is this host ready for the
run? One line per check, PASS / WARN / FAIL / SKIP, exit code 1 on any FAIL (2 for bad arguments).

    python -m dit4dit_npu.doctor --config configs/robotwin/dit4dit_robotwin.yaml --num-processes 16 \\
        [--num-machines 2] [framework.cosmos25.base_model=/models/Cosmos-Predict2.5-2B ...]

Run it on every node before a long run. The stack and host checks are the device layer's
(``dit4dit_npu/device/doctor.py``: versions and their pairing, libraries, cards, a training step
on each card, fused attention, a real all-reduce); the checks of a run config are here: it loads
and its model builds, its data and base-model folders are readable, its run folder is writable
and shared by the nodes, and the cards' free memory holds its memory plan (``bench/memory.py``).
``--stack`` runs only the stack checks, without importing torch in this process
(``scripts/setup_env.sh`` uses it before installing anything else). ``--policy DIR`` runs only the
check of a policy folder: every file against its full content hash (``check_policy``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from dit4dit_npu.console import entry_point
from dit4dit_npu.device import doctor as checks
from dit4dit_npu.device.doctor import FAIL, PASS, SKIP, WARN, Result
from dit4dit_npu.errors import DiT4DiTError

REPO_ROOT = Path(__file__).resolve().parents[1]
MEMORY_PLAN = REPO_ROOT / "bench" / "memory.py"
# File systems that live on one machine: a run folder there is not seen by the other nodes.
LOCAL_FILE_SYSTEMS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "tmpfs", "ramfs", "overlay", "vfat",
                      "exfat", "ntfs", "ntfs3", "squashfs"}


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        prog="python -m dit4dit_npu.doctor", allow_abbrev=False,
        description="Pre-flight checks of this host for a training run: one PASS/WARN/FAIL/SKIP line each, "
                    "exit code 1 on any FAIL. Extra a.b=c arguments are config overrides.")
    p.add_argument("--config", help="the run config to check (data, base model, run folder, memory plan)")
    p.add_argument("--num-processes", type=int, metavar="N",
                   help="processes per node the launch will start (default: one per visible card; 2 on a CPU host)")
    p.add_argument("--num-machines", type=int, default=1, metavar="M", help="nodes of the run (default 1)")
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
    found = checks.Stack()
    yield from checks.stack_checks(found, package_requirements=not args.stack)
    if args.stack:
        return
    if not found.torch.ok:
        for name in ("cards", "attention", "step", "collective", "config", "memory"):
            yield Result(SKIP, name, "torch does not import (see above)")
        return
    yield from checks.host_checks(args.num_processes, args.timeout)
    yield from config_checks(args, overrides)


# --------------------------------------------------------------------------------------------
# The run config
# --------------------------------------------------------------------------------------------


def config_checks(args: argparse.Namespace, overrides: list[str]) -> Iterator[Result]:
    from dit4dit_npu.config import load_config

    if args.config is None:
        yield Result(SKIP, "config", "no --config: give the run's config to check its data, base model, run "
                                     "folder and memory plan")
        return
    try:
        cfg = load_config(args.config, overrides, on_notices=lambda notices: None)
    except DiT4DiTError as e:
        yield Result(FAIL, "config", str(e))
        return
    base = check_base_model(cfg)
    yield base
    yield check_model(cfg, args.config) if base.status != FAIL else Result(SKIP, "model", "the base model is not usable")
    yield check_data(cfg)
    yield check_run_folder(cfg, args.num_machines)
    yield check_memory(cfg, args)


def check_policy(policy_dir: str) -> Result:
    """A policy folder, checked fully: its manifest's own hash and every file's whole content hash
    (loading checks large files by size and edges only), the manifest and PolicyIO parse. A
    folder of a format without hashes is a WARN: nothing could be verified."""
    import warnings

    from dit4dit_npu.policy.folder import UnverifiedPolicyWarning, verify_policy

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnverifiedPolicyWarning)  # the WARN line says it
            verified, detail = verify_policy(policy_dir)
    except DiT4DiTError as e:
        return Result(FAIL, "policy", str(e))
    return Result(PASS if verified else WARN, "policy", detail)


def check_model(cfg, path: str) -> Result:
    """What ``train --dry-run`` checks: trackers, the model's module tree, learning-rate keys and
    freeze paths (no weights loaded)."""
    from dit4dit_npu.train.cli import check_model_build
    from dit4dit_npu.train.metrics import check_trackers

    try:
        check_trackers(cfg.trackers)
        check_model_build(cfg)
    except DiT4DiTError as e:
        return Result(FAIL, "model", str(e))
    return Result(PASS, "model", f"{path} loads; its model builds (module tree, learning-rate keys, freeze paths)")


def check_base_model(cfg) -> Result:
    from dit4dit_npu.config.framework import TINY
    from dit4dit_npu.weights.layout import COMPONENTS, check_base_model
    from dit4dit_npu.weights.tiny_cache import tiny_cache_root

    base = cfg.framework.cosmos25.base_model
    if base == TINY:
        root = tiny_cache_root()
        problem = _unwritable(root)
        if problem:
            return Result(FAIL, "base model", f"tiny: its cache {root} is not writable ({problem}); set "
                                              "DIT4DIT_TINY_CACHE to a writable folder")
        return Result(PASS, "base model", f"tiny (random, written on first use under {root})")
    try:
        folder = check_base_model(base)
    except DiT4DiTError as e:
        return Result(FAIL, "base model", str(e))
    files = [f for c in COMPONENTS for f in sorted((folder / c).rglob("*")) if f.is_file()]
    for f in files:
        try:
            with open(f, "rb") as fh:
                fh.read(1)
        except OSError as e:
            return Result(FAIL, "base model", f"framework.cosmos25.base_model: cannot read {f} ({e.strerror or e})")
    size = sum(f.stat().st_size for f in files) / 1e9
    return Result(PASS, "base model", f"{folder}: {len(files)} files ({size:.1f} GB) readable")


def check_data(cfg) -> Result:
    """Every dataset folder (and the latent cache) exists and is readable; the demo dataset may be
    missing at its default location, where training generates it."""
    from dit4dit_npu.data.build import is_demo_location, resolve_dataset_paths

    d = cfg.datasets.vla_data
    try:
        paths = resolve_dataset_paths(d)
    except DiT4DiTError as e:
        return Result(FAIL, "data", str(e))
    notes, files = [], 0
    for p in paths:
        if not p.exists():
            if d.generate_demo_if_missing and is_demo_location(p):
                notes.append(f"{p} is generated on first use")
                continue
            return Result(FAIL, "data", f"dataset folder not found: {p} (datasets.vla_data.data_root_dir="
                                        f"{d.data_root_dir!r}, data_mix)")
        try:
            json.loads((p / "meta" / "info.json").read_text())
            files += _readable_files(p)
        except (OSError, ValueError) as e:
            return Result(FAIL, "data", f"{p}: {_why(e)}")
    if d.latent_cache:
        cache = Path(d.latent_cache)
        if not cache.is_dir():
            return Result(FAIL, "data", f"datasets.vla_data.latent_cache: {cache} is not a folder")
        try:
            files += _readable_files(cache)
        except OSError as e:
            return Result(FAIL, "data", f"{cache}: {_why(e)}")
    readable = len(paths) - len(notes)
    found = [f"{readable} dataset folder(s) readable ({files} files)"] if readable or d.latent_cache else []
    return Result(PASS, "data", "; ".join([*found, *notes]))


def _readable_files(root: Path) -> int:
    count = 0
    for folder, _, names in os.walk(root, onerror=_raise):
        for name in names:
            path = os.path.join(folder, name)
            if not os.access(path, os.R_OK):
                raise PermissionError(13, "not readable", path)
            count += 1
    return count


def _raise(e: OSError) -> None:
    raise e


def _why(e: Exception) -> str:
    if isinstance(e, OSError):
        return f"{e.strerror or e}: {e.filename}" if e.filename else str(e)
    return f"meta/info.json is not valid JSON ({e})"


def check_run_folder(cfg, machines: int) -> Result:
    """run_root_dir is writable; with several nodes it must be one folder they all see, which a
    local file system cannot be (training itself checks it for real at start-up)."""
    root = Path(cfg.run_root_dir)
    problem = _unwritable(root)
    if problem:
        return Result(FAIL, "run folder", f"run_root_dir: cannot write to {root} ({problem})")
    fs = file_system_type(root)
    if machines > 1 and fs in LOCAL_FILE_SYSTEMS:
        return Result(WARN, "run folder", f"{root.resolve()} is writable but on a local file system ({fs}): {machines} "
                                          "nodes need one shared folder (NFS, Lustre, ...); training stops at start-up "
                                          "if the nodes do not see the same folder")
    nodes = "one node" if machines == 1 else f"shared file system for {machines} nodes"
    return Result(PASS, "run folder", f"{root.resolve()} is writable ({fs or 'unknown file system'}; {nodes})")


def _unwritable(folder: Path) -> str | None:
    """Why ``folder`` cannot be written (it is created when missing, and removed again), or None."""
    made = []
    try:
        for p in reversed([folder, *folder.parents]):
            if not p.exists():
                p.mkdir()
                made.append(p)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".doctor-"):
            pass
    except OSError as e:
        return e.strerror or str(e)
    finally:
        for p in reversed(made):
            try:
                p.rmdir()
            except OSError:
                pass
    return None


def file_system_type(path: Path) -> str | None:
    """The type of the file system holding ``path`` (the longest mount point above it in /proc/mounts)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    target, best = str(path.resolve()), (None, -1)
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) > best[1]:
            best = (fields[2], len(point))
    return best[0]


# --------------------------------------------------------------------------------------------
# Memory: the config's plan against the cards' free memory
# --------------------------------------------------------------------------------------------


def check_memory(cfg, args: argparse.Namespace) -> Result:
    from dit4dit_npu.device import api  # the probes where device/doctor.py reads them too

    if api.device_type() == api.CPU:
        return Result(SKIP, "memory", "CPU host: no card memory to compare with the plan")
    n = args.num_processes or api.device_count()
    try:
        planned, how = memory_plan(cfg, n * args.num_machines)
    except checks.CheckFailed as e:
        return Result(WARN, "memory", f"no memory plan: {e}")
    return checks.check_memory(planned, n, how)


def memory_plan(cfg, world_size: int) -> tuple[float, str]:
    """Per-card bytes that ``bench/memory.py`` plans for ``cfg`` on ``world_size`` ranks (it measures
    the step's working memory on the CPU with the real classes: minutes)."""
    from dit4dit_npu.config import save_config

    if not MEMORY_PLAN.is_file():
        raise checks.CheckFailed(f"{MEMORY_PLAN} is missing (a source checkout of dit4dit-npu has it)")
    zero = 0
    if cfg.trainer.deepspeed_config:
        from dit4dit_npu.train.distributed import resolve_path

        ds = json.loads(resolve_path(cfg.trainer.deepspeed_config).read_text())
        zero = int(ds.get("zero_optimization", {}).get("stage", 0))
    with tempfile.TemporaryDirectory() as tmp:
        config, out = Path(tmp) / "config.yaml", Path(tmp) / "plan.json"
        save_config(cfg, config)
        command = [sys.executable, str(MEMORY_PLAN), "--config", str(config), "--zero", str(zero),
                   "--world-size", str(world_size), "--json", str(out)]
        if cfg.datasets.vla_data.latent_cache:
            command.append("--latent-cache")
        print(f"     memory: planning with {MEMORY_PLAN.relative_to(REPO_ROOT)} (measures on the CPU: minutes) ...",
              file=sys.stderr, flush=True)
        r = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT)
        if r.returncode != 0 or not out.is_file():
            last = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
            raise checks.CheckFailed(f"bench/memory.py failed: {last[0]}")
        plan = json.loads(out.read_text())
    gc = "with" if plan["gradient_checkpointing"] else "without"
    return plan["per_card_bytes"], f"plan (ZeRO-{zero}, {world_size} ranks, batch {plan['batch']}, {gc} gradient checkpointing)"


if __name__ == "__main__":
    raise SystemExit(main())
