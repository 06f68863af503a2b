"""The launch environment on this host: the Ascend variables, the library path, and one rank per
card (``scripts/train_8p.sh`` asks through ``python -m dit4dit_npu.device env --ranks N``)."""

from __future__ import annotations

import os

from dit4dit_npu.device import api
from dit4dit_npu.device.api import CPU, CUDA, NPU, DeviceError
from dit4dit_npu.device.stack import launch_library_path, library_paths

__all__ = ["ASCEND_ENV_DEFAULTS", "apply_env_defaults", "check_local_ranks", "cpu_cores", "launch_env",
           "launch_library_path", "library_paths", "VISIBLE_DEVICES"]

# Ascend defaults from torch_npu's performance tuning advice: the level-2 task queue hides host dispatch latency,
# expandable segments curb fragmentation, and coarse core binding keeps the host threads local.
ASCEND_ENV_DEFAULTS = {
    "TASK_QUEUE_ENABLE": "2",
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    "CPU_AFFINITY_CONF": "1",
}

# The variable that narrows which cards a process sees.
VISIBLE_DEVICES = {NPU: "ASCEND_RT_VISIBLE_DEVICES", CUDA: "CUDA_VISIBLE_DEVICES"}


def apply_env_defaults(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Set the Ascend env defaults (only on NPU, never overriding the user). Returns what was set."""
    env = os.environ if environ is None else environ
    if api.device_type() != NPU:
        return {}
    applied = {}
    for key, value in ASCEND_ENV_DEFAULTS.items():
        if key not in env:
            env[key] = value
            applied[key] = value
    return applied


def check_local_ranks(local_world_size: int | None = None) -> str | None:
    """One rank per physical card: more local ranks than visible cards fails clearly.

    On Ascend this otherwise surfaces deep inside HCCL as "Invalid device ID" / rtSetDevice 107001
    or a "same physical device" error. CPU ranks are processes, so any count works there; more of
    them than cores only makes every rank slower, which is returned as a warning line (else None).
    """
    n = local_world_size if local_world_size is not None else int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    kind = api.device_type()
    if kind == CPU:
        cores = cpu_cores()
        if n > cores:
            return (
                f"warning: {n} CPU ranks per node but {cores} core(s): the ranks will contend for cores "
                "(slower, not wrong); use --num_processes <= the core count"
            )
        return None
    cards = api.device_count()
    if n > cards:
        visible = VISIBLE_DEVICES[kind]
        procs = f"{n} process{'es' if n != 1 else ''} per node"
        if cards == 0:  # e.g. DIT4DIT_DEVICE names a device this host does not show
            raise DeviceError(f"{procs} but no visible {kind} card (check {visible} and DIT4DIT_DEVICE)")
        raise DeviceError(
            f"{procs} but only {cards} visible {kind} card(s): use --num_processes <= "
            f"{cards} (one rank per physical card; check {visible})"
        )
    return None


def cpu_cores() -> int:
    """Cores this process may run on (the affinity mask, which containers and taskset narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def launch_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables a launcher exports on this host: the Ascend defaults (only on an Ascend
    host, never one the user set) and LD_LIBRARY_PATH with the torch/torch_npu lib folders first."""
    env = dict(os.environ if environ is None else environ)
    out = apply_env_defaults(env)
    ld = launch_library_path(env)
    if ld:
        out["LD_LIBRARY_PATH"] = ld
    return out
