"""The device API: which device this process runs on, and every answer that depends on it.

Detection order: Ascend NPU (``torch_npu`` importable *and* a device present) -> CUDA -> CPU;
``DIT4DIT_DEVICE=npu|cuda|cpu`` forces one. Everything else in the project asks here: the
torch.device, autocast type/dtype, fused AdamW, the torch.distributed backend, DeepSpeed's
accelerator name, the diffusers attention backend, seeding, synchronize and memory statistics.

``torch_npu`` is never required. On a host without CANN it is absent (or, if installed by
mistake, its import raises); both mean "no NPU" and never crash. We do not use
torch_npu's contrib shim that remaps CUDA calls: the code names no device itself.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import random
import shutil
from collections.abc import Iterator

import numpy as np
import torch

from dit4dit_npu.errors import DiT4DiTError

NPU, CUDA, CPU = "npu", "cuda", "cpu"


class DeviceError(DiT4DiTError, RuntimeError):
    """A device/launch problem with a one-line, user-facing message."""


# --------------------------------------------------------------------------------------------
# Probes (monkeypatched in tests to simulate hosts we do not have)
# --------------------------------------------------------------------------------------------


def _npu_available() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)

        return bool(torch.npu.is_available()) and torch.npu.device_count() > 0
    except Exception:  # no CANN, broken install, old builds raising odd errors: all mean "no NPU"
        return False


def _cuda_available() -> bool:
    return torch.cuda.is_available()


def _device_module():
    """torch.npu / torch.cuda / None for the detected type."""
    kind = device_type()
    return getattr(torch, kind) if kind in (NPU, CUDA) else None


@functools.lru_cache(maxsize=1)
def device_type() -> str:
    """'npu', 'cuda' or 'cpu'; ``DIT4DIT_DEVICE=cpu`` forces CPU (useful for tests on GPU hosts)."""
    forced = os.environ.get("DIT4DIT_DEVICE", "").strip().lower()
    if forced:
        if forced not in (NPU, CUDA, CPU):
            raise DeviceError(f"DIT4DIT_DEVICE={forced!r}: expected one of npu, cuda, cpu")
        return forced
    if _npu_available():
        return NPU
    if _cuda_available():
        return CUDA
    return CPU


def reset_cache() -> None:
    """Forget the detected device (tests simulate several hosts in one process)."""
    device_type.cache_clear()


def device_count() -> int:
    mod = _device_module()
    return int(mod.device_count()) if mod is not None else 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def get_device(rank: int | None = None) -> torch.device:
    kind = device_type()
    if kind == CPU:
        return torch.device(CPU)
    return torch.device(kind, local_rank() if rank is None else rank)


def parse_device(text: str) -> torch.device:
    """A device a user named (``--device``), checked against this host: one ``DeviceError`` line
    for a misspelt type, a type this host does not have, or a card index past its count."""
    kind = text.split(":", 1)[0]
    if kind in (NPU, CUDA) and kind != device_type():  # before torch.device: it knows npu only with torch_npu
        raise DeviceError(f"device {text!r}: this host has no {kind} (detected: {device_type()})")
    try:
        d = torch.device(text)
    except RuntimeError:
        raise DeviceError(f"device {text!r}: expected cpu, or {NPU}/{CUDA} with an optional :index") from None
    if d.type not in (CPU, device_type()):
        raise DeviceError(f"device {text!r}: this host has no {d.type} (detected: {device_type()})")
    if d.type != CPU and d.index is not None and d.index >= device_count():
        raise DeviceError(f"device {text!r}: this host has {device_count()} {d.type} card(s)")
    return d


def set_device(rank: int | None = None) -> None:
    mod = _device_module()
    if mod is not None:
        mod.set_device(get_device(rank))


# --------------------------------------------------------------------------------------------
# Precision, optimizer, distributed, attention
# --------------------------------------------------------------------------------------------


def autocast_device_type() -> str:
    return device_type()


def autocast_dtype() -> torch.dtype:
    return torch.bfloat16


def autocast(enabled: bool = True, dtype: torch.dtype | None = None):
    """torch.autocast on the detected device type (bf16 by default).

    Never ``autocast(dtype=float32)`` to force fp32: on CPU that is a silent no-op. Callers that
    need fp32 use ``autocast(enabled=False)`` and cast inputs explicitly.
    """
    return torch.autocast(device_type=device_type(), dtype=dtype or autocast_dtype(), enabled=enabled)


def supports_fused_adamw() -> bool:
    # Fused AdamW kernels exist on CUDA and in torch_npu; on CPU the plain (foreach) path is
    # what DeepSpeed's CPU recipe was measured with.
    return device_type() in (NPU, CUDA)


def video_memory_format(device: torch.device) -> torch.memory_format:
    """The layout to hand the VAE its (B, C, T, H, W) video in. On CPU channels-last: the Wan VAE's
    RMS norm reduces over channels (``F.normalize(dim=1)``), ~4x faster with channels innermost, and
    oneDNN's conv3d keeps that layout; encoding a batch is 1.5-1.8x faster, bit-identical (tiny VAE,
    batch 4-8). On NPU/CUDA (not measured here) the contiguous layout their kernels are tuned for."""
    return torch.channels_last_3d if device.type == CPU else torch.contiguous_format


def dist_backend() -> str:
    return {NPU: "hccl", CUDA: "nccl", CPU: "gloo"}[device_type()]


def deepspeed_accelerator_name() -> str:
    return device_type()


def attention_backend_name(requested: str = "auto") -> str:
    """diffusers attention backend: npu_fusion_attention on Ascend, SDPA elsewhere."""
    if requested and requested != "auto":
        return requested
    return "_native_npu" if device_type() == NPU else "native"


@contextlib.contextmanager
def attention_context(requested: str = "auto") -> Iterator[None]:
    """Scope diffusers' attention backend.

    Cosmos attention processors read the *process-global* active backend, and
    ``reset_attention_backend()`` does not restore it, so the context manager is the only clean
    way to select one.
    """
    from diffusers.models.attention_dispatch import attention_backend

    with attention_backend(attention_backend_name(requested)):
        yield


def compile_problem() -> str | None:
    """Why ``torch.compile`` (the opt-in compile of the backbone's blocks: ``trainer.compile``,
    ``--compile``) is refused on this host, as one phrase; None where it may run. On Ascend NPU it
    is refused, not silently skipped: it has not run this model on a card yet (torch_npu's
    inductor path), and a run config that says compile must not train eager on 8 cards unnoticed;
    the user sets it off. CPU needs a C++ compiler for inductor's kernels, CUDA needs triton:
    without them torch fails only at the first compiled call, deep in a traceback."""
    kind = device_type()
    if kind == NPU:
        return "torch.compile is not verified on Ascend NPU yet (off until a device run shows it works)"
    if kind == CUDA and importlib.util.find_spec("triton") is None:
        return "torch.compile on CUDA needs triton (pip install triton), which is not installed"
    if kind == CPU and shutil.which(os.environ.get("CXX") or "g++") is None:
        return "torch.compile on CPU needs a C++ compiler for inductor (g++, or $CXX), none found on PATH"
    return None


# --------------------------------------------------------------------------------------------
# Seeding, sync, memory
# --------------------------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)  # also seeds CUDA and NPU generators of the current process
    mod = _device_module()
    if mod is not None and hasattr(mod, "manual_seed_all"):
        mod.manual_seed_all(seed)


def synchronize() -> None:
    mod = _device_module()
    if mod is not None:
        mod.synchronize()


def empty_cache() -> None:
    mod = _device_module()
    if mod is not None:
        mod.empty_cache()


def memory_stats() -> dict[str, float]:
    """Allocated / peak device memory in GiB; on CPU the process's peak RSS."""
    mod = _device_module()
    if mod is not None:
        return {
            "allocated_gib": mod.memory_allocated() / 2**30,
            "peak_allocated_gib": mod.max_memory_allocated() / 2**30,
            "reserved_gib": mod.memory_reserved() / 2**30,
        }
    import resource

    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"peak_rss_gib": peak_kib / 2**20}


def memory_info(index: int = 0) -> tuple[int, int] | None:
    """(free, total) bytes of card ``index`` as its runtime reports them now (what other processes
    hold is not free); None on CPU, where no card memory exists."""
    mod = _device_module()
    if mod is None:
        return None
    free, total = mod.mem_get_info(index)
    return int(free), int(total)


def reset_peak_memory() -> None:
    mod = _device_module()
    if mod is not None:
        mod.reset_peak_memory_stats()


def describe() -> str:
    kind = device_type()
    return f"device={kind} count={device_count()} backend={dist_backend()} attention={attention_backend_name()}"
