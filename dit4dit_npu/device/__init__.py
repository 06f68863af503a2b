"""The device layer: the only code that knows Ascend NPU, CUDA and CPU exist.

    from dit4dit_npu import device as dev
    dev.get_device(); dev.autocast(); dev.dist_backend(); dev.configure_host_allocator()

``api`` (which device; torch.device, autocast, backends, seeding, synchronize, memory),
``launch`` (the launch environment: Ascend defaults, library path, one rank per card), ``host``
(glibc malloc tuning on CPU hosts) and ``__main__`` (``python -m dit4dit_npu.device``, the
``dit4dit-device`` command). Everything public is re-exported here; tests that simulate another
host patch the probes where they are looked up (``device.api._npu_available``).
"""

from dit4dit_npu.device.api import (
    CPU,
    CUDA,
    NPU,
    DeviceError,
    attention_backend_name,
    attention_context,
    autocast,
    autocast_device_type,
    autocast_dtype,
    deepspeed_accelerator_name,
    describe,
    device_count,
    device_type,
    dist_backend,
    empty_cache,
    get_device,
    local_rank,
    memory_stats,
    parse_device,
    reset_cache,
    reset_peak_memory,
    seed_everything,
    set_device,
    supports_fused_adamw,
    synchronize,
)
from dit4dit_npu.device.host import HOST_MALLOC_DEFAULTS, configure_host_allocator
from dit4dit_npu.device.launch import (
    ASCEND_ENV_DEFAULTS,
    apply_env_defaults,
    check_local_ranks,
    cpu_cores,
    launch_env,
    library_paths,
)

__all__ = [
    "ASCEND_ENV_DEFAULTS",
    "CPU",
    "CUDA",
    "HOST_MALLOC_DEFAULTS",
    "NPU",
    "DeviceError",
    "apply_env_defaults",
    "attention_backend_name",
    "attention_context",
    "autocast",
    "autocast_device_type",
    "autocast_dtype",
    "check_local_ranks",
    "configure_host_allocator",
    "cpu_cores",
    "deepspeed_accelerator_name",
    "describe",
    "device_count",
    "device_type",
    "dist_backend",
    "empty_cache",
    "get_device",
    "launch_env",
    "library_paths",
    "local_rank",
    "memory_stats",
    "parse_device",
    "reset_cache",
    "reset_peak_memory",
    "seed_everything",
    "set_device",
    "supports_fused_adamw",
    "synchronize",
]
