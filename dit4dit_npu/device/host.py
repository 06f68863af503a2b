"""Host (CPU) memory allocator tuning: glibc malloc thresholds through ``mallopt``."""

from __future__ import annotations

import os

from dit4dit_npu.device import api
from dit4dit_npu.device.api import CPU

# glibc malloc on CPU hosts. By default glibc serves buffers above a dynamic threshold with mmap
# and returns them to the system on free, so a training step that allocates the same large
# activation buffers every step (the VAE's, above all) page-faults them in again each time: about
# 15% of a tiny CPU step (bench/malloc.py measures it). Keeping buffers up to 32 MiB (glibc's
# largest mmap threshold on 64-bit) in the heap, and trimming the heap only past 256 MiB free,
# removes those faults. Same values as the MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ env
# variables, which win when the user sets them.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers (malloc.h)
HOST_MALLOC_DEFAULTS = {
    "MALLOC_MMAP_THRESHOLD_": (M_MMAP_THRESHOLD, 32 * 2**20),
    "MALLOC_TRIM_THRESHOLD_": (M_TRIM_THRESHOLD, 256 * 2**20),
}


def configure_host_allocator(environ: dict[str, str] | None = None) -> dict[str, int]:
    """Set glibc's malloc thresholds (``HOST_MALLOC_DEFAULTS``) through ``mallopt``, at start-up of
    a training or inference process; returns what was set. Only on CPU hosts (an accelerator
    step's buffers live in the device allocator, and its host side is tuned by its own runtime),
    only with glibc, and never a setting whose MALLOC_* variable the user exported."""
    env = os.environ if environ is None else environ
    if api.device_type() != CPU:
        return {}
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return {}
    applied = {}
    for name, (param, value) in HOST_MALLOC_DEFAULTS.items():
        if name not in env and mallopt(param, value) == 1:  # mallopt returns 1 on success
            applied[name] = value
    return applied


def _glibc_mallopt():
    """glibc's ``mallopt`` through ctypes, or None (musl, macOS, Windows: other allocators)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (present only in glibc)
    except (OSError, AttributeError):
        return None
    fn = libc.mallopt
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn
