"""The only module that knows Ascend NPU, CUDA and CPU exist.

Detection order: NPU (``torch_npu`` importable *and* a device present) -> CUDA -> CPU.
Everything else asks this module: the torch.device, autocast type/dtype, fused AdamW, the
torch.distributed backend, DeepSpeed's accelerator name, the diffusers attention backend,
seeding, synchronize and memory statistics.

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
from collections.abc import Iterator

import numpy as np
import torch

from dit4dit_npu.cli import entry_point
from dit4dit_npu.errors import DiT4DiTError

NPU, CUDA, CPU = "npu", "cuda", "cpu"

# Ascend defaults the seed documents use: the level-2 task queue hides host dispatch latency,
# expandable segments curb fragmentation, and coarse core binding keeps the host threads local.
ASCEND_ENV_DEFAULTS = {
    "TASK_QUEUE_ENABLE": "2",
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    "CPU_AFFINITY_CONF": "1",
}


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
    way to select one (cosmos25_tiny_recipe.md §5).
    """
    from diffusers.models.attention_dispatch import attention_backend

    with attention_backend(attention_backend_name(requested)):
        yield


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


def reset_peak_memory() -> None:
    mod = _device_module()
    if mod is not None:
        mod.reset_peak_memory_stats()


# --------------------------------------------------------------------------------------------
# Launch environment
# --------------------------------------------------------------------------------------------


def apply_env_defaults(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Set the Ascend env defaults (only on NPU, never overriding the user). Returns what was set."""
    env = os.environ if environ is None else environ
    if device_type() != NPU:
        return {}
    applied = {}
    for key, value in ASCEND_ENV_DEFAULTS.items():
        if key not in env:
            env[key] = value
            applied[key] = value
    return applied


def configure_host_allocator(environ: dict[str, str] | None = None) -> dict[str, int]:
    """Set glibc's malloc thresholds (``HOST_MALLOC_DEFAULTS``) through ``mallopt``, at start-up of
    a training or inference process; returns what was set. Only on CPU hosts (an accelerator
    step's buffers live in the device allocator, and its host side is tuned by its own runtime),
    only with glibc, and never a setting whose MALLOC_* variable the user exported."""
    env = os.environ if environ is None else environ
    if device_type() != CPU:
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


def check_local_ranks(local_world_size: int | None = None) -> str | None:
    """One rank per physical card: more local ranks than visible cards fails clearly.

    On Ascend this otherwise surfaces deep inside HCCL as "Invalid device ID" / rtSetDevice 107001
    or a "same physical device" error. CPU ranks are processes, so any count works there; more of
    them than cores only makes every rank slower, which is returned as a warning line (else None).
    """
    n = local_world_size if local_world_size is not None else int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    kind = device_type()
    if kind == CPU:
        cores = cpu_cores()
        if n > cores:
            return (
                f"warning: {n} CPU ranks per node but {cores} core(s): the ranks will contend for cores "
                "(slower, not wrong); use --num_processes <= the core count"
            )
        return None
    cards = device_count()
    if n > cards:
        visible = "ASCEND_RT_VISIBLE_DEVICES" if kind == NPU else "CUDA_VISIBLE_DEVICES"
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


def library_paths() -> list[str]:
    """torch's (and torch_npu's, when installed) lib folders: compiled extensions imported before
    torch otherwise fail with "libc10.so: cannot open shared object file". Never imports them."""
    paths = []
    for name in ("torch", "torch_npu"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            paths.append(os.path.join(os.path.dirname(spec.origin), "lib"))
    return paths


def launch_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables a launcher exports on this host: the Ascend defaults (only on an Ascend
    host, never one the user set) and LD_LIBRARY_PATH with the torch/torch_npu lib folders first."""
    env = dict(os.environ if environ is None else environ)
    out = apply_env_defaults(env)
    ld = ":".join([*library_paths(), *([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else [])])
    if ld:
        out["LD_LIBRARY_PATH"] = ld
    return out


def describe() -> str:
    kind = device_type()
    return f"device={kind} count={device_count()} backend={dist_backend()} attention={attention_backend_name()}"


# --------------------------------------------------------------------------------------------
# Command line (used by scripts/train_8p.sh)
# --------------------------------------------------------------------------------------------

USAGE = """usage: python -m dit4dit_npu.device [env [--ranks N]]
  (no argument)   one line describing the detected device
  env             `export NAME=value` lines for a launcher on this host (eval them in bash)
  --ranks N       first check N ranks per node against the visible cards (one line, exit 2)
  -h, --help      this text"""


@entry_point
def main(argv: list[str] | None = None) -> int:
    import shlex
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if not args:
        print(describe())
        return 0
    if args[0] != "env" or len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--ranks"):
        print(USAGE, file=sys.stderr)
        return 2
    if len(args) == 3:
        ranks = _positive_int(args[2], "--ranks")
        warning = check_local_ranks(ranks)
        if warning:
            print(warning, file=sys.stderr)
    for key, value in launch_env().items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


def _positive_int(text: str, name: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1 or str(n) != text.strip():
        raise DeviceError(f"{name}={text!r}: expected a positive integer (ranks per node)")
    return n


if __name__ == "__main__":
    raise SystemExit(main())
