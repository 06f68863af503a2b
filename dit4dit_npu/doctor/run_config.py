"""The doctor's checks of a run config: it loads and its model builds, its data and base-model
folders are readable, its run folder is writable and shared by the nodes, and the cards' free
memory holds its memory plan (the planner, ``python -m dit4dit_npu.train.memory_plan``, in a child
process: it measures on the CPU for minutes).
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

from dit4dit_npu.device.probes import CheckFailed
from dit4dit_npu.doctor import host
from dit4dit_npu.doctor.results import FAIL, PASS, SKIP, WARN, Result
from dit4dit_npu.errors import DiT4DiTError

MEMORY_PLAN = "dit4dit_npu.train.memory_plan"  # run as python -m: it is part of the package
# File systems that live on one machine: a run folder there is not seen by the other nodes.
LOCAL_FILE_SYSTEMS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "tmpfs", "ramfs", "overlay", "vfat",
                      "exfat", "ntfs", "ntfs3", "squashfs"}


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
    yield check_compile(cfg)
    yield check_data(cfg)
    yield check_run_folder(cfg, args.num_machines)
    yield check_memory(cfg, args)


def check_model(cfg, path: str) -> Result:
    """What ``train --dry-run`` checks: trackers, the model's module tree, learning-rate keys and
    freeze paths (no weights loaded)."""
    from dit4dit_npu.config.objective import check_every_module_trains
    from dit4dit_npu.train.cli import check_model_build
    from dit4dit_npu.train.metrics import check_trackers

    try:
        check_trackers(cfg.trackers)
        check_every_module_trains(cfg)
        check_model_build(cfg)
    except DiT4DiTError as e:
        return Result(FAIL, "model", str(e))
    return Result(PASS, "model", f"{path} loads; its model builds (module tree, learning-rate keys, freeze paths)")


def check_compile(cfg) -> Result:
    """``trainer.compile``: where this host cannot compile (device.compile_problem), the run would
    stop at its first step with the same line; say so before it is launched on the cards."""
    from dit4dit_npu import device as dev

    if not cfg.trainer.compile:
        return Result(PASS, "compile", "trainer.compile is off: the backbone's blocks run eager")
    problem = dev.compile_problem()
    if problem is not None:
        return Result(FAIL, "compile", f"trainer.compile: {problem}; set it off")
    return Result(PASS, "compile", "trainer.compile: the backbone's blocks compile on the first step (its warm-up "
                                   "counts in that step's time)")


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
    from dit4dit_npu.device import api  # the probes where doctor/host.py reads them too

    if api.device_type() == api.CPU:
        return Result(SKIP, "memory", "CPU host: no card memory to compare with the plan")
    n = args.num_processes or api.device_count()
    try:
        planned, how = memory_plan(cfg, n * args.num_machines)
    except CheckFailed as e:
        return Result(WARN, "memory", f"no memory plan: {e}")
    return host.check_memory(planned, n, how)


def memory_plan(cfg, world_size: int) -> tuple[float, str]:
    """Per-card bytes that the planner (``train/memory_plan.py``) plans for ``cfg`` on ``world_size``
    ranks (it measures the step's working memory on the CPU with the real classes: minutes)."""
    from dit4dit_npu.config import save_config
    zero = 0
    if cfg.trainer.deepspeed_config:
        from dit4dit_npu.train.distributed import resolve_path

        ds = json.loads(resolve_path(cfg.trainer.deepspeed_config).read_text())
        zero = int(ds.get("zero_optimization", {}).get("stage", 0))
    with tempfile.TemporaryDirectory() as tmp:
        config, out = Path(tmp) / "config.yaml", Path(tmp) / "plan.json"
        save_config(cfg, config)
        command = [sys.executable, "-m", MEMORY_PLAN, "--config", str(config), "--zero", str(zero),
                   "--world-size", str(world_size), "--json", str(out)]
        if cfg.datasets.vla_data.latent_cache:
            command.append("--latent-cache")
        print(f"     memory: planning with python -m {MEMORY_PLAN} (measures on the CPU: minutes) ...",
              file=sys.stderr, flush=True)
        r = subprocess.run(command, capture_output=True, text=True)
        if r.returncode != 0 or not out.is_file():
            last = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
            raise CheckFailed(f"the memory planner failed: {last[0]}")
        plan = json.loads(out.read_text())
    gc = "with" if plan["gradient_checkpointing"] else "without"
    return plan["per_card_bytes"], f"plan (ZeRO-{zero}, {world_size} ranks, batch {plan['batch']}, {gc} gradient checkpointing)"

