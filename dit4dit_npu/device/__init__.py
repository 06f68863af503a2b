"""The device layer: the only code that knows Ascend NPU, CUDA and CPU exist.

    from dit4dit_npu import device as dev
    dev.get_device(); dev.autocast(); dev.dist_backend(); dev.configure_host_allocator()

``api`` (which device; torch.device, autocast, backends, seeding, synchronize, memory),
``collectives`` (how each backend's collective fails when a peer died or stalled),
``launch`` (the launch environment: Ascend defaults, library path, one rank per card), ``host``
(glibc malloc tuning on CPU hosts), ``stack`` (the installed software stack: Python, torch,
torch_npu, CANN; stdlib only), ``probes`` (what the doctor, ``python -m dit4dit_npu.doctor``,
runs on the cards: a training step, fused attention, an all-reduce) and ``__main__`` (``python -m dit4dit_npu.device``, the ``dit4dit-device`` command).

Everything public is re-exported here, imported on first use: importing the package itself
imports no torch, so ``stack`` and the doctor still run (and say why) where ``import torch``
fails, e.g. torch_npu installed without CANN. Tests that simulate another host patch the probes
where they are looked up (``device.api._npu_available``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, for readers and type checkers; resolved by __getattr__
    from dit4dit_npu.device.api import (  # noqa: F401
        CPU,
        CUDA,
        NPU,
        DeviceError,
        attention_backend_name,
        attention_context,
        autocast,
        autocast_device_type,
        autocast_dtype,
        compile_problem,
        deepspeed_accelerator_name,
        describe,
        device_count,
        device_type,
        dist_backend,
        empty_cache,
        get_device,
        local_rank,
        memory_info,
        memory_stats,
        parse_device,
        reset_cache,
        reset_peak_memory,
        seed_everything,
        set_device,
        supports_fused_adamw,
        synchronize,
        video_memory_format,
    )
    from dit4dit_npu.device.collectives import collective_failure  # noqa: F401
    from dit4dit_npu.device.host import HOST_MALLOC_DEFAULTS, configure_host_allocator  # noqa: F401
    from dit4dit_npu.device.launch import (  # noqa: F401
        ASCEND_ENV_DEFAULTS,
        apply_env_defaults,
        check_local_ranks,
        cpu_cores,
        launch_env,
        library_paths,
    )

_EXPORTS = {
    "api": (
        "CPU", "CUDA", "NPU", "DeviceError", "attention_backend_name", "attention_context", "autocast",
        "autocast_device_type", "autocast_dtype", "compile_problem", "deepspeed_accelerator_name", "describe", "device_count",
        "device_type", "dist_backend", "empty_cache", "get_device", "local_rank", "memory_info", "memory_stats",
        "parse_device", "reset_cache", "reset_peak_memory", "seed_everything", "set_device",
        "supports_fused_adamw", "synchronize", "video_memory_format",
    ),
    "collectives": ("collective_failure",),
    "host": ("HOST_MALLOC_DEFAULTS", "configure_host_allocator"),
    "launch": ("ASCEND_ENV_DEFAULTS", "apply_env_defaults", "check_local_ranks", "cpu_cores", "launch_env",
               "library_paths"),
}
_OWNER = {name: module for module, names in _EXPORTS.items() for name in names}
_SUBMODULES = ("api", "collectives", "host", "launch", "stack", "probes")

__all__ = sorted(_OWNER)


def __getattr__(name: str) -> Any:
    if name in _OWNER:
        value = getattr(importlib.import_module(f"{__name__}.{_OWNER[name]}"), name)
        globals()[name] = value  # once: later lookups are plain attribute reads
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_OWNER, *_SUBMODULES])
